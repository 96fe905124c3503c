"""``core:linear``: the matrix memory ``M(x) = M x`` (docs/math.md, "Linear (matrix) memory").

Weights: ``{"M": [B, H, Dv, Dphi]}``, zero at the start. The inner gradient of
``sum_n <M x_n, u_n>`` is ``sum_n u_n x_n^T``.
"""

from __future__ import annotations

import torch

from ..knobs.structure import Structure


class LinearMemory(Structure):
    matrix_shaped = True
    is_linear = True
    per_key_retain = True

    def retain(self, W: dict, alpha: torch.Tensor) -> dict:
        # a scalar per (batch, head) [B, H], or one per key dimension [B, H, Dphi]: M Diag(alpha)
        a = alpha[..., None, None] if alpha.dim() == 2 else alpha.unsqueeze(-2)
        return {"M": W["M"] * a}

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"M": (self.d_out, self.d_in)}

    def read(self, W: dict, x: torch.Tensor) -> torch.Tensor:
        # M: (B, H, Dv, Dphi), x: (B, H, N, Dphi) -> (B, H, N, Dv)
        return torch.einsum("bhvp,bhnp->bhnv", W["M"], x)

    def read_per_token(self, Wt: dict, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bhnvp,bhnp->bhnv", Wt["M"], x)

    def grad(self, W: dict, x: torch.Tensor, u: torch.Tensor) -> dict:
        return {"M": torch.einsum("bhnv,bhnp->bhvp", u, x)}

    def grad_per_token(self, W: dict, x: torch.Tensor, u: torch.Tensor) -> dict:
        return {"M": torch.einsum("bhnv,bhnp->bhnvp", u, x)}


def build(params, ctx) -> LinearMemory:
    return LinearMemory()
