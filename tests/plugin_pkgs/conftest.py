"""Plugin packages used as fixtures: tests/testing/test_packages.py installs acme_gate and
acme_nlms into a fresh virtual environment and tests them there; the hostile acme_greedy is made
importable with its entry points by `fake_install` (tests/trust/). Their own tests need the
package installed, so they are not collected from the source tree."""

collect_ignore_glob = ["*/tests/*"]
