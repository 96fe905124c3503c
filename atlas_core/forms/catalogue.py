"""The chunk-form catalogue: each chunk computation states, once, what it needs of a rule.

A chunk form is a computation in `atlas_core.forms` that runs a knob-composed rule chunk by
chunk **exactly** (equal to ``core:sequential`` up to rounding). Each `ChunkForm` here carries
one requirement: a function of the rule's form (`atlas_core.forms.RuleForm`) that returns None
when the form computes the rule, else the reason it does not, in words a user can act on.
``RuleForm.chunk_forms`` is the set of forms whose requirement holds, and every consumer that
decides from the form asks this module rather than restating the conditions:

- ``core:exact_chunk`` (`exact_reason`): the per-token forms ``exact_chunk`` / ``key_decay_chunk``;
- ``core:chunkwise`` and the strategies that subclass it (`chunkwise_reason`): the anchored forms
  (`ANCHORED`) and the chunk grid (`chunk_grid_reason`: a chunk lies inside one anchor block);
- the fused kernel of the linear form (``cuda:chunk_linear``, `linear_kernel_reason`);
- context parallelism: whether the update is affine in the memory (`affine_reason`) and which
  slice map has a closed form (`slice_map_form`).

A consumer keeps its own conditions that are not about the rule (a device, a dtype, a head size,
a call that does not cover whole anchor blocks) where they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

#: the largest default chunk of an anchored rule: the largest divisor of the anchor up to this
MAX_DEFAULT_CHUNK = 64


@dataclass(frozen=True)
class ChunkForm:
    """One chunk computation: its name (as in ``RuleForm.chunk_forms``), what it computes, and
    ``requires(form) -> None | reason``."""

    name: str
    summary: str
    requires: Callable[[Any], str | None]


def _name(value: Any) -> Any:
    """A knob's spec value for a message: its registered name when it has one."""
    if isinstance(value, Mapping) and "use" in value:
        return value["use"]
    return value


def _knob(f, knob: str) -> str:
    return f"{knob} {f.name(knob)!r}"


# -- shared requirements ----------------------------------------------------------------------------
def _composed(f) -> str | None:
    if not f.composed:
        return "the rule is standalone (not composed from knobs): no chunk form computes it"
    return None


def _no_transition(f) -> str | None:
    if f.per_token_transition:
        return (f"{_knob(f, 'retention')} multiplies the memory by a per-token matrix (a transition "
                "such as RWKV-7's diagonal-plus-low-rank one), which has no chunked form here; "
                "core:sequential runs it")
    return None


def _linear_retention(f) -> str | None:
    why = _no_transition(f)
    if why is None and not f.retention_linear:
        why = (f"{_knob(f, 'retention')} is nonlinear: not a linear retention, not a scalar decay "
               "(it transforms the memory after each step), so a chunk cannot be solved as a "
               "linear recurrence")
    return why


def _per_token(f) -> str | None:
    if f.anchored:
        return (f"the rule is anchored (anchor = {f.anchor}: every gradient of a block is taken at "
                "the block's start memory); the exact per-token forms run anchor = 1 "
                "— run anchored rules with core:chunkwise")
    return None


def _matrix_update(f) -> str | None:
    """The one matrix M with gd or momentum (whose state is Z.M)."""
    if not f.matrix_memory:
        return (f"{_knob(f, 'structure')} is not a linear matrix memory; the WY form needs every "
                "step to be affine in M (use core:chunkwise or core:sequential)")
    if f.update is None:
        return (f"{_knob(f, 'algorithm')} is neither core:gd nor core:momentum: its step is not a "
                "linear recurrence in the gradient (use core:sequential)")
    if f.momentum and f.opt_keys != ("Z.M",):
        return f"{_knob(f, 'algorithm')} keeps state {list(f.opt_keys)}, not Z.M"
    return None


def _at_anchor(f) -> str | None:
    """An anchored form takes a chunk's gradients at the block's anchor memory."""
    if f.gradient_at != "current" and not (f.anchor == 1 and f.anchor_free):
        return (f"{_knob(f, 'retention')} takes each gradient at that token's decayed memory, "
                "which no chunk anchor shares; core:exact_chunk runs it exactly where it can "
                "(gd, l2), else core:sequential")
    return None


def _head_decay(f, form: str) -> str | None:
    if f.retention_shape != "head":
        return (f"{_knob(f, 'retention')} retains per key dimension; the chunk form here decays "
                "per key only for core:gd on a linear memory with a one-token window "
                f"(key_linear_chunk; {form} decays per head; core:sequential runs the rest)")
    return None


