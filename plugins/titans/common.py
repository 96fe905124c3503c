"""Pieces shared by the Titans architectures (LMM, MAG, MAL, MAC).

- `HybridParams`: the ``[model]`` params of MAG and MAL (`LMParams` plus attention);
- `BranchGate`: the paper's ``(x)`` gate (normalise both branches with learned vector weights,
  then a sigmoid);
- `WindowAttentionParams`: `LMParams` plus the sliding-window attention's (MAG, MAL and MAC's
  base), and `persistent_at_most`, the check that the persistent tokens fit the attention span;
- re-exported from `atlas_core.lm` (the core's generic language model, ``core:lm``): `LMParams`,
  `build_blocks`, `make_mlp`, `run_memory` and `TitansLM` (= `LanguageModel`).

Shapes: ``ids: [B, T]``, hidden ``x: [B, T, d_model]``, ``logits: [B, T, vocab_size]``.
"""

from __future__ import annotations

import torch
from pydantic import Field, field_validator, ValidationInfo
from atlas_core.params import size_field
from torch import nn

from atlas_core.lm import (  # noqa: F401 - the generic pieces, shared with core:lm
    LanguageModel, LMParams, build_blocks, make_mlp, run_memory,
)

TitansLM = LanguageModel  # the Titans architectures are language models of the core's kind


class WindowAttentionParams(LMParams):
    """`LMParams` plus the sliding-window attention of the hybrid architectures."""

    window: int = size_field(64, "seq_len", ge=1, description="sliding-window attention: keys per query")
    attn_heads: int | None = size_field(None, "heads", ge=1, validate_default=True, description="attention heads (default: heads)"
    )
    rotary_base: float = Field(10000.0, gt=0, description="rotary position base")

    @field_validator("attn_heads")
    @classmethod
    def _check_heads(cls, v: int | None, info: ValidationInfo) -> int | None:
        d, h = info.data.get("d_model"), v or info.data.get("heads")
        if d is not None and h is not None and (d % h or (d // h) % 2):
            raise ValueError(
                f"d_model={d} / attention heads={h} must be a whole, even head size (rotary "
                "positions rotate pairs of features); choose attn_heads accordingly"
            )
        return v


def persistent_at_most(v: int, info: ValidationInfo, limit_name: str) -> int:
    """``persistent_tokens = v`` when it is at most the ``limit_name`` field validated before it."""
    limit = info.data.get(limit_name)
    if limit is not None and v > limit:
        raise ValueError(
            f"persistent_tokens={v} exceeds {limit_name}={limit}: the fixed prefix would "
            f"outnumber the tokens each query attends to; use at most {limit}"
        )
    return v


class HybridParams(WindowAttentionParams):
    """Params of titans:mag and titans:mal."""

    persistent_tokens: int = size_field(4, "seq_len", ge=0, description="learned input-independent tokens prefixed to every attention"
    )

    @field_validator("persistent_tokens")
    @classmethod
    def _check_persistent(cls, v: int, info: ValidationInfo) -> int:
        return persistent_at_most(v, info, "window")


class BranchGate(nn.Module):
    """Titans' ``y (x) m`` (Sec 4.2): ``W_o (norm_y(y) * sigmoid(norm_m(m)))``, both norms with
    learned vector weights. ``y, m: [B, T, d]``."""

    def __init__(self, d_model: int, eps: float) -> None:
        super().__init__()
        self.norm_y = nn.RMSNorm(d_model, eps=eps)
        self.norm_m = nn.RMSNorm(d_model, eps=eps)
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, y: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm_y(y) * torch.sigmoid(self.norm_m(m)))
