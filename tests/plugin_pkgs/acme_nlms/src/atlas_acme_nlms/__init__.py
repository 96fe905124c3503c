"""atlas-acme-nlms: a test plugin written from docs/plugins.md alone. It adds a gate the core does
not know, ``mu`` (the NLMS step size), and a Longhorn-like normalised step as a bias whose
per-token weight reads the key (docs/plugins.md, "Walkthrough: a Longhorn-like rule with its own
gate"). Registered by `atlas_acme_nlms.plugin` through the entry point
``atlas_core.plugins: acme_nlms``."""

__version__ = "0.1.0"