def _first(*checks) -> str | None:
    for check in checks:
        why = check()
        if why is not None:
            return why
    return None


# -- the forms ----------------------------------------------------------------------------------------
def exact_chunk(f) -> str | None:
    """The per-token delta rule by the UT / WY transform (`forms.exact_chunk`)."""
    return _first(
        lambda: _composed(f), lambda: _per_token(f), lambda: _matrix_update(f),
        lambda: None if f.retention_shape == "head" else (
            f"{_knob(f, 'retention')} decays per key dimension; the WY form decays per head "
            "(the per-key form is key_decay_chunk: core:gd, a one-token window)"),
        lambda: None if f.error == "l2" else (
            f"{_knob(f, 'bias')} is not the l2 (delta-rule) bias, alone or in an Omega window: the "
            "exact form needs an error linear in the memory, M k - v (use core:chunkwise or "
            "core:sequential)"),
        lambda: None if f.gradient_at == "current" or (f.update == "gd" and not f.windowed) else (
            f"{_knob(f, 'retention')} takes the gradient at the decayed memory: the exact form "
            "is implemented for gd with a one-token window only"),
        lambda: _linear_retention(f))


def key_decay_chunk(f) -> str | None:
    """Per-key decay, or the dot error, with gd and a one-token window (`forms.key_decay_chunk`)."""
    return _first(
        lambda: _composed(f), lambda: _per_token(f), lambda: _matrix_update(f),
        lambda: None if f.update == "gd" and not f.windowed and f.error in ("l2", "dot") else (
            f"{_knob(f, 'retention')} / {_knob(f, 'bias')}: the exact per-key-decay form (and the "
            "dot bias's) is implemented for core:gd with the l2 or dot bias and a one-token "
            "window (use core:sequential)"),
        lambda: None if f.retention_shape == "key" or f.error == "dot" else (
            f"{_knob(f, 'retention')} decays per head and {_knob(f, 'bias')} is not core:dot: the "
            "per-key form serves a per-key decay or the dot bias (the per-head delta rule: "
            "exact_chunk)"),
        lambda: _linear_retention(f))


def dot_chunk(f) -> str | None:
    """A prediction-free error on a linear memory: every chunk at once (`forms.dot_chunk`)."""
    return _first(
        lambda: _composed(f), lambda: _linear_retention(f),
        lambda: None if f.memory_linear and f.prediction_free else (
            f"{_knob(f, 'bias')} on {_knob(f, 'structure')}: the all-chunks form needs a "
            "prediction-free error on a linear memory"),
        lambda: None if f.update == "gd" and not f.windowed else (
            "the all-chunks form runs core:gd with a one-token window"),
        lambda: None if f.retention_shape == "head" and f.gradient_at == "current" else (
            f"{_knob(f, 'retention')}: the all-chunks form decays per head at the current point"),
        lambda: None if f.anchor == 1 else "the all-chunks form runs anchor = 1")


def linear_chunk(f) -> str | None:
    """gd or momentum on a linear memory: the anchored chunk's attention form
    (`forms.linear_scan`)."""
    return _first(
        lambda: _composed(f), lambda: _linear_retention(f),
        lambda: None if f.memory_linear else (
            f"{_knob(f, 'structure')} is not linear in its weights (the attention form needs "
            "M_t as a sum of rank-one writes)"),
        lambda: None if f.update is not None else (
            f"{_knob(f, 'algorithm')} is not gd or momentum (no closed linear form)"),
        lambda: _head_decay(f, "linear_chunk"), lambda: _at_anchor(f))


def key_linear_chunk(f) -> str | None:
    """The attention form with a per-key retain factor (GLA; `anchored_chunk.key_linear_chunk`)."""
    return _first(
        lambda: _composed(f), lambda: _linear_retention(f),
        lambda: None if f.retention_shape == "key" else (
            f"{_knob(f, 'retention')} decays per head (the per-key form: a per-key retain factor)"),
        lambda: None if f.memory_linear and f.update == "gd" and not f.windowed else (
            f"{_knob(f, 'retention')} retains per key dimension; the chunk form here decays per "
            "key only for core:gd on a linear memory with a one-token window (core:sequential "
            "runs the rest)"),
        lambda: _at_anchor(f))


