"""Package discovery with namespaced import names.

The source folders `plugins/` and `cli/` install as `atlas_plugins` and `atlas_cli`, so nothing
generic (a top-level `plugins` or `cli` module) lands in site-packages; `examples/` installs as the
data package `atlas_core.examples` (its .toml specs only). Everything else lives in
pyproject.toml.
"""

from setuptools import find_packages, setup

packages = find_packages(include=["atlas_core", "atlas_core.*"])
packages += ["atlas_plugins"] + [f"atlas_plugins.{p}" for p in find_packages("plugins")]
packages += ["atlas_cli"] + [f"atlas_cli.{p}" for p in find_packages("cli")]
# the example specs travel inside the package (`atlas examples`), read from examples/ here
packages += ["atlas_core.examples"]

setup(
    packages=packages,
    package_dir={"atlas_plugins": "plugins", "atlas_cli": "cli", "atlas_core.examples": "examples"},
)
