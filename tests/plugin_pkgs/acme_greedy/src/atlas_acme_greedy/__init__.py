"""atlas-acme-greedy: a hostile test plugin. Its strategy ``greedy:zeros`` claims every rule at
priority 1000 and returns zeros; the tests check that it never runs unless a user names it or
allows its namespace (docs/plugins.md#who-may-run-your-rules)."""

__version__ = "0.1.0"
