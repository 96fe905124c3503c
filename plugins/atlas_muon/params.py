"""Parameter models of the ``atlas_muon`` components (pydantic; unknown keys are errors).

Kept free of torch so that validating a spec (``atlas spec validate``) stays cheap.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field, field_validator
from atlas_core.params import size_field

from atlas_core.host.registry import Params

DEFAULT_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


class MuonParams(Params):
    """Parameters of ``atlas_muon:muon``."""

    ns_steps: int = size_field(5, "iterations",
        ge=0,
        strict=True,  # an integer, not `true` or 2.5
        description="Newton-Schulz iterations k; 0 skips orthogonalisation (the update is then "
        "the Frobenius-normalised momentum Z / ||Z||_F)",
    )
    # inf/nan reach `_three_finite`, whose message names the default quintic
    coefficients: tuple[Annotated[float, Field(allow_inf_nan=True)], ...] = Field(
        DEFAULT_COEFFICIENTS,
        description="(a, b, c) of the quintic X <- a X + (b A + c A^2) X, A = X X^T (Muon's default)",
    )

    @field_validator("coefficients")
    @classmethod
    def _three_finite(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if len(value) != 3:
            raise ValueError(
                f"coefficients must be three numbers (a, b, c), got {len(value)}: {list(value)}; "
                f"the Muon quintic is {list(DEFAULT_COEFFICIENTS)}"
            )
        if not all(math.isfinite(x) for x in value):
            raise ValueError(
                f"coefficients must be finite numbers, got {list(value)}; the Muon quintic is "
                f"{list(DEFAULT_COEFFICIENTS)}"
            )
        return value


class AtlasParallelParams(Params):
    """Parameters of ``atlas_muon:atlas_parallel``."""

    chunk_size: int | None = size_field(None, "chunk", ge=1, description="tokens per chunk (C); must divide the rule's anchor; default: "
        "the largest divisor of the anchor up to 64",
    )
    checkpoint: bool = Field(
        True,
        description="recompute each chunk in the backward pass instead of keeping its per-token "
        "momenta and Newton-Schulz iterates: training memory O((T/C) |W| + C k |W|) instead of "
        "O(T k |W|); the results are identical",
    )
    # the same default as core:chunkwise's (atlas_core.strategies.chunkwise.DEFAULT_BUDGET_MIB,
    # not imported: this module stays free of torch)
    memory_budget_mib: float | None = Field(
        1024.0, gt=0, description="when the chunk-boundary states kept for the backward pass "
        "would exceed this many MiB, keep them only every ceil(sqrt(T/C)) chunks and recompute "
        "each segment in the backward pass: O(sqrt(T/C) |W|) (identical results; one more "
        "forward per chunk); null: keep every chunk boundary",
    )
    backend: str | None = Field(
        None, description="force a kernel backend by name, or 'torch' for the PyTorch code"
    )
