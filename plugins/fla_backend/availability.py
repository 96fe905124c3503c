"""Where fla's chunk kernels can run: fla importable and a CUDA device, or the tests' CPU stand-in.

fla's chunk ops are Triton GPU kernels; this plugin never runs them anywhere else. For tests
without a GPU, `cpu_stand_in` is an explicit hook: while it is active, CPU tensors count as a
place the backends run, and the device they are certified on is ``"cpu: <label>"``. The caller
is responsible for making fla's entry points (`mapping.OPS`) compute on the CPU while it is
active — tests/fla_backend/stand_in.py swaps them for tests/fla_oracle's pure-PyTorch
recurrence. Nothing else turns the hook on (no environment variable: fla's real kernels given CPU
tensors would fail).

Nothing in this module imports torch or fla at module level.
"""

from __future__ import annotations

import contextlib
import importlib.util

_STAND_IN: list[str] = []  # the labels of the active `cpu_stand_in` blocks (innermost last)
_IMPORTED: dict[str, tuple[bool, str]] = {}


@contextlib.contextmanager
def cpu_stand_in(label: str):
    """Test hook (see the module docstring): within the block, the fla backends take CPU tensors,
    and their device is ``"cpu: <label>"``."""
    if not label or not isinstance(label, str):
        raise ValueError("cpu_stand_in needs a label naming the stand-in (it keys certificates)")
    _STAND_IN.append(label)
    try:
        yield
    finally:
        _STAND_IN.pop()


def stand_in() -> str | None:
    """The active stand-in's label, or None."""
    return _STAND_IN[-1] if _STAND_IN else None


NOT_INSTALLED = ("flash-linear-attention is not installed (pip install 'fla-core==0.6.0'; its chunk "
                 "ops are the kernels these backends run)")


def fla_importable() -> tuple[bool, str]:
    """fla installed, and its op modules import (tried once per process)."""
    if importlib.util.find_spec("fla") is None:
        return False, NOT_INSTALLED
    if "ops" not in _IMPORTED:
        from .mapping import OPS

        try:
            for module, attr in OPS.values():
                getattr(importlib.import_module(module), attr)
            _IMPORTED["ops"] = (True, "")
        except Exception as exc:  # noqa: BLE001 - a broken install is a reason, not a crash
            first = (str(exc).strip().splitlines() or [""])[0]
            _IMPORTED["ops"] = (False, f"fla's ops failed to import: {type(exc).__name__}: {first}")
    return _IMPORTED["ops"]


def available() -> tuple[bool, str]:
    """fla importable and a CUDA device present (or the CPU stand-in active)."""
    if importlib.util.find_spec("fla") is None:
        return False, NOT_INSTALLED
    if stand_in() is None:
        import torch

        if not torch.cuda.is_available():
            return False, "no CUDA device (fla's chunk ops are Triton GPU kernels)"
    return fla_importable()


def device_name(device=None) -> str:
    """The name certificates are keyed by: a CUDA device's, with its compute capability
    (``device``, else the current one; under the stand-in, else the CPU), ``"cpu: <label>"`` for
    the CPU under the stand-in."""
    import torch

    if device is None:
        device = "cpu" if stand_in() is not None or not torch.cuda.is_available() else "cuda"
    dev = torch.device(device)
    if dev.type != "cuda":
        return f"{dev.type}: {stand_in()}" if dev.type == "cpu" and stand_in() else str(dev)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return f"{torch.cuda.get_device_name(index)} (sm_{major}{minor})"


def tensors_runnable(*tensors) -> tuple[bool, str]:
    """All on one CUDA device (or on the CPU under the stand-in)."""
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        return False, f"tensors are on several devices ({', '.join(sorted(map(str, devices)))})"
    (dev,) = devices
    if dev.type == "cuda" or (dev.type == "cpu" and stand_in() is not None):
        return True, ""
    return False, f"tensors are on {dev}; fla's chunk kernels need CUDA tensors"
