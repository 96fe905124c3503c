"""Tests of the ``cuda`` plugin's Triton kernels, run on the CPU through Triton's interpreter.

``TRITON_INTERPRET=1`` has to be in the environment before any ``@triton.jit`` function is defined
(Triton reads it when the decorator runs) and whenever a kernel launches (Triton imports parts of
itself lazily at the first launch, and those check it too). So:

1. it is set here, at the top of the first module pytest imports for this folder, with
   ``os.environ.setdefault`` — before the test modules import Triton and the kernel modules;
2. every test in this folder runs with it set (the autouse fixture below);
3. if this file set it (it was not in the environment already), it is removed again once
   collection is over, so that the REST of the suite keeps running on the PyTorch strategies:
   with the variable set, every float32 ``core:chunkwise`` call anywhere in the run would be served
   by ``cuda:chunk_linear`` in the (slow) interpreter. ``TRITON_INTERPRET=1 pytest`` sets it for
   the whole run on purpose and is left alone.

Triton is imported by the test modules at module level: without Triton the run fails (collection
errors), it never skips.
"""

from __future__ import annotations

import os

_SET_HERE = "TRITON_INTERPRET" not in os.environ
os.environ.setdefault("TRITON_INTERPRET", "1")
_VALUE = os.environ["TRITON_INTERPRET"]

import pytest  # noqa: E402


def pytest_collection_finish(session):
    if _SET_HERE:
        os.environ.pop("TRITON_INTERPRET", None)


@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch):
    """Each kernel test runs under the interpreter setting chosen at import time."""
    monkeypatch.setenv("TRITON_INTERPRET", _VALUE)