def dual_chunk(f) -> str | None:
    """gd or momentum on a structure with rank-one per-token gradients: the dual form
    (`anchored_chunk.dual_chunk`)."""
    return _first(
        lambda: _composed(f), lambda: _linear_retention(f),
        lambda: None if f.rank_one_grads else (
            f"{_knob(f, 'structure')} gives no rank-one per-token gradients"),
        lambda: None if f.update is not None else (
            f"{_knob(f, 'algorithm')} is not gd or momentum (no closed linear form)"),
        lambda: _head_decay(f, "dual_chunk"), lambda: _at_anchor(f))


def _algorithm_chunk(f) -> str | None:
    if not f.algorithm_chunk:
        hint = f.chunk_hint
        return f"{_knob(f, 'algorithm')} has no chunk form" + (f"; {hint}" if hint else "")
    return None


def generic_chunk(f) -> str | None:
    """The algorithm's own chunk recurrence over per-token anchored gradients
    (`anchored_chunk.generic_chunk`)."""
    return _first(
        lambda: _composed(f), lambda: _linear_retention(f),
        lambda: _head_decay(f, "generic_chunk"), lambda: _algorithm_chunk(f), lambda: _at_anchor(f))


def stepped_chunk(f) -> str | None:
    """A nonlinear retention: a chunk's gradients all at the anchor memory, formed at once, then
    the algorithm's step with the retention's pre / post token by token between them
    (`anchored_chunk.stepped_chunk`)."""
    return _first(
        lambda: _composed(f), lambda: _no_transition(f),
        lambda: None if not f.retention_linear else (
            f"{_knob(f, 'retention')} is linear: its chunks are solved in closed form (the linear, "
            "dual or generic chunk forms), not stepped"),
        lambda: None if f.retention_shape == "head" else (
            f"{_knob(f, 'retention')} retains per key dimension; the stepped form applies a "
            "nonlinear retention per head"),
        lambda: _at_anchor(f))


CATALOGUE: tuple[ChunkForm, ...] = (
    ChunkForm("exact_chunk", "the per-token delta rule (l2 error, scalar decay, gd or momentum, any "
              "window) exact for any chunk size by the UT / WY transform (core:exact_chunk)", exact_chunk),
    ChunkForm("key_decay_chunk", "per-key decay or the dot error with gd and a one-token window, "
              "exact for any chunk size (forms/key_decay_chunk.py)", key_decay_chunk),
    ChunkForm("dot_chunk", "a prediction-free error on a linear memory with gd, scalar decay at "
              "the current point and a one-token window: every chunk at once (forms/dot_chunk.py)",
              dot_chunk),
    ChunkForm("linear_chunk", "gd or momentum on a linear memory, per-head decay: the anchored "
              "chunk's attention form (forms/linear_scan.py)", linear_chunk),
    ChunkForm("key_linear_chunk", "gd on a linear memory with a per-key retain factor and a "
              "one-token window: the anchored attention form decayed per key", key_linear_chunk),
    ChunkForm("dual_chunk", "gd or momentum on a structure with rank-one gradients: the dual form",
              dual_chunk),
    ChunkForm("generic_chunk", "the algorithm's own chunk recurrence over per-token anchored "
              "gradients", generic_chunk),
    ChunkForm("stepped_chunk", "a nonlinear retention: anchored gradients formed at once, then the "
              "algorithm's step with the retention token by token (state-sized elementwise work)",
              stepped_chunk),
)
FORMS: dict[str, ChunkForm] = {c.name: c for c in CATALOGUE}
#: the forms ``core:chunkwise`` runs: every gradient of a chunk at its anchor block's memory
ANCHORED = ("linear_chunk", "key_linear_chunk", "dual_chunk", "generic_chunk", "stepped_chunk")


def chunk_forms(f) -> frozenset[str]:
    """The names of the forms whose requirement ``f`` meets (``RuleForm.chunk_forms``)."""
    return frozenset(c.name for c in CATALOGUE if c.requires(f) is None)


def reason(name: str, f) -> str | None:
    """None when form ``name`` computes a rule of form ``f``, else why not."""
    return FORMS[name].requires(f)


def _holds(name: str, f) -> bool:
    return FORMS[name].requires(f) is None


def no_form_reason(f) -> str | None:
    """None when some chunk form computes the rule, else the reason of the form closest to it."""
    if any(c.requires(f) is None for c in CATALOGUE):
        return None
    return chunkwise_reason(f, 1) or reason("exact_chunk", f)


