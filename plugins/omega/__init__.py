"""The Omega plugin (namespace ``omega``): Atlas' context-window attentional bias, polynomial and
Taylor feature maps, and the OmegaNet presets.

Components live in their own modules (`window`, `poly`, `taylor`); `plugin` registers them and
stays cheap to import. See docs/omega.md.
"""
