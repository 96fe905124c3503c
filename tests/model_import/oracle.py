"""transformers' hybrids on their own PyTorch paths: the oracle a CPU user gets.

transformers' Qwen3.5, Qwen3-Next and OLMo Hybrid modules pick fla's Triton kernels (and
``causal_conv1d``) when those packages import, at the time the modeling module is imported; fla is
installed for the tests and its kernels need a GPU. `torch_paths(name)` imports (or imports again)
``transformers.models.<name>.modeling_<name>`` with both packages hidden from the import system,
then puts them back: the returned module's functions are transformers' PyTorch implementations
(each one logs that it falls back to them).
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

HIDDEN = ("fla", "causal_conv1d")


def torch_paths(name: str) -> ModuleType:
    """``transformers.models.<name>.modeling_<name>``, imported while fla and causal_conv1d are hidden."""
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] in HIDDEN}
    for k in saved:
        del sys.modules[k]
    for k in HIDDEN:
        sys.modules[k] = None  # an import of it raises ImportError
    try:
        module_name = f"transformers.models.{name}.modeling_{name}"
        if module_name in sys.modules:
            module = importlib.reload(sys.modules[module_name])
        else:
            module = importlib.import_module(module_name)
    finally:
        for k in HIDDEN:
            sys.modules.pop(k, None)
        sys.modules.update(saved)
    return module


def uses_torch_paths(module: ModuleType) -> bool:
    """Whether the module's rule and convolution functions run transformers' own PyTorch code
    (the implementation each wrapper closed over is the function it wraps)."""
    for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn"):
        fn = getattr(module, name)
        cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
        if cells.get("is_new_implementation", True):
            return False
    return True
