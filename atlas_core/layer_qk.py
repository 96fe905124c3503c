"""What a memory layer may apply to its queries and keys besides the norm: a feature map and rotary
position embeddings (``[layer] qk_feature_map``, ``rotary``; docs/zoo.md, "Layer options").

``QKFeatureMap(kind, d)`` maps each head's ``[..., d]`` to ``[..., out_dim(kind, d)]``, one map shared
by every head (fla's ``fla.modules.feature_map``, and its linear attention's ``feature_map``):

- ``"none"``: ``x``;  ``"relu"``: ``max(x, 0)``;  ``"elu_p1"``: ``elu(x) + 1``;
- ``"hadamard"`` (fla's ``elementwise_product``): ``(W_a x + b_a) * (W_b x + b_b)``;
- ``"hedgehog"`` (Zhang et al. 2024): ``softmax([2 (W x + b), -2 (W x + b)])``, ``2 d`` features,
  ``W`` starting at the identity and ``b`` at 0;
- ``"t2r"`` (Kasai et al. 2021): ``relu(W x)``.

`rotary(x, pos, base)` rotates ``x: [B, T, H, D]`` at the positions ``pos: [B, T]``: RoPE in its
rotate-half form (fla's ``RotaryEmbedding``, non-interleaved, over the whole head): with
``f_i = base^(-2i / D)``, ``x1, x2`` the two halves of ``x``,
``[x1 cos(p f) - x2 sin(p f), x2 cos(p f) + x1 sin(p f)]``.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

QKFeatureMapKind = Literal["none", "relu", "elu_p1", "hadamard", "hedgehog", "t2r"]
#: the feature maps with learned weights
LEARNED_MAPS = ("hadamard", "hedgehog", "t2r")


def feature_dim(kind: str, d: int) -> int:
    """The size of ``kind``'s output for a head of size ``d``."""
    return 2 * d if kind == "hedgehog" else d


class QKFeatureMap(nn.Module):
    """phi for one of q or k; parameters ``a`` (and ``b`` for "hadamard"), each an ``nn.Linear``."""

    def __init__(self, kind: str, d: int) -> None:
        super().__init__()
        self.kind = kind
        if kind in ("hadamard", "hedgehog"):
            self.a = nn.Linear(d, d)
        if kind == "hadamard":
            self.b = nn.Linear(d, d)
        if kind == "t2r":
            self.a = nn.Linear(d, d, bias=False)
        if kind == "hedgehog":  # starts at the identity map
            with torch.no_grad():
                nn.init.eye_(self.a.weight)
                nn.init.zeros_(self.a.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind = self.kind
        if kind == "relu":
            return F.relu(x)
        if kind == "elu_p1":
            return F.elu(x) + 1.0
        if kind == "hadamard":
            return self.a(x) * self.b(x)
        if kind == "hedgehog":
            y = 2.0 * self.a(x)
            return torch.cat([y, -y], dim=-1).softmax(-1)
        if kind == "t2r":
            return F.relu(self.a(x))
        return x

    def extra_repr(self) -> str:
        return self.kind


def positions(start: torch.Tensor, T: int, cu: list[int] | None = None) -> torch.Tensor:
    """The position of every new token: ``[B, T]`` from ``start: [B]``; packed documents
    (``cu``, ``start: [N]`` per document, ``B = 1``): each document counts from its own start."""
    steps = torch.arange(T, device=start.device)
    if cu is None:
        return start[:, None] + steps
    from .varlen import document_ids

    doc = document_ids(cu, device=start.device)
    first = torch.tensor(cu[:-1], device=start.device)[doc]
    return (start[doc] + steps - first)[None]


def rotary(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """``x: [B, T, H, D]`` (D even) rotated at ``pos: [B, T]`` (see the module docstring); the
    angles in float32 or better, as fla computes its tables."""
    D = x.shape[-1]
    work = torch.promote_types(x.dtype, torch.float32)
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D))
    angle = pos.to(torch.float32)[..., None] * inv_freq  # [B, T, D/2]
    cos, sin = angle.cos().to(work)[:, :, None], angle.sin().to(work)[:, :, None]
    x1, x2 = x.to(work).chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


__all__ = ["QKFeatureMap", "QKFeatureMapKind", "LEARNED_MAPS", "feature_dim", "positions", "rotary"]
