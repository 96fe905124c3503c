"""Tests of the ``cuda`` plugin's Triton kernels, run on the CPU through Triton's interpreter.

``TRITON_INTERPRET=1`` has to be in the environment before any ``@triton.jit`` function is defined
(Triton reads it when the decorator runs, and again when it first launches a kernel), so it is set
here, at the top of the first module pytest imports for this folder, with ``setdefault``: a value
already in the environment wins.

The variable stays set for the rest of the pytest process: float32 ``core:chunkwise`` calls made by
other test folders in the same run are then served by ``cuda:chunk_linear`` in the interpreter too
(correct, a little slower). ``ATLAS_DISABLE_BACKENDS=all`` turns that off.

Triton is imported by the test modules at module level on purpose: without Triton the run fails
(collection errors), it never skips.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
