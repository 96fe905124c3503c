"""Plugin packages used as fixtures: tests/testing/test_packages.py installs each into a fresh
virtual environment and tests it there. Their own tests need the package installed, so they are
not collected from the source tree."""

collect_ignore_glob = ["*/tests/*"]
