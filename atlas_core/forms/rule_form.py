"""`RuleForm`: what a rule is, as every strategy, kernel backend, context parallelism and the
conformance kit need to know it, decided once when the rule is built (``rule.form``).

A knob declares its traits (``Structure.is_linear``, ``Algorithm.linear_form``,
``Retention.alpha_shape``, ``Bias.error_kind``, ...; docs/plugins.md); `RuleForm.of` reads them
once and answers the questions the consumers ask, so that two consumers never answer one question
two ways:

- the memory: linear in its weights (``memory_linear``), the one matrix ``M`` (``matrix_memory``),
  rank-one per-token gradients for the dual form (``rank_one_grads``);
- the update: its closed linear form (``update``: ``"gd"``, ``"momentum"`` or None), its
  optimiser state (``opt_keys``), whether the algorithm has a chunk form (``algorithm_chunk``);
- the retention: linear (``retention_linear``: identity pre/post, what the kit checks), its shape
  (``retention_shape``: ``"head"`` or ``"key"``), a per-token transition of its own
  (``per_token_transition``), where the gradient is taken (``gradient_at``);
- the bias: its error (``error``: ``"l2"``, ``"dot"`` or None), prediction-free, its window;
- the rule: anchor, steps per token, read convention;
- the gates by role (`gate`): ``"step_size"`` (theta), ``"momentum"`` (eta), ``"retention"``
  (alpha), ``"weight"`` (gamma), ``"transition"`` — each gate's role is declared where the gate
  is (`atlas_core.knobs.Gate`);
- the chunk forms that compute the rule exactly (``chunk_forms``: the forms of
  `atlas_core.forms.catalogue` whose requirement the form meets).

The form is a frozen value: two rules with equal forms get the same decision from every consumer.
``names`` (the knobs' spec names, for messages) is not part of that equality.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .catalogue import CATALOGUE, chunk_forms

#: the chunk computations a form may have (``RuleForm.chunk_forms``), name -> what it computes;
#: each states its requirement once in `atlas_core.forms.catalogue`
CHUNK_FORMS = {c.name: c.summary for c in CATALOGUE}

KNOBS = ("structure", "bias", "retention", "algorithm", "feature_map")


@dataclass(frozen=True)
class RuleForm:
    """See the module docstring. The defaults are a standalone rule's form (``composed =
    False``: no knob traits; only its own strategies run it)."""

    composed: bool = False
    # -- the memory
    memory_linear: bool = False
    matrix_memory: bool = False
    rank_one_grads: bool = False
    # -- the update
    update: str | None = None
    opt_keys: tuple[str, ...] = ()
    algorithm_chunk: bool = False
    algorithm_factors: bool = False
    algorithm_type: type | None = None
    chunk_hint: str = ""
    # -- the retention
    retention_linear: bool = True
    retention_shape: str = "head"
    retention_gated: bool = False
    #: the names of the retention's own gates (its retain factor's, or its transition's)
    retention_gates: tuple[str, ...] = ()
    per_token_transition: bool = False
    gradient_at: str = "current"
    # -- the bias
    error: str | None = None
    prediction_free: bool = False
    window: int = 1
    # -- the rule
    anchor: int = 1
    steps_per_token: int = 1
    read: str = "after"
    #: ``(role, gate name)`` for every gate with a role, in the rule's gate order
    gates: tuple[tuple[str, str], ...] = ()
    chunk_forms: frozenset[str] = frozenset()
    #: the knobs' names in the rule's spec, for messages (not part of the form's identity)
    names: tuple[tuple[str, Any], ...] = field(default=(), compare=False)

    # -- questions ------------------------------------------------------------------------------
    def gate(self, role: str) -> str | None:
        """The name of the rule's gate with ``role`` (the first, when several share it), or None."""
        return next((n for r, n in self.gates if r == role), None)

    def name(self, knob: str) -> Any:
        """The spec value of ``knob`` (``"retention"``, ...), for messages; None when unknown."""
        return dict(self.names).get(knob)

    @property
    def momentum(self) -> bool:
        return self.update == "momentum"

    @property
    def anchored(self) -> bool:
        return self.anchor > 1

    @property
    def windowed(self) -> bool:
        return self.window > 1

    @property
    def reading_substep(self) -> int:
        """The sub-step (of ``steps_per_token``) whose read is the token's output: the last for
        ``read = "after"``, the first for ``"before"``."""
        return self.steps_per_token - 1 if self.read == "after" else 0

    @property
    def anchor_free(self) -> bool:
        """Anchoring cannot change the rule: a linear memory whose error ignores the prediction
        (``core:dot``), so every gradient ``u phi^T`` is the same at any memory."""
        return self.prediction_free and self.memory_linear

    # -- building -------------------------------------------------------------------------------
    @classmethod
    def of(cls, rule) -> "RuleForm":
        """The form of a knob-composed rule (`atlas_core.rule.ComposedRule`), from its knobs'
        declarations; a standalone rule's form is ``RuleForm()``."""
        if not getattr(rule, "composed", False):
            return cls()
        from ..knobs.algorithm import Algorithm
        from ..knobs.gates import declared_gates

        S, bias, ret, alg = rule.structure, rule.bias, rule.retention, rule.algorithm
        weights = tuple(S.weight_shapes())
        gates = tuple((g.role, g.name) for g in rule.gates if g.role)
        roles = {r for r, _ in gates}
        update = alg.linear_form if alg.linear_form in ("gd", "momentum") else None
        # a closed linear form is read by the role of its gates: without them it is not usable
        if update and ("step_size" not in roles or (update == "momentum" and "momentum" not in roles)):
            update = None
        import torch

        kind = bias.error_kind
        form = cls(
            composed=True,
            memory_linear=bool(S.is_linear),
            matrix_memory=bool(S.is_linear) and weights == ("M",),
            rank_one_grads=bool(S.rank_one_grads),
            update=update,
            opt_keys=tuple(sorted(alg.init_opt({k: torch.empty(0) for k in weights}))),
            algorithm_chunk=type(alg).chunk is not Algorithm.chunk,
            algorithm_factors=hasattr(alg, "chunk_factors"),
            algorithm_type=type(alg),
            chunk_hint=str(alg.chunk_hint or ""),
            retention_linear=bool(ret.linear),
            retention_shape=ret.alpha_shape,
            retention_gated=bool(declared_gates(ret)) or bool(ret.fixed_alpha),
            retention_gates=tuple(g.name for g in declared_gates(ret)),
            per_token_transition=bool(ret.per_token_transition),
            gradient_at=ret.gradient_at,
            error=kind if kind in ("l2", "dot") else None,
            prediction_free=bool(bias.prediction_free),
            window=int(bias.window),
            anchor=int(rule.anchor),
            steps_per_token=int(rule.steps_per_token),
            read=rule.read,
            gates=gates,
            names=tuple((k, rule.spec.get(k)) for k in KNOBS),
        )
        return replace(form, chunk_forms=chunk_forms(form))
