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
    """Triton importable, a CUDA device present or the interpreter switched on, and a tiny kernel
    compiled and launched there (`probe`; once per process and place)."""
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed (pip install 'atlas-ttm[triton]')"
    try:
        import triton  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a broken install is a reason, not a crash
        return False, f"triton failed to import: {type(exc).__name__}: {exc}"
    if interpreter_on():
        return probe("cpu")
    import torch

    if not torch.cuda.is_available():
        return False, "no CUDA device (set TRITON_INTERPRET=1 to run the kernels in Triton's CPU interpreter)"
    return probe(f"cuda:{torch.cuda.current_device()}")


_PROBED: dict[tuple[str, bool], tuple[bool, str]] = {}


def probe(device: str) -> tuple[bool, str]:
    """Compile and launch the probe kernel on ``device`` (``"cpu"``: the interpreter); the answer
    is kept for the process."""
    key = (device, interpreter_on())
    if key not in _PROBED:
        try:
            from .probe import run_probe

            run_probe(device)
            _PROBED[key] = (True, "")
        except Exception as exc:  # noqa: BLE001 - any failure means "not here", with its reason
            where = "the interpreter" if device == "cpu" else device
            first = (str(exc).strip().splitlines() or [""])[0]
            _PROBED[key] = (False, f"a probe kernel failed to compile or launch on {where}: "
                                   f"{type(exc).__name__}: {first}")
    return _PROBED[key]


def tensors_runnable(*tensors) -> tuple[bool, str]:
    """The tensors live where the kernels run: on a CUDA device, or anywhere under the interpreter."""
    if interpreter_on():
        return True, ""
    for t in tensors:
        if not t.is_cuda:
            return False, f"tensors are on {t.device}; the kernels need CUDA tensors (or TRITON_INTERPRET=1)"
    return True, ""


def launch_errors() -> tuple[type[BaseException], ...]:
    """What a kernel launch raises when a configuration cannot compile or run on this device:
    too much shared memory or too many threads (``OutOfResources``), ptxas or Triton compile
    failures."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources, PTXASError

    return (OutOfResources, PTXASError, CompilationError)


_WARNED: set[str] = set()


def launch_fallback(backend: str, strategy, exc: BaseException, torch_run):
    """A kernel launch failed: run the strategy's PyTorch code instead, with one warning per
    backend and failure kind; a backend the user forced raises instead (no silent fallback)."""
    import warnings

    from atlas_core.errors import StrategyError

    what = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
    if strategy.bound_backends().requested == backend:
        raise StrategyError(f"backend {backend} was requested but its kernel failed to launch ({what})") from exc
    key = f"{backend}:{type(exc).__name__}:{what}"
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(
            f"{backend}: the kernel failed to launch ({what}); {strategy.name} runs its PyTorch code "
            f"for such calls instead (same function, slower). Set ATLAS_DISABLE_BACKENDS={backend} "
            "to silence this.", RuntimeWarning, stacklevel=3,
        )
    return torch_run()
