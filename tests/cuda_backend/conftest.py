"""Tests of the ``cuda`` plugin's Triton kernels: compiled on a GPU, in Triton's interpreter otherwise.

Where the kernels run:

- a CUDA device present and ``TRITON_INTERPRET`` not set: the tests run the compiled kernels on
  CUDA tensors (the ``device`` fixture is ``"cuda"``);
- otherwise (no GPU, or ``TRITON_INTERPRET=1`` set on purpose): Triton's CPU interpreter on CPU
  tensors (``device`` is ``"cpu"``, test ids say ``interpreter``).

``TRITON_INTERPRET=1`` has to be in the environment before any ``@triton.jit`` function is defined
(Triton reads it when the decorator runs) and whenever a kernel launches. So, without a GPU:

1. it is set here, at the top of the first module pytest imports for this folder, with
   ``os.environ.setdefault`` — before the test modules import Triton and the kernel modules;
2. every test in this folder runs with it set (the autouse fixture below);
3. if this file set it, it is removed again once collection is over, so that the REST of the suite
   keeps running on the PyTorch strategies (with it set, every float32 ``core:chunkwise`` call
   anywhere would be served by ``cuda:chunk_linear`` in the slow interpreter).

Under the interpreter, ``tl.dot(..., input_precision="tf32")`` rounds its operands to TF32 (10
mantissa bits, round to nearest with ties away from zero, as ``cvt.rna.tf32.f32`` on the GPU) —
the interpreter itself ignores ``input_precision`` and multiplies in float32, which hid TF32's
error from the half-precision tests (`tf32_emulation`).

Triton is imported by the test modules at module level: without Triton the run fails (collection
errors), it never skips.
"""

from __future__ import annotations

import os

import torch

_FORCED = os.environ.get("TRITON_INTERPRET", "").strip().lower() in {"1", "true", "yes", "on"}
GPU = torch.cuda.is_available() and not _FORCED
_SET_HERE = not GPU and "TRITON_INTERPRET" not in os.environ
if not GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
_VALUE = os.environ.get("TRITON_INTERPRET")
DEVICE = "cuda" if GPU else "cpu"

import numpy as np  # noqa: E402
import pytest  # noqa: E402


def pytest_collection_finish(session):
    if _SET_HERE:
        os.environ.pop("TRITON_INTERPRET", None)


@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch):
    """Each kernel test runs under the interpreter setting chosen at import time."""
    if _VALUE is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", _VALUE)


@pytest.fixture(params=[DEVICE], ids=["cuda" if GPU else "interpreter"])
def device(request) -> str:
    """Where the kernels run in this session: ``"cuda"`` (compiled) or ``"cpu"`` (interpreter)."""
    return request.param


def tf32_round(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest TF32 value (10 mantissa bits; ties away from zero), as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    finite = (bits & 0x7F800000) != 0x7F800000
    rounded = (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return np.where(finite, rounded, bits).astype(np.uint32).view(np.float32)


@pytest.fixture(autouse=True)
def tf32_emulation(monkeypatch):
    """Under the interpreter, a TF32 ``tl.dot`` rounds both float32 operands to TF32 first."""
    if GPU:
        yield
        return
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    real = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if input_precision == ir.INPUT_PRECISION.TF32 and a.data.dtype == np.float32:
            a = interpreter.TensorHandle(tf32_round(a.data), a.dtype.scalar)
            b = interpreter.TensorHandle(tf32_round(b.data), b.dtype.scalar)
        return real(self, a, b, d, input_precision, max_num_imprecise_acc)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
    yield
