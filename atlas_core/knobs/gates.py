"""Gates: the per-token inputs a knob needs, declared by the knob (docs/plugins.md, "Gates").

A knob lists the gates it reads as ``gates: tuple[Gate, ...]`` (a class attribute, or a property
when it depends on params). The rule merges the declarations of its knobs (`merge_gates`); the
memory layer builds one learned projection per declared gate from them, so a plugin adds a gate by
declaring it, with no change to the core::

    BETA = Gate("beta", bias=0.0, summary="per-head weight of the token's loss")

    class ScaledL2(Bias):
        gates = (BETA,)

What the layer produces for a gate (``x`` the layer input, ``w``, ``b`` its projection, ``b``
initialised to ``bias`` or to ``[layer] gate_bias.<name>``)::

    gate = scale * activation(w x + b)

- ``shape = "head"``: one scalar per head, ``[B, T, H]``;
- ``shape = "key"``: one per key dimension, ``[B, T, H, Dk]``.

This module imports no torch (entry modules may name gates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable

SHAPES = ("head", "key")
ACTIVATIONS = ("sigmoid", "identity", "softplus", "tanh", "exp")
#: the values an activation can produce (before ``scale``), None for an open end: what the kit
#: tries for a gate declared without ``range`` (sigmoid reaches exactly 1.0 in float32 at 17)
ACTIVATION_RANGES = {"sigmoid": (0.0, 1.0), "tanh": (-1.0, 1.0), "softplus": (0.0, None),
                     "exp": (0.0, None)}
#: activations with both ends finite: a gate with one of them should declare its ``range``
BOUNDED_ACTIVATIONS = ("sigmoid", "tanh")
#: what a gate does in the rule, the name strategies and kernels read it by (`RuleForm.gate`):
#: the inner learning rate (theta), the momentum decay (eta), the retain factor (alpha), the
#: per-token weight of the loss (gamma), an input of a retention's own per-token transition
#: (RWKV-7's), or "" for a gate only its own knob reads
ROLES = ("step_size", "momentum", "retention", "weight", "transition", "")


@dataclass(frozen=True)
class Gate:
    """One gate a knob needs (see the module docstring).

    - ``name``: the key in ``gates={...}`` and in ``[layer] gate_bias``; a Python identifier;
    - ``shape``: ``"head"`` (``[B, T, H]``) or ``"key"`` (``[B, T, H, Dk]``);
    - ``activation``: ``"sigmoid"``, ``"identity"``, ``"softplus"``, ``"tanh"`` or ``"exp"``;
    - ``bias``: the projection's initial bias (the gate starts near ``scale * activation(bias)``);
    - ``scale``: a constant factor after the activation;
    - ``summary``: one sentence for readers (``atlas`` listings, error messages);
    - ``range``: the documented values, ``(low, high)`` with None for an open end (``(0.0, 1.0)``
      for a retain factor, ``(0.0, None)`` for a learning rate), or None when any value goes;
      the opt-in input checks (`atlas_core.input_checks`) refuse a gate outside it. The
      conformance kit tries each end; without a declared range it tries the ends the activation
      implies (`implied_range`) and warns for a bounded activation (sigmoid, tanh);
    - ``role``: what the gate is to the rule (one of `ROLES`: ``"step_size"``, ``"momentum"``,
      ``"retention"``, ``"weight"``, ``"transition"``, or ``""``). Strategies and kernels read a
      gate by its role through the rule's form (``p.gates[rule.form.gate("step_size")]``), never
      by its name. Not part of a gate's identity: two knobs sharing a gate need not both say it.
    """

    name: str
    shape: str = "head"
    activation: str = "sigmoid"
    bias: float = 0.0
    scale: float = 1.0
    summary: str = ""
    range: tuple[float | None, float | None] | None = None
    role: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"a gate's name must be an identifier, got {self.name!r}")
        if self.shape not in SHAPES:
            raise ValueError(f"gate {self.name!r}: shape must be one of {SHAPES}, got {self.shape!r}")
        if self.role not in ROLES:
            raise ValueError(f"gate {self.name!r}: role must be one of {ROLES}, got {self.role!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"gate {self.name!r}: activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        for key in ("bias", "scale"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"gate {self.name!r}: {key} must be a finite number, got {value!r}")
        if self.range is not None:
            ok = isinstance(self.range, tuple) and len(self.range) == 2 and all(
                b is None or (isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b))
                for b in self.range)
            lo, hi = self.range if ok else (None, None)
            if not ok or (lo is not None and hi is not None and lo > hi):
                raise ValueError(f"gate {self.name!r}: range must be (low, high) with numbers or None "
                                 f"and low <= high, got {self.range!r}")

    def range_text(self) -> str:
        """The range as a reader writes it: ``[0, 1]``, ``>= 0``, ``any value``."""
        lo, hi = self.range or (None, None)
        if lo is not None and hi is not None:
            return f"[{lo:g}, {hi:g}]"
        if lo is not None:
            return f">= {lo:g}"
        return f"<= {hi:g}" if hi is not None else "any value"

    def implied_range(self) -> tuple[float | None, float | None] | None:
        """The values ``scale * activation(.)`` can take (None for an open end; None for the
        identity): sigmoid [0, scale], tanh [-scale, scale], softplus and exp [0, open)."""
        ends = ACTIVATION_RANGES.get(self.activation)
        if ends is None:
            return None
        lo, hi = (None if e is None else float(e) * self.scale for e in ends)
        return (lo, hi) if self.scale >= 0 else (hi, lo)

    def tested_range(self) -> tuple[float | None, float | None] | None:
        """The declared `range`, or else the one its activation implies (`implied_range`)."""
        return self.range if self.range is not None else self.implied_range()

    def activate(self, raw, scale: float | None = None):
        """``scale * activation(raw)`` for a tensor of pre-activations."""
        import torch

        act = {
            "sigmoid": torch.sigmoid,
            "identity": lambda z: z,
            "softplus": torch.nn.functional.softplus,
            "tanh": torch.tanh,
            "exp": torch.exp,
        }[self.activation]
        s = self.scale if scale is None else scale
        out = act(raw)
        return out * s if s != 1.0 else out


# The core's gates (docs/math.md names and the memory layer's historical initial biases).
ALPHA = Gate("alpha", bias=3.0, summary="retain factor alpha_t in [0, 1]: sigmoid(3.0) ~ 0.95",
             range=(0.0, 1.0), role="retention")
ETA = Gate("eta", bias=2.0, summary="momentum decay eta_t in [0, 1]: sigmoid(2.0) ~ 0.88", range=(0.0, 1.0),
           role="momentum")
THETA = Gate("theta", bias=-4.6, summary="inner learning rate theta_t: theta_scale * sigmoid(-4.6) ~ 0.01",
             range=(0.0, None), role="step_size")
GAMMA = Gate("gamma", bias=3.0, summary="Omega window weight gamma_t in [0, 1]: sigmoid(3.0) ~ 0.95",
             range=(0.0, 1.0), role="weight")

#: The four gates of the first layer releases, in their historical order (the order of the
#: layer's gate projection rows, kept so that checkpoints load).
CORE_GATES = (ALPHA, ETA, THETA, GAMMA)
CORE_GATE_NAMES = tuple(g.name for g in CORE_GATES)


def merge_gates(declared: Iterable[tuple[str, Iterable[Gate]]]) -> tuple[Gate, ...]:
    """The gates of a composition from ``(owner, gates)`` pairs (owner: ``"retention"``, ...).

    Two owners may declare the same gate only identically; a different declaration is a
    ValueError naming both. Order: the core gates in `CORE_GATE_NAMES` order, then the others in
    declaration order."""
    seen: dict[str, tuple[str, Gate]] = {}
    for owner, gates in declared:
        for gate in gates:
            if not isinstance(gate, Gate):
                raise ValueError(
                    f"the {owner} declares {gate!r} as a gate; declare gates as "
                    "atlas_core.knobs.Gate(name, ...) (docs/plugins.md#gates)")
            if gate.name in seen and seen[gate.name][1] != gate:
                other, first = seen[gate.name]
                raise ValueError(
                    f"gate {gate.name!r} is declared differently by the {other} ({first}) and the "
                    f"{owner} ({gate}); knobs that share a gate must declare it identically")
            seen.setdefault(gate.name, (owner, gate))
    core = [seen[n][1] for n in CORE_GATE_NAMES if n in seen]
    rest = [g for n, (_, g) in seen.items() if n not in CORE_GATE_NAMES]
    return tuple(core + rest)


def declared_gates(knob) -> tuple[Gate, ...]:
    """A knob's declared gates. A knob written before declarations (``gate_names`` set, ``gates``
    not) still works when it names core gates, which get the core declarations."""
    gates = tuple(knob.gates)
    legacy = tuple(knob.gate_names)
    if set(legacy) == {g.name for g in gates}:
        return gates
    core = {g.name: g for g in CORE_GATES}
    unknown = [n for n in legacy if n not in core]
    if unknown:
        raise ValueError(
            f"{type(knob).__name__} names gates {list(legacy)} in gate_names but declares "
            f"{[g.name for g in gates]} in gates; declare every gate it reads as "
            "gates = (atlas_core.knobs.Gate(name, ...), ...) (docs/plugins.md#gates)")
    return tuple(core[n] for n in legacy)


def names(gates: Iterable[Gate]) -> tuple[str, ...]:
    return tuple(g.name for g in gates)


__all__ = ["ACTIVATIONS", "ACTIVATION_RANGES", "ALPHA", "BOUNDED_ACTIVATIONS", "CORE_GATES",
           "CORE_GATE_NAMES", "ETA", "GAMMA", "Gate", "ROLES", "declared_gates", "SHAPES", "THETA", "merge_gates", "names"]
