"""The decode step on a CPU as small C++ kernels (``csrc/``): the matrix-vector product
(``matvec.cpp``: ``x W^T`` for a few rows ``x`` against a float32 or bfloat16 weight, read once at
the memory's bandwidth; a bfloat16 weight is widened in registers, so it reads half the bytes of
float32) and a delta-family memory layer's token after its projection (``memory_step.cpp``: the
short convolution, the q/k norms, the memory's update and read in one pass over the memory, the
output norm and gate) and the row-wise work between the products (``rows.cpp``: the residual add
with the RMSNorm after it, the greedy argmax over the vocabulary, and `denormals_flushed`).

PyTorch's ``F.linear`` of one row runs a general matrix product and, for bfloat16 on a CPU without
bfloat16 arithmetic, converts on the way; a token of decode is nothing but such products, so their
read rate is the decode rate. The kernel is compiled for this machine on first use
(`torch.utils.cpp_extension`, kept under ``$ATLAS_KERNEL_CACHE`` or ``~/.cache/atlas/kernels``;
seconds, said on stderr) and loaded from there after.

`kernel()` is None where it cannot be had: ``ATLAS_CPU_KERNELS=0`` in the environment, no C++
compiler, or a failed build (said once on stderr). `atlas_core.decode.fused.matvec` then runs
``F.linear``, the readable reference the tests compare the kernel with.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

_CSRC = Path(__file__).parent / "csrc"
_SOURCES = [_CSRC / "module.cpp", _CSRC / "matvec.cpp", _CSRC / "memory_step.cpp", _CSRC / "rows.cpp"]
_state: dict[str, Any] = {}


def enabled() -> bool:
    """Whether the environment allows the kernel (``ATLAS_CPU_KERNELS`` unset or not ``0``)."""
    return os.environ.get("ATLAS_CPU_KERNELS", "1").strip().lower() not in {"0", "false", "no", "off"}


def _build() -> Any:
    import shutil
    import time

    from torch.utils import cpp_extension

    if shutil.which(os.environ.get("CXX", "c++")) is None:
        print("atlas: no C++ compiler: decoding with torch's F.linear (slower); "
              "install g++ or set ATLAS_CPU_KERNELS=0 to silence this", file=sys.stderr)
        return None
    # one build per source text and machine: the name carries both
    import hashlib
    import platform

    tag = hashlib.sha256(b"".join(p.read_bytes() for p in _SOURCES) + platform.machine().encode()).hexdigest()[:10]
    name = f"atlas_matvec_{tag}"
    flags = ["-O3", "-fopenmp"] + (["-march=native"] if platform.machine() in {"x86_64", "AMD64"} else [])
    root = os.environ.get("ATLAS_KERNEL_CACHE") or Path.home() / ".cache" / "atlas" / "kernels"
    build_dir = Path(root) / f"torch-{torch.__version__.split('+')[0]}" / name
    build_dir.mkdir(parents=True, exist_ok=True)
    fresh = not any(build_dir.glob(f"{name}*.so"))
    t = time.perf_counter()
    if fresh:
        print("atlas: compiling the CPU decode kernel for this machine (once)",
              file=sys.stderr, flush=True)
    try:
        mod = cpp_extension.load(name, [str(p) for p in _SOURCES], extra_cflags=flags, extra_ldflags=["-fopenmp"],
                                 build_directory=str(build_dir), verbose=False)
    except Exception as exc:  # a compiler error, a missing header: fall back, say it once
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"atlas: the CPU decode kernel did not build ({first[:200]}); decoding with torch's "
              "F.linear (slower); ATLAS_CPU_KERNELS=0 silences this", file=sys.stderr)
        return None
    if fresh:
        print(f"atlas: CPU decode kernel ready ({time.perf_counter() - t:.0f} s)", file=sys.stderr)
    return mod


def _module() -> Any:
    """The compiled module, or None (module docstring)."""
    if not enabled():
        return None
    if "mod" not in _state:
        _state["mod"] = _build()
    return _state["mod"]


def kernel() -> Callable | None:
    """The compiled ``matvec(W, x) -> x W^T`` (float32 ``x [B, K]``, float32 or bfloat16 ``W``,
    both contiguous, on the CPU), or None (module docstring)."""
    mod = _module()
    if mod is None:
        return None
    raw = mod.matvec

    def matvec(W: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty(x.shape[0], W.shape[0], dtype=torch.float32, device=x.device)
        raw(W.data_ptr(), x.data_ptr(), y.data_ptr(), W.shape[0], W.shape[1], x.shape[0],
            W.dtype == torch.bfloat16)
        return y

    return matvec


def memory_kernel() -> Callable | None:
    """The compiled memory step (``csrc/memory_step.cpp``: data pointers and sizes;
    `atlas_core.decode.blocks.MemoryStep` calls it), or None (module docstring)."""
    mod = _module()
    return None if mod is None else mod.memory_step


def rows_kernels() -> Any | None:
    """The compiled module's row-wise functions (``csrc/rows.cpp``: ``add_rms_norm``,
    ``add_normed``, ``argmax``; `atlas_core.decode.norm` calls them), or None (module docstring)."""
    return _module()


@contextmanager
def denormals_flushed() -> Iterator[None]:
    """Float32 denormals flushed to zero (FTZ/DAZ) on this thread and every thread of ATen's pool
    while the block runs, then as they were (``csrc/rows.cpp``: a chunked memory's decay products
    fall below 1.2e-38, where the CPU's arithmetic takes a slow path); nothing without the kernel."""
    mod = _module()
    before = True if mod is None else mod.flush_denormals(True)
    try:
        yield
    finally:
        if not before:
            mod.flush_denormals(False)


def usable(W: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether the kernel computes ``x W^T`` for these tensors (a CPU, a few rows, the dtypes it has)."""
    return (W.device.type == "cpu" and W.dim() == 2 and x.dim() == 2 and x.shape[0] <= 8
            and W.dtype in (torch.float32, torch.bfloat16) and W.is_contiguous()
            and not torch.is_grad_enabled())


__all__ = ["denormals_flushed", "enabled", "kernel", "memory_kernel", "rows_kernels", "usable"]
