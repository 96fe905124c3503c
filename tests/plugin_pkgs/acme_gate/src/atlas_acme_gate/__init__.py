"""atlas-acme-gate: a test plugin written from docs/plugins.md alone. It adds a gate the core does
not know, ``beta``, by declaring it (docs/plugins.md#gates); the components are registered by
`atlas_acme_gate.plugin` through the entry point ``atlas_core.plugins: acme_gate``."""

__version__ = "0.1.0"
