"""atlas-acme-planted: a plugin package as an author writes it from docs/plugins.md, with bugs that
can be planted one at a time (namespace ``planted``):

- ``planted:rho_keep``, a linear retention with its own gate ``rho`` (alpha = 1 - rho^2), and the
  preset ``planted:rho_delta`` (the delta rule with it);
- ``planted:mesa``, a standalone MesaNet-style rule (a least-squares memory read through
  ``(H_t + lam I)^-1``, gates ``forget`` and ``write``);
- ``planted:mesa_chunks``, its closed-form chunked strategy (default chunk size 64).

``ACME_PLANTED_BUG=<name>`` (read on every call, `bugs.BUGS`) plants one bug; unset, the package is
clean and passes ``atlas check planted``. tests/testing/test_planted_bugs.py checks that the kit
fails the package on each bug with the named check.
"""

__version__ = "0.1.0"