# -- what the consumers ask ---------------------------------------------------------------------------
def exact_reason(f) -> str | None:
    """``core:exact_chunk``: the per-token rule by ``exact_chunk`` or ``key_decay_chunk``."""
    if _holds("exact_chunk", f) or _holds("key_decay_chunk", f):
        return None
    per_key = f.retention_shape == "key" or f.error == "dot"
    return reason("key_decay_chunk" if per_key else "exact_chunk", f)


def largest_divisor(A: int, cap: int = MAX_DEFAULT_CHUNK) -> int:
    """The largest divisor of ``A`` up to ``cap`` (an anchored rule's default chunk)."""
    return max(d for d in range(1, min(A, cap) + 1) if A % d == 0)


def chunk_grid_reason(f, C: int | None) -> str | None:
    """Whether chunks of ``C`` tokens (None: the default) fit the rule's anchor blocks: a chunk
    lies inside one block (``anchor % C == 0``), except where anchoring changes nothing (a
    linear memory with a prediction-free error at ``anchor = 1``)."""
    A = f.anchor
    if A == 1 and f.anchor_free:
        return None
    if C is None and A == 1:
        return ("the rule is per-token (anchor = 1) and its gradients depend on the memory, so a "
                "chunk of it cannot be formed from one anchor; core:exact_chunk runs it exactly "
                "where it can, or set [memory] anchor = A for Titans' mini-batch rule")
    if C is not None and C > 1 and A % C:
        if A == 1:
            return (f"chunk_size={C} would take every gradient of a chunk at the chunk's start, "
                    f"which is another rule than this per-token one (anchor = 1); to keep that "
                    f"function write anchor = {C} in [memory], or run the per-token rule with "
                    "core:exact_chunk or core:sequential")
        return (f"chunk_size={C} does not divide the rule's anchor={A}: a chunk must lie inside "
                f"one anchor block; use a divisor of {A} (e.g. {largest_divisor(A)})")
    return None


def chunkwise_reason(f, C: int | None) -> str | None:
    """``core:chunkwise`` at chunk size ``C`` (None: its default): one of the `ANCHORED` forms,
    and the chunk grid."""
    if not any(_holds(n, f) for n in ANCHORED):
        if not f.retention_linear and not f.per_token_transition:
            return reason("stepped_chunk", f)
        return reason("key_linear_chunk" if f.retention_shape == "key" else "generic_chunk", f)
    return chunk_grid_reason(f, C)


def linear_kernel_reason(f) -> str | None:
    """A fused kernel of ``linear_chunk`` (``cuda:chunk_linear``): that form on the one matrix M,
    with the gradient at the current memory and the l2 or dot error (alone or inside an Omega
    window)."""
    return _first(
        lambda: _composed(f),
        lambda: None if f.matrix_memory else f"{_knob(f, 'structure')} is not the linear matrix memory",
        lambda: reason("linear_chunk", f),
        lambda: None if f.gradient_at == "current" else (
            f"{_knob(f, 'retention')} takes the gradient at the decayed memory"),
        lambda: None if f.error is not None else (
            f"{_knob(f, 'bias')}: the kernel implements the l2 and dot errors (alone or inside an "
            "Omega window)"))


def affine_reason(f) -> str | None:
    """None when the rule's update is affine in its memory (a linear structure, gd or momentum,
    a linear retention and the l2 error, alone or inside a window), else the knob that is not."""
    def knob(name: str) -> str:
        return f"{name} {_name(f.name(name))!r}"

    if not f.composed:
        return "a standalone rule (not composed from knobs)"
    if not f.memory_linear:
        return f"{knob('structure')} (a deep memory is not affine in its weights)"
    if f.update is None:
        return knob("algorithm")
    if not f.retention_linear:
        return knob("retention")
    if f.error != "l2":
        return knob("bias")
    return None


def slice_map_form(f) -> str | None:
    """Which closed-form slice map covers the rule (`distributed.state_map`), or None:
    ``"exact"`` (the ``exact_chunk`` form), ``"key"`` (``key_decay_chunk`` with the l2 error),
    ``"anchored"`` (an anchored rule whose form a linear kernel serves, with the l2 error, one
    position a token, gd or momentum on Z.M)."""
    if not f.anchored:
        if _holds("key_decay_chunk", f) and f.error == "l2":
            return "key"
        return "exact" if _holds("exact_chunk", f) else None
    if (linear_kernel_reason(f) is None and f.error == "l2" and f.steps_per_token == 1
            and (f.update == "gd" or f.opt_keys == ("Z.M",))):
        return "anchored"
    return None
