"""Algorithm: the inner optimiser (docs/math.md, knob 4), with ``g_t = grad L_t(M_{t-1})``.

Two entry points:
- `step` advances one token (used by ``core:sequential``);
- `chunk` advances a whole chunk from per-token gradients that were all taken at the chunk's
  anchor (used by the chunkwise strategies). The retention there is linear, so
  ``M_t = A_t M_0 + sum_{j<=t} (A_t / A_j) delta_j`` with ``A_t = prod_{m<=t} alpha_m``.

Gates arrive per (batch, head): ``[B, H]`` in `step`, ``[B, H, C]`` in `chunk`.
"""

from __future__ import annotations

import torch

from .gates import THETA, Gate


def broadcast_gate(gate: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Broadcast a [B, H] (or [B, H, C]) gate against a weight tensor."""
    return gate.reshape(gate.shape + (1,) * (like.dim() - gate.dim()))




class Algorithm:
    """Base class of inner optimisers."""

    #: The gates `step` and `chunk` read (docs/plugins.md#gates); ``gate_names`` follows.
    gates: tuple[Gate, ...] = (THETA,)
    #: The update's closed linear form, read by the fast linear-memory paths of
    #: ``core:chunkwise``, ``core:exact_chunk`` and ``cuda:chunk_linear``: ``"gd"``
    #: (``M_t = alpha_t M_{t-1} - theta_t g_t``), ``"momentum"`` (``core:momentum``'s two
    #: recurrences), or None (no such form: the strategies use `chunk` or refuse).
    linear_form: str | None = None
    #: A sentence ``core:chunkwise`` adds to its refusal when the algorithm has no `chunk`.
    chunk_hint: str = ""

    @property
    def gate_names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.gates)

    def init_opt(self, W: dict) -> dict:
        """Optimiser state for weights W (e.g. momentum ``Z`` per weight); names are prefixed
        by the rule."""
        return {}

    def step(self, W, opt, g, *, alpha, gates, retention):
        """One token: returns (W_t, opt_t). ``alpha`` is [B, H]; ``gates`` maps name -> [B, H].
        A per-key retain factor (``Retention.alpha_shape = "key"``) is applied to W by the
        structure (`Structure.retain`) before the step, which then gets ``alpha = 1``."""
        raise NotImplementedError

    def chunk(self, W0, opt0, G, *, decay, decay_from_start, gates):
        """A chunk of C tokens from anchored per-token gradients ``G {k: [B, H, C, *s]}``.

        ``decay`` is the [B, H, C, C] matrix ``L[t, j] = A_t / A_j`` (j <= t, else 0) and
        ``decay_from_start`` its companion ``A_t = prod_{m<=t} alpha_m`` ([B, H, C]); ``gates``
        holds the algorithm's own gates, ``[B, H, C]`` each.
        Returns (per-token weights ``{k: [B, H, C, *s]}``, final optimiser state)."""
        raise NotImplementedError

    def check_composition(self, rule) -> list[str]:
        """Problems with the composition this knob is placed in (a list of messages; empty
        when it fits). Called once, when the rule is built."""
        return []
