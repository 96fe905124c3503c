"""``omega:window``: the Omega rule's context-window attentional bias (Atlas Eq 9).

For an inner bias ``l_i(M)`` (``core:l2`` by default) the loss minimised at token t is

    L_t(M) = sum_{i=max(1, t-c+1)}^{t}  gamma_i * lag[t - i] * l_i(M)

with every one of the c terms evaluated at the SAME memory, the one being updated (``M_{t-1}``
under ``core:sequential``, the chunk's anchor under ``core:chunkwise``). Its gradient for linear
memory is ``sum_i gamma_i lag[t-i] e_i phi(k_i)^T`` with ``e_i`` the inner bias's error derivative
(``M phi(k_i) - v_i`` for l2). The per-token gate ``gamma_i`` is the seeds' U.

Weighting (the ``gamma`` parameter):
- ``"gate"``:    ``gamma_i`` is the per-token gate ``gates["gamma"]: [B, T, H]`` (Atlas'
  input-dependent gamma, seed 000's U); ``lag = 1``;
- ``"uniform"``: ``gamma_i = 1`` and ``lag = 1/c`` for every position: the window's *mean* loss
  (the Atlas spec seed's "uniform 1/c"). The step size then does not grow with c, so the same
  learning-rate gate ``theta`` suits every window size; c = 1 is the plain bias. At the start of a
  sequence the window holds fewer than c tokens and each still weighs 1/c (no renormalisation);
- ``"decay"``:   ``gamma_i = 1`` and ``lag[j] = decay**j`` (recent tokens weigh more; the current
  token weighs 1). With ``decay = 1`` this is the window's *sum*.

This module only describes the loss. The window itself is run by the core strategies through the
generic `atlas_core.knobs.Bias` contract (``window``, ``weight``, ``lag_weights``): the rule's
state carries the last c - 1 ``(phi(k), v, gamma)`` (``"window.k": [B, H, c-1, Dphi]``,
``"window.v": [B, H, c-1, Dv]``, ``"window.gamma": [B, H, c-1]``) — a ring buffer of *inputs*, so
the window crosses chunk and call boundaries and two calls with the carried state equal one call.
(Seed 000 instead buffers stale per-token gradients, each taken at an older memory: a different
rule.) ``core:chunkwise`` uses a banded ``[C, C + c - 1]`` window matrix inside each chunk.

Tensor arguments of `error` / `loss` (forwarded to the inner bias): ``pred, v: [..., Dv]``.
Declared traits forwarded from the inner bias: its gates (plus ``gamma`` with ``gamma = "gate"``),
its per-token `weight` (times ``gamma``; handed the key when the inner bias declares
``weight_reads_key``), ``error_kind`` and ``prediction_free``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from atlas_core.params import size_field

from atlas_core.errors import Issue, SpecError
from atlas_core.host.registry import Params
from atlas_core.knobs.bias import Bias
from atlas_core.knobs.gates import GAMMA, Gate

DEFAULT_DECAY = 0.9
GammaMode = Literal["gate", "uniform", "decay"]


class WindowParams(Params):
    """Parameters of ``omega:window``."""

    window: int = size_field(8, "window", ge=1, description="c: how many recent tokens the loss covers (c >= 1)")
    inner: str | dict[str, Any] = Field(
        "core:l2", description="the per-token bias l_i: a bias name or {use = ..., ...params}"
    )
    gamma: GammaMode = Field(
        "uniform",
        description="'gate' (per-token gate gates['gamma']), 'uniform' (1/c each) or 'decay' "
        "(decay**(t-i))",
    )
    decay: float = Field(
        DEFAULT_DECAY, gt=0.0, le=1.0, description="factor per step back, used when gamma='decay'"
    )

    @model_validator(mode="after")
    def _decay_needs_decay_mode(self) -> "WindowParams":
        # A decay factor given with another mode would be silently ignored. The default value is
        # accepted so that a resolved spec (every default written out) validates again.
        if self.gamma != "decay" and self.decay != DEFAULT_DECAY:
            raise ValueError(
                f"decay={self.decay} is only used with gamma='decay' (got gamma={self.gamma!r}); "
                "set gamma = 'decay' or remove decay"
            )
        return self


class OmegaWindow(Bias):
    """The Omega context-window bias around an inner per-token bias."""

    def __init__(self, inner: Bias, window: int = 8, gamma: str = "uniform",
                 decay: float = DEFAULT_DECAY) -> None:
        if window < 1:
            raise ValueError(f"window={window} must be >= 1")
        if gamma not in ("gate", "uniform", "decay"):
            raise ValueError(f"gamma={gamma!r} must be 'gate', 'uniform' or 'decay'")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay={decay} must be in (0, 1]")
        self.inner = inner
        self.window = int(window)
        self.mode = gamma
        self.decay = float(decay)
        self.gamma_gate = gamma == "gate"
        self.prediction_free = bool(inner.prediction_free)
        self.error_kind = inner.error_kind  # the error is the inner bias's
        self.weight_reads_key = bool(inner.weight_reads_key)  # its weight may read the key

    @property
    def gates(self) -> tuple[Gate, ...]:
        return tuple(self.inner.gates) + ((GAMMA,) if self.gamma_gate else ())

    def weight(self, gates: dict, like: torch.Tensor, key: torch.Tensor | None = None) -> torch.Tensor | None:
        """The inner bias's per-token weight times ``gamma`` (with ``gamma = "gate"``); ``key``
        (``[B, T, H, Dphi]``) is handed on when the inner bias reads it."""
        w = self.inner.weight(gates, like, key=key) if self.weight_reads_key else self.inner.weight(gates, like)
        if self.gamma_gate:
            return gates["gamma"] if w is None else w * gates["gamma"]
        return w

    # -- the loss, by delegation ------------------------------------------------------------------
    def error(self, pred: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.inner.error(pred, v)

    def loss(self, pred: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.inner.loss(pred, v)

    def check_composition(self, rule) -> list[str]:
        return list(self.inner.check_composition(rule) or [])

    # -- the window -------------------------------------------------------------------------------
    def lag_weights(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """``[c]`` weights by distance back (index 0 = the current token)."""
        c = self.window
        if self.mode == "uniform":
            return torch.full((c,), 1.0 / c, dtype=dtype, device=device)
        if self.mode == "decay":
            return self.decay ** torch.arange(c, dtype=dtype, device=device)
        return torch.ones(c, dtype=dtype, device=device)

    def describe(self) -> str:
        extra = f", decay={self.decay}" if self.mode == "decay" else ""
        inner = self.inner.describe()
        return f"OmegaWindow(window={self.window}, gamma={self.mode!r}{extra}, inner={inner})"


def build(params: WindowParams | None, ctx) -> OmegaWindow:
    params = params or WindowParams()
    path = f"{ctx.path}.inner" if ctx.path else "inner"
    inner = ctx.build("bias", params.inner, path)
    if inner.window != 1 or inner.gamma_gate:
        raise SpecError([Issue(
            path, "the inner bias of an Omega window must be a per-token bias (window 1, no gamma "
            "gate)", params.inner, "set the window size on the outer omega:window instead",
        )])
    return OmegaWindow(inner, params.window, params.gamma, params.decay)
