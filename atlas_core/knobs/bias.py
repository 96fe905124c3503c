"""Attentional bias: the inner loss l_t(M) of token t (docs/math.md, knob 2).

A bias is written through its derivative with respect to the prediction: with
``pred = M(phi(k_t))`` the gradient of l_t w.r.t. the memory is the structure's VJP of
``error(pred, v)``. So ``l2`` returns ``pred - v``, ``dot`` returns ``-v``.

A bias may look back over a window of ``window`` tokens (the Omega rule, Atlas Eq 9):
``L_t(M) = sum_{i=t-c+1}^{t} gamma_i * lag[t-i] * l_i(M)``, every term at the same memory.
``gamma_i`` comes from the gate ``gamma`` when `gamma_gate` is true and is 1 otherwise;
`lag_weights` gives ``lag[0..c-1]`` (index 0 is the current token). The rule's state then carries
the last c - 1 feature-mapped keys, values and gammas, so a window crosses chunk and call
boundaries. The plain biases have ``window = 1``.
"""

from __future__ import annotations

import torch


class Bias:
    """Base class of attentional biases."""

    window: int = 1
    gamma_gate: bool = False
    #: ``error`` does not depend on the prediction (Hebbian): the memory does not enter g.
    prediction_free: bool = False

    @property
    def gate_names(self) -> tuple[str, ...]:
        return ("gamma",) if self.gamma_gate else ()

    def error(self, pred: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """d l / d pred, same shape as pred (``[..., Dv]``)."""
        raise NotImplementedError

    def loss(self, pred: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """l itself, summed over the last dimension (used by tests and diagnostics)."""
        raise NotImplementedError

    def lag_weights(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """``[window]`` weights by distance back in the window (index 0 = the current token)."""
        return torch.ones(self.window, dtype=dtype, device=device)

    def describe(self) -> str:
        return type(self).__name__
