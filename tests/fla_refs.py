"""flash-linear-attention's pure-PyTorch reference files (fla-core, pinned in the test extra),
loaded by file path: the package import pulls in its Triton kernels, its ``naive.py`` files import
only torch and einops."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def fla_reference(rel: str):
    """The module at ``fla/<rel>`` (e.g. ``"ops/delta_rule/naive.py"``). Skips when fla-core is
    not installed; fails when it is installed without the file (the pinned 0.6.0 ships it)."""
    spec = importlib.util.find_spec("fla")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("fla-core is not installed (it is in the test extra): no published reference")
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    if not path.is_file():
        pytest.fail(f"fla-core is installed but has no {rel}: the pinned 0.6.0 ships it")
    mod_spec = importlib.util.spec_from_file_location(f"_fla_ref_{path.parent.name}", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module
