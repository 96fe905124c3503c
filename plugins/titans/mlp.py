"""``titans:mlp``: deep memory, a small MLP per head whose weights are the fast state.

Titans (Sec 3.1) and Atlas use a multi-layer memory instead of a matrix. With depth L, expansion e
and activation s, for one (batch, head)::

    M(x) = x + W_L s( ... s(W_2 s(W_1 x)) ... )        (the residual only when Dv == Dphi)

``W_1: [hidden, Dphi]``, ``W_i: [hidden, hidden]`` for 1 < i < L, ``W_L: [Dv, hidden]`` with
``hidden = round(e * Dphi)``; depth 1 is the linear map ``x + W_1 x``. The weights are numbered
from the input, ``W1`` the first layer applied (docs/math.md, "Deep memory").

Shapes (the `Structure` contract):
- weights ``W``: ``{"W1": [B, H, hidden, Dphi], ..., "W<L>": [B, H, Dv, hidden]}``;
- per-token weights ``Wt``: ``{"W<i>": [B, H, N, *shape]}``;
- inputs ``x: [B, H, N, Dphi]``, error derivatives ``u: [B, H, N, Dv]``, outputs ``[B, H, N, Dv]``.

The initial weights are learned (``nn.Parameter`` per head, ``[H, *shape]``, created in `bind` with
a 1/sqrt(fan_in) random init): with all-zero weights the gradient of every layer would be zero and
the memory could never learn. **The fast state is the offset from them**: the memory reads with
``W_init + W`` and the state ``W`` starts at zero, so retention (``alpha W``) decays the memory
toward its learned initial weights, not toward zero. Decaying the weights themselves makes zero an
absorbing point (each layer's gradient is multiplied by the other layers' weights and ``s(0) = 0``):
at the default retain factor (about 0.95 per token) the memory reached exactly zero within a few
thousand tokens and the layer output only its residual. Every structure method below evaluates
the MLP at ``W_init + W``; gradients with respect to ``W`` are gradients with respect to the
effective weights.

The inner gradients come from autograd through ``torch.func`` (``vjp`` for the gradient of
``sum_n <M(x_n), u_n>``, ``vmap`` over tokens for per-token gradients). Both compose with the outer
autograd, so the outer loop trains through the inner one (second derivatives of the activation).
`grad_factors` gives each per-token gradient as its rank-one factors (``delta_n z_n^T`` per layer)
and `apply_layers` the read with its matrix products delegated: together they let
``core:chunkwise`` read every token at its own weights without forming them (the dual form).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from atlas_core.params import size_field
from torch import nn

from atlas_core.errors import Issue, SpecError
from atlas_core.host.registry import Params
from atlas_core.knobs.structure import Structure

_ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "tanh": torch.tanh}


class MLPParams(Params):
    depth: int = size_field(2, "mem_depth", ge=1, description="number of weight matrices (1 = a linear map)")
    expansion: float = size_field(4.0, "ratio", gt=0, description="hidden width = round(expansion * Dphi)")
    activation: Literal["silu", "gelu", "tanh"] = Field("silu", description="hidden nonlinearity")
    residual: bool = Field(True, description="add x to the output (needs Dv == Dphi)")


class MLPMemory(Structure):
    """Per-head fast-weight MLP (see module docstring)."""

    matrix_shaped = True
    is_linear = False

    def __init__(self, params: MLPParams | None = None) -> None:
        super().__init__()
        self.params = params or MLPParams()
        self.depth = self.params.depth
        self.residual = self.params.residual
        self.act = _ACTIVATIONS[self.params.activation]
        self.init = nn.ParameterDict()
        self.hidden: int | None = None

    # -- sizes ----------------------------------------------------------------------------------
    def bind(self, heads: int, d_in: int, d_out: int) -> None:
        if self.residual and d_in != d_out:
            raise SpecError([Issue(
                "structure.residual",
                f"the residual x + MLP(x) needs Dv == Dphi, got Dv={d_out}, Dphi={d_in}",
                True,
                "set residual = false, or make the value size equal the feature-mapped key size",
            )])
        super().bind(heads, d_in, d_out)
        self.hidden = max(1, int(round(self.params.expansion * d_in)))
        for name, shape in self.weight_shapes().items():
            # std 1/sqrt(fan_in): activations keep their scale through the layers, and no layer
            # starts at zero (that would zero every other layer's gradient).
            w = torch.randn(heads, *shape) / math.sqrt(shape[1])
            self.init[name] = nn.Parameter(w)

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        L, h, di, do = self.depth, self.hidden, self.d_in, self.d_out
        if L == 1:
            return {"W1": (do, di)}
        shapes = {"W1": (h, di)}
        for i in range(2, L):
            shapes[f"W{i}"] = (h, h)
        shapes[f"W{L}"] = (do, h)
        return shapes

    def init_state(self, batch: int, *, dtype: torch.dtype, device: torch.device) -> dict:
        # the offset from the learned initial weights: zero before the first token
        return {k: torch.zeros(batch, *p.shape, dtype=dtype, device=device) for k, p in self.init.items()}

    def effective(self, W: dict) -> dict:
        """The weights the memory reads with, ``W_init + W``: ``{k: [B, H, *s]}``."""
        return {k: self.init[k].to(w.dtype) + w for k, w in W.items()}

    # -- reads ----------------------------------------------------------------------------------
    rank_one_grads = True  # grad_factors / apply_layers below: core:chunkwise's dual form

    def apply_layers(self, x: torch.Tensor, linear) -> torch.Tensor:
        """The read with every matrix product delegated: ``linear(name, h)`` returns the layer
        ``name`` applied to ``h: [B, H, N, in]`` as ``[B, H, N, out]``. `read` passes a plain
        product; ``core:chunkwise``'s dual form passes a product with per-token weights.
        ``linear`` applies the fast state (the offset); the learned initial weights' part,
        ``h @ W_init^T``, is added here, so every caller reads with ``W_init + W``."""
        h = x
        for i in range(1, self.depth + 1):
            name = f"W{i}"
            h = torch.add(linear(name, h), h @ self.init[name].to(h.dtype).transpose(-1, -2))
            if i < self.depth:
                h = self.act(h)
        return x + h if self.residual else h

    def read(self, W: dict, x: torch.Tensor) -> torch.Tensor:
        # W_i: (B, H, out, in), x: (B, H, N, in) -> (B, H, N, out)
        return self.apply_layers(x, lambda name, h: h @ W[name].transpose(-1, -2))

    def read_per_token(self, Wt: dict, x: torch.Tensor) -> torch.Tensor:
        # W_i: (B, H, N, out, in), x: (B, H, N, in) -> (B, H, N, out)
        return self.apply_layers(x, lambda name, h: torch.einsum("bhnoi,bhni->bhno", Wt[name], h))

    # -- inner gradients -------------------------------------------------------------------------
    def grad(self, W: dict, x: torch.Tensor, u: torch.Tensor) -> dict:
        """d/dW of ``sum_n <M(x_n), u_n>``: one VJP of the read. ``{k: [B, H, *s]}``."""
        _, pull = torch.func.vjp(lambda w: self.read(w, x), dict(W))
        return pull(u)[0]

    def grad_per_token(self, W: dict, x: torch.Tensor, u: torch.Tensor) -> dict:
        """One gradient per token, all at the same W: ``{k: [B, H, N, *s]}`` (vmap over N)."""

        def one(x1: torch.Tensor, u1: torch.Tensor) -> dict:  # x1: (B, H, Dphi), u1: (B, H, Dv)
            return self.grad(W, x1.unsqueeze(2), u1.unsqueeze(2))

        return torch.func.vmap(one, in_dims=(2, 2), out_dims=2)(x, u)

    def grad_factors(self, W: dict, x: torch.Tensor, u) -> dict:
        """Token n's gradient of ``<M(x_n), u_n>`` w.r.t. each layer is rank one,
        ``delta_n z_n^T`` (z: the layer's input, delta: the derivative at its output), so
        ``grad_per_token(W, x, u)[k][:, :, n] == delta[:, :, n, :, None] * z[:, :, n, None, :]``.
        ``u`` is ``[B, H, N, Dv]``, or a function of the prediction ``M(x)`` that returns it (the
        bias's error: then the forward that gives the prediction is the one backpropagated).
        Returns ``{k: (delta [B, H, N, out], z [B, H, N, in])}`` — backpropagation by hand, the
        activation's derivative through ``torch.func.vjp`` (so it stays twice differentiable)."""
        zs, pre = [], []
        h = x
        W = self.effective(W)
        for i in range(1, self.depth + 1):
            zs.append(h)
            h = h @ W[f"W{i}"].transpose(-1, -2)
            pre.append(h)
            if i < self.depth:
                h = self.act(h)
        if callable(u):
            u = u(x + h if self.residual else h)
        delta, out = u, {}
        for i in range(self.depth, 0, -1):
            out[f"W{i}"] = (delta, zs[i - 1])
            if i > 1:
                _, pull = torch.func.vjp(self.act, pre[i - 2])
                delta = pull(delta @ W[f"W{i}"])[0]
        return out

    def extra_repr(self) -> str:
        p = self.params
        return (f"depth={p.depth}, expansion={p.expansion}, activation={p.activation!r}, "
                f"residual={p.residual}, hidden={self.hidden}")


def build(params: MLPParams | None, ctx) -> MLPMemory:
    return MLPMemory(params)
