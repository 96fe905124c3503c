"""The Titans plugin (namespace ``titans``): deep MLP memory, the Titans rule presets and the
Titans architectures (LMM, MAG, MAL, MAC). Registered by `atlas_plugins.titans.plugin`."""
