"""Retention: how much of the old memory a step keeps (docs/math.md, knob 3).

A step computes ``raw = alpha_t * pre(M_{t-1}) + delta_t`` and ``M_t = post(raw)``, where delta is
the algorithm's update. Linear retentions (``core:none``, ``core:decay``) use identity pre/post and
are what the chunkwise forms need; nonlinear ones (e.g. a softmax/KL retention) override
`pre`/`post` and set ``linear = False``.

The retain factor is a scalar per head and token (``alpha_shape = "head"``, ``[B, T, H]``) or one
per key dimension (``alpha_shape = "key"``, ``[B, T, H, Dk]``: GLA, KDA), which acts on the
memory's key axis, ``M Diag(alpha_t)`` for ``core:linear`` (docs/math.md, "Per-key decay"). The
structure applies either (`Structure.retain`); a per-key factor needs a structure that declares
``per_key_retain``, a feature map that keeps the key dimension, and identity `pre`/`post`.
"""

from __future__ import annotations

import torch

from .gates import Gate


class Retention:
    """Base class of retentions."""

    linear: bool = True
    #: The gates `alpha` reads (docs/plugins.md#gates); ``gate_names`` follows. A retention
    #: without gates retains everything (alpha = 1; `alpha` is not called) unless it declares
    #: ``fixed_alpha``.
    gates: tuple[Gate, ...] = ()
    #: `alpha` gives a retain factor that reads no gate (e.g. RetNet's fixed per-head decay):
    #: it is called although the retention declares no gates.
    fixed_alpha: bool = False
    #: Where the algorithm's gradient is taken: ``"current"`` (at ``M_{t-1}``, Titans, MIRAS) or
    #: ``"retained"`` (at ``alpha_t M_{t-1}``, Gated DeltaNet: the memory is decayed first, then
    #: the step is taken from it; docs/math.md reduction 6). A retained point needs ``anchor = 1``.
    gradient_at: str = "current"
    #: The shape of `alpha`: ``"head"`` (``[B, T, H]``, one factor per head) or ``"key"``
    #: (``[B, T, H, Dk]``, one per key dimension of the memory).
    alpha_shape: str = "head"
    #: The retained memory is the retention's own per-token map, `transition` (RWKV-7's
    #: ``M_{t-1} (Diag(w_t) + a_t b_t^T)``), instead of ``alpha * M``: the step then adds the
    #: algorithm's update to it. Such a retention declares ``linear = False`` (no chunked form).
    per_token_transition: bool = False

    @property
    def gate_names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.gates)

    def alpha(self, gates: dict, like: torch.Tensor) -> torch.Tensor:
        """The retain factor per token, ``[B, T, H]`` (``alpha_shape = "head"``) or
        ``[B, T, H, Dk]`` (``"key"``); 1 keeps everything. From the call's ``gates`` (name ->
        ``[B, T, H]``, or ``[B, T, H, Dk]`` for a key gate); ``like`` is a ``[B, T, H]`` tensor of
        ones in the compute dtype."""
        return torch.ones_like(like)

    def transition(self, W: dict, gates: dict) -> dict:
        """The retained memory of one token (``per_token_transition``): weights ``{name: [B, H,
        *shape]}`` and the token's gates (name -> ``[B, H]``, or ``[B, H, Dk]`` for a key gate)
        -> weights of the same shapes."""
        raise NotImplementedError

    def start(self, W: dict) -> dict:
        """The memory before the first token, from the structure's initial state ``W``: the
        identity, except for a retention whose memory lives on a constraint set (the KL
        retention's simplex), which returns a point of that set."""
        return W

    def pre(self, W: dict) -> dict:
        return W

    def post(self, W: dict) -> dict:
        return W

    def check_composition(self, rule) -> list[str]:
        """Problems with the composition this knob is placed in (a list of messages; empty
        when it fits). Called once, when the rule is built. The base checks a per-key retain
        factor's requirements; a subclass that overrides this should extend
        ``super().check_composition(rule)``."""
        return per_key_problems(self, rule)


def per_key_problems(retention: Retention, rule) -> list[str]:
    """What keeps ``rule`` from running ``retention``'s per-key retain factor (empty for a
    per-head one, or when the composition fits)."""
    shape = retention.alpha_shape
    if shape == "head":
        return []
    if shape != "key":
        return [f"alpha_shape must be 'head' or 'key', got {shape!r}"]
    spec = rule.spec
    out = []
    if not rule.structure.per_key_retain:
        out.append(
            f"the retain factor is per key dimension, which structure {spec.get('structure')!r} "
            "cannot apply (it has no key axis to decay); use core:linear")
    fm = rule.feature_map
    if any(fm.out_dim(d) != d for d in (1, 2, 3, 8, 64)):
        out.append(
            f"the retain factor is per key dimension [B, T, H, Dk], but feature map "
            f"{spec.get('feature_map')!r} changes the key dimension (Dk -> Dphi); use "
            "core:identity or another map that keeps Dk")
    if (not retention.linear or type(retention).pre is not Retention.pre
            or type(retention).post is not Retention.post):
        out.append("a per-key retain factor must be a linear retention with identity pre/post")
    return out
