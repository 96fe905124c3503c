"""The switch: ``ACME_PLANTED_BUG`` names at most one planted bug (read on every call, so a test
can plant one in a running process). No torch here: the entry module imports this."""

from __future__ import annotations

import os

BUG_ENV = "ACME_PLANTED_BUG"

#: bug -> what it breaks (and, in tests/testing/test_planted_bugs.py, the check that catches it)
BUGS = {
    "wrong_large_chunk": "planted:mesa_chunks scales its outputs by 1.001 when chunk_size > 4",
    "ignores_state": "planted:mesa_chunks starts every call from an empty state",
    "claims_every_rule": "planted:mesa_chunks.supports() accepts every rule",
    "claims_standalone": "planted:mesa_chunks.supports() accepts every standalone rule (and runs "
                         "another plugin's by its reference loop)",
    "detached_grad": "planted:mesa_chunks detaches the state it carries from chunk to chunk",
    "gate_edge_nan": "planted:rho_keep computes 1 - rho^2 as exp(log1p(-rho^2)): its gradient is "
                     "NaN at rho = 1",
    "standalone_gate_edge_nan": "planted:mesa computes its forget gate as f (1 - f) / (1 - f): "
                                "NaN at forget = 1 only",
}


def planted(name: str) -> bool:
    """Whether bug ``name`` is planted now."""
    if name not in BUGS:
        raise KeyError(f"no planted bug {name!r}; known: {', '.join(BUGS)}")
    value = os.environ.get(BUG_ENV, "")
    if value and value not in BUGS:
        raise ValueError(f"{BUG_ENV}={value!r} names no planted bug; known: {', '.join(BUGS)}")
    return value == name
