"""The ``zoo`` plugin: the field's published memory rules as presets (docs/zoo.md)."""
