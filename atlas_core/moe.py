"""A routed-expert MLP (``[model.moe]``): top-k routing over SwiGLU experts, with a gated shared
expert, as Qwen3-Next's sparse MoE block computes it (transformers' ``Qwen3NextSparseMoeBlock``).

For a token ``x: [d]`` with E experts, k chosen per token::

    p      = softmax(W_r x)                      # router probabilities, float32: [E]
    top    = the k largest p_e (ties: the lower index), w_e = p_e (/ sum of the k with norm_topk)
    y      = sum_{e in top} w_e * W_d,e (silu(W_g,e x) * W_u,e x)
    y     += sigmoid(w_s . x) * SwiGLU_shared(x)  # with a shared expert (shared_gate: the gate)

Parameters: ``router`` ``[E, d]``; ``gate_up`` ``[E, 2 I, d]`` (each expert's gate rows, then its
up rows); ``down`` ``[E, d, I]``; ``shared`` (a `SwiGLU` of ``shared_hidden``) and ``shared_gate``
``[1, d]``. Every token runs through its k experts only (the loop visits the experts that some
token chose).

With ``aux_loss = c > 0`` training adds ``c`` times the load-balancing loss of the Switch
Transformer (Fedus et al., 2021, eqs. 4-6) as transformers computes it for Qwen3-Next, pooled over
every routed block of a forward pass: with ``n_e`` the top-k assignments to expert e and ``P_e``
its summed router probability over all the blocks' rows (R rows in all),
``E * sum_e (n_e / R) (P_e / R)``; k when the assignments and probabilities are uniform
(`balance_loss`). The blocks keep the statistics of their last training forward
(`SparseMoE.balance`); `take_balance_loss` reads and clears them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from .mlp import SwiGLU
from .params import Params, size_field


class MoEParams(Params):
    """``[model.moe]``: routed experts in place of the dense MLP of the blocks listed in ``blocks``."""

    experts: int = size_field(..., "heads", ge=1, description="number of routed experts (E)")
    top_k: int = size_field(..., "heads", ge=1, description="experts each token is routed to (k <= E)")
    hidden: int = size_field(..., "width", ge=1, description="each expert's SwiGLU hidden size")
    shared_hidden: int = size_field(0, "width", ge=0, description="the shared expert's hidden size "
                                    "(0: no shared expert)")
    shared_gate: bool = Field(True, description="the shared expert's output is scaled by sigmoid(w . x)")
    norm_topk: bool = Field(True, description="renormalise the k chosen probabilities to sum to 1")
    blocks: list[int] | None = Field(None, description="block numbers (1-based) whose MLP is routed; "
                                     "absent = every block")
    aux_loss: float = Field(0.0, ge=0.0, description="coefficient of the load-balancing loss added "
                            "to the training loss (0: none; transformers' Qwen3-Next uses 0.001 "
                            "when it outputs router logits)")

    @model_validator(mode="after")
    def _top_k(self) -> "MoEParams":  # a spec error, not a ValueError when the model is built
        if self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} exceeds experts={self.experts}")
        return self


class SparseMoE(nn.Module):
    """Top-k routed SwiGLU experts plus an optional gated shared expert: ``[B, T, d] -> [B, T, d]``."""

    def __init__(self, d_model: int, p: MoEParams) -> None:
        super().__init__()
        if p.top_k > p.experts:
            raise ValueError(f"top_k={p.top_k} exceeds experts={p.experts}")
        E, I = p.experts, p.hidden
        self.top_k, self.norm_topk, self.hidden = p.top_k, p.norm_topk, I
        self.aux_loss = p.aux_loss
        #: (assignments per expert, summed router probabilities, rows) of the last training forward
        #: when ``aux_loss > 0``: read and cleared by `take_balance_loss`
        self.balance: tuple[torch.Tensor, torch.Tensor, int] | None = None
        self.router = nn.Parameter(torch.empty(E, d_model).normal_(0.0, 0.02))
        self.gate_up = nn.Parameter(torch.empty(E, 2 * I, d_model).normal_(0.0, d_model ** -0.5))
        self.down = nn.Parameter(torch.empty(E, d_model, I).normal_(0.0, I ** -0.5))
        if p.shared_hidden:
            self.shared = SwiGLU(d_model, p.shared_hidden)
            if p.shared_gate:
                self.shared_gate = nn.Linear(d_model, 1, bias=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x: [N, d]`` -> (weights ``[N, k]`` in x's dtype, expert indices ``[N, k]``)."""
        probs = F.softmax(F.linear(x, self.router), dim=-1, dtype=torch.float)
        weights, index = torch.topk(probs, self.top_k, dim=-1)
        if self.training and self.aux_loss > 0:
            counts = torch.zeros_like(probs[0]).index_add_(0, index.flatten(), torch.ones_like(weights).flatten())
            self.balance = (counts, probs.sum(0), probs.shape[0])
        if self.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # (N, d)
        weights, index = self.route(flat)
        out = torch.zeros_like(flat)
        for e in torch.unique(index).tolist():  # the experts some token chose
            token, slot = torch.where(index == e)
            h = F.linear(flat[token], self.gate_up[e])
            g, u = h.chunk(2, dim=-1)
            y = F.linear(F.silu(g) * u, self.down[e]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        if hasattr(self, "shared"):
            s = self.shared(flat)
            if hasattr(self, "shared_gate"):
                s = torch.sigmoid(self.shared_gate(flat)) * s
            out = out + s
        return out.reshape(shape)


def balance_loss(stats: list[tuple[torch.Tensor, torch.Tensor, int]]) -> torch.Tensor:
    """The load-balancing loss pooled over blocks' ``(assignments, summed probabilities, rows)``
    (module docstring): ``E * sum_e (n_e / R) (P_e / R)``."""
    counts = sum(s[0] for s in stats)
    probs = sum(s[1] for s in stats)
    rows = sum(s[2] for s in stats)
    return counts.numel() * torch.sum(counts * probs) / (rows * rows)


def take_balance_loss(model: nn.Module) -> torch.Tensor | None:
    """``aux_loss`` times the load-balancing loss of ``model``'s last training forward, its
    routed blocks' statistics cleared; None where no block recorded any."""
    blocks = [m for m in model.modules() if isinstance(m, SparseMoE) and m.balance is not None]
    if not blocks:
        return None
    loss = blocks[0].aux_loss * balance_loss([m.balance for m in blocks])
    for m in blocks:
        m.balance = None
    return loss


__all__ = ["MoEParams", "SparseMoE", "balance_loss", "take_balance_loss"]
