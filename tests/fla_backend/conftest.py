"""fla is imported here, before this folder's test modules (as in tests/fla_oracle/conftest.py):
with ``TRITON_INTERPRET=1`` when there is no GPU and the variable is not set already, then the
variable is removed again. Without it, importing fla after the suite's conftest has imported
Triton in interpreter mode fails in ``triton.experimental.gluon``. fla's kernels are never launched
here: the stand-in (stand_in.py) replaces the entry points the backends call.

Fixtures: ``certs`` points the certificate file at a fresh temporary path; ``stand_in`` makes
fla's entry points pure PyTorch on the CPU and turns on the backends' CPU hook.
"""

import os

import pytest
import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import fla.layers  # noqa: F401
        import fla.models  # noqa: F401
        import fla.ops  # noqa: F401
    except ImportError:  # flash-linear-attention not installed: the test modules skip
        pass
    finally:
        del os.environ["TRITON_INTERPRET"]


@pytest.fixture
def certs(tmp_path, monkeypatch):
    """An empty certificate file of this test's own."""
    from atlas_plugins.fla_backend.certificates import PATH_ENV

    path = tmp_path / "fla_certificates.json"
    monkeypatch.setenv(PATH_ENV, str(path))
    for name in ("ATLAS_BACKEND", "ATLAS_DISABLE_BACKENDS"):
        monkeypatch.delenv(name, raising=False)
    return path


@pytest.fixture
def stand_in(certs):
    """fla's chunk ops on the CPU (tests/fla_oracle's recurrence) and the backends' CPU hook; yields
    the log of the calls fla's entry points received."""
    from tests.fla_backend.stand_in import fla_ops_on_cpu

    with fla_ops_on_cpu() as calls:
        yield calls
