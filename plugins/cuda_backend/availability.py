"""Where the Triton kernels can run: a CUDA device, or Triton's CPU interpreter.

``TRITON_INTERPRET=1`` makes ``@triton.jit`` functions run on CPU tensors through Triton's
interpreter (slow, exact, used by the test suite). It must be set before the kernel modules are
imported, because the decorator reads it when the function is defined; the backends only import
the kernel modules inside `run`.

Nothing in this module imports Triton or torch at module level.
"""

from __future__ import annotations

import importlib.util
import os


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in {"1", "true", "yes", "on"}


def triton_available() -> tuple[bool, str]:
    """Triton importable, and a CUDA device present or the interpreter switched on."""
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed (pip install 'atlas-ttm[triton]')"
    try:
        import triton  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a broken install is a reason, not a crash
        return False, f"triton failed to import: {type(exc).__name__}: {exc}"
    if interpreter_on():
        return True, ""
    import torch

    if not torch.cuda.is_available():
        return False, "no CUDA device (set TRITON_INTERPRET=1 to run the kernels in Triton's CPU interpreter)"
    return True, ""


def tensors_runnable(*tensors) -> tuple[bool, str]:
    """The tensors live where the kernels run: on a CUDA device, or anywhere under the interpreter."""
    if interpreter_on():
        return True, ""
    for t in tensors:
        if not t.is_cuda:
            return False, f"tensors are on {t.device}; the kernels need CUDA tensors (or TRITON_INTERPRET=1)"
    return True, ""


def device_guard(tensor):
    """A context that makes ``tensor``'s CUDA device the current one for a launch (Triton launches
    on the current device: without it, tensors on ``cuda:1`` would run on ``cuda:0``); a no-op for
    CPU tensors under the interpreter."""
    import contextlib

    import torch

    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()
