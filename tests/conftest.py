"""Suite-wide settings, made before any test module is imported.

- The tests use tiny tensors, for which one intra-op thread is fastest.
- Triton decides once, when ``triton.language`` is first imported, whether its ``@triton.jit``
  functions (its own ``tl.cumsum`` and the like included) are made for the CPU interpreter: on a
  machine without a GPU the kernel tests run in the interpreter, so Triton is first imported here
  with ``TRITON_INTERPRET=1``. Otherwise whichever test module happened to import it first (through
  ``torch.utils.flop_counter``, say) would fix it for the whole run, and every kernel test calling
  a Triton library function would fail. The variable itself is set again only while the kernel
  tests are collected and run (tests/cuda_backend/conftest.py); the rest of the suite runs
  without it.
"""

import os

import torch

torch.set_num_threads(1)

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401
    except ImportError:  # the kernel tests need Triton; without it they fail on their own import
        pass
    finally:
        del os.environ["TRITON_INTERPRET"]
