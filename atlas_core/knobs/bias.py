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

The per-token weight ``gamma_i`` is what `weight` returns from the call's gates: the gate
``gamma`` for a gated Omega window, any declared gate for a plugin bias (a bias whose loss is
scaled per token by its own gate ``beta`` returns ``gates["beta"]``), None for 1. Every strategy
multiplies token i's error by it (and carries it in ``"window.gamma"``).

A bias that declares ``weight_reads_key = True`` also receives the token's feature-mapped key,
``weight(gates, like, key=phi(k))`` with ``key: [B, T, H, Dphi]``: a step normalised by the key
(Longhorn, NLMS: ``gamma_t = 1 / (1 + theta_t |phi(k_t)|^2)``) is a per-token weight like any
other, so every strategy that runs the bias's error runs it.
"""

from __future__ import annotations

import torch

from .gates import GAMMA, Gate


class Bias:
    """Base class of attentional biases."""

    window: int = 1
    #: The per-token weight is the gate ``gamma`` (an Omega window with ``gamma = "gate"``).
    gamma_gate: bool = False
    #: ``error`` does not depend on the prediction (Hebbian): the memory does not enter g.
    prediction_free: bool = False
    #: Which closed form ``error`` has, for the strategies and kernels that special-case it:
    #: ``"l2"`` (``pred - v``), ``"dot"`` (``-v``) or None (any other). A subclass that
    #: overrides ``error`` must declare its own (None unless it keeps one of these forms).
    error_kind: str | None = None
    #: `weight` reads the token's feature-mapped key as well as the gates: the rule calls
    #: ``weight(gates, like, key=phi(k))`` (``[B, T, H, Dphi]``) instead of ``weight(gates, like)``.
    weight_reads_key: bool = False

    @property
    def gates(self) -> tuple[Gate, ...]:
        """The gates `weight` reads (docs/plugins.md#gates): ``gamma`` when `gamma_gate` is
        set. A bias with its own gates overrides this (a class attribute is fine)."""
        return (GAMMA,) if self.gamma_gate else ()

    @property
    def gate_names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.gates)

    def weight(self, gates: dict, like: torch.Tensor, key: torch.Tensor | None = None) -> torch.Tensor | None:
        """The per-token weight of the token's loss, ``[B, T, H]``, from the call's ``gates``
        (name -> ``[B, T, H]``, or ``[B, T, H, Dk]`` for a key gate; compute dtype); ``like`` is a
        ``[B, T, H]`` tensor of ones. ``key`` is the feature-mapped key ``[B, T, H, Dphi]`` when
        the bias declares ``weight_reads_key`` (and is not passed otherwise). None means 1 for
        every token."""
        return gates["gamma"] if self.gamma_gate else None

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

    def check_composition(self, rule) -> list[str]:
        """Problems with the composition this knob is placed in (a list of messages; empty
        when it fits). Called once, when the rule is built."""
        return []
