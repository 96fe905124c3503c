"""fla's packages are imported here, before this folder's test modules, with ``TRITON_INTERPRET=1``
when there is no GPU (and the variable is not set already), then the variable is removed again.

The suite's conftest imports ``triton.language`` in interpreter mode on a machine without a GPU
and then unsets the variable; importing ``fla.models`` afterwards reaches
``triton.experimental.gluon``, whose import asserts that a Triton library function is either a
compiled ``JITFunction`` or that the interpreter is on, and fails. With the variable set while fla
is imported, the import goes through; fla's kernels are never launched here (the CPU oracle,
oracle.py, stands in for them), and the rest of the suite keeps running without the variable.
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import fla.layers  # noqa: F401
        import fla.models  # noqa: F401
    except ImportError:  # flash-linear-attention not installed: the tests skip on their own import
        pass
    finally:
        del os.environ["TRITON_INTERPRET"]
