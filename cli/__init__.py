"""The ``atlas`` command-line interface (installed as ``atlas_cli``)."""
