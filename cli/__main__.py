"""``python -m atlas_cli``: the same as the ``atlas`` command."""

from .main import run

run()
