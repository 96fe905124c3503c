"""Memory structure: what the fast weights are and how the memory is read.

Shapes (per batch b and head h the memory is its own function):
- weights ``W``: a dict of tensors ``[B, H, *shape]`` (core:linear: ``{"M": [B, H, Dv, Dphi]}``);
- per-token weights ``Wt``: the same dict with a time axis ``[B, H, N, *shape]``;
- inputs ``x: [B, H, N, Dphi]`` (already feature-mapped), outputs ``[B, H, N, Dv]``;
- error derivatives ``u: [B, H, N, Dv]`` (d loss / d prediction, from the bias).

Every method must stay differentiable (create no detached tensors): the outer loop trains through
the inner one.
"""

from __future__ import annotations

import torch
from torch import nn


class Structure(nn.Module):
    """Base class of memory structures."""

    #: Every weight is a matrix (a Muon-style algorithm can orthogonalise each one).
    matrix_shaped: bool = True
    #: ``read(W, x)`` is linear in W and in x: ``M x`` (enables the intra-chunk attention form).
    is_linear: bool = False
    #: `retain` takes a per-key-dimension factor ``[B, H, Dphi]`` (a retention with
    #: ``alpha_shape = "key"``: GLA, KDA); structures without it are refused at build time.
    per_key_retain: bool = False
    #: `grad_factors` gives each per-token gradient as rank-one factors and `apply_layers` reads
    #: through the layers as matrix products (``titans:mlp``): ``core:chunkwise``'s dual form.
    rank_one_grads: bool = False

    def __init__(self) -> None:
        super().__init__()
        self.heads: int | None = None
        self.d_in: int | None = None
        self.d_out: int | None = None

    @property
    def bound(self) -> bool:
        return self.heads is not None

    def bind(self, heads: int, d_in: int, d_out: int) -> None:
        """Fix the sizes (heads, Dphi, Dv); create learned initial weights if any."""
        self.heads, self.d_in, self.d_out = heads, d_in, d_out

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of each weight for one (batch, head), after `bind`."""
        raise NotImplementedError

    def effective(self, W: dict) -> dict:
        """The weights the memory reads with, from its state ``W`` (the state itself, unless the
        state is an offset from learned initial weights, as ``titans:mlp``'s is)."""
        return W

    def init_state(self, batch: int, *, dtype: torch.dtype, device: torch.device) -> dict:
        """The memory before the first token: ``{name: [B, H, *shape]}``."""
        return {
            k: torch.zeros(batch, self.heads, *s, dtype=dtype, device=device)
            for k, s in self.weight_shapes().items()
        }

    def retain(self, W: dict, alpha: torch.Tensor) -> dict:
        """The weights kept by a retain factor: ``alpha * W`` for a scalar per (batch, head),
        ``alpha: [B, H]``. A structure with ``per_key_retain`` also takes ``alpha: [B, H, Dphi]``
        and decays along its key axis (``core:linear``: ``M Diag(alpha)``)."""
        if alpha.dim() != 2:
            raise ValueError(
                f"{type(self).__name__} retains by a scalar per (batch, head) [B, H]; got a factor "
                f"of shape {tuple(alpha.shape)} (a per-key factor needs per_key_retain)")
        return {k: alpha.reshape(*alpha.shape, *([1] * (w.dim() - 2))) * w for k, w in W.items()}

    def read(self, W: dict, x: torch.Tensor) -> torch.Tensor:
        """``M(x)`` for one set of weights per (batch, head): x [B,H,N,Dphi] -> [B,H,N,Dv]."""
        raise NotImplementedError

    def read_per_token(self, Wt: dict, x: torch.Tensor) -> torch.Tensor:
        """``M_n(x_n)`` with weights per token: Wt {k: [B,H,N,*s]}, x [B,H,N,Dphi] -> [B,H,N,Dv]."""
        raise NotImplementedError

    def grad(self, W: dict, x: torch.Tensor, u: torch.Tensor) -> dict:
        """Gradient w.r.t. W of ``sum_n <M(x_n), u_n>``: the inner gradient for error derivatives
        u (already weighted). Returns ``{name: [B, H, *shape]}``."""
        raise NotImplementedError

    def grad_per_token(self, W: dict, x: torch.Tensor, u: torch.Tensor) -> dict:
        """As `grad` but one gradient per token: ``{name: [B, H, N, *shape]}``."""
        raise NotImplementedError

    def check_composition(self, rule) -> list[str]:
        """Problems with the composition this knob is placed in (a list of messages; empty
        when it fits). Called once, when the rule is built."""
        return []
