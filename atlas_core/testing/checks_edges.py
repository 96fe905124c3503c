"""Checks at the edges: dtypes first, then boundary inputs.

`check_dtype_follows_inputs` runs before every other check that runs a rule. For a knob-composed
rule it watches every method of every knob during one small call in float64 and one in float32:
a method that is given tensors of one dtype and returns another (a constant or a parameter left
in float32, a ``.float()``) is named with the component, the method, the input dtype and the dtype
returned. Without this check such a component fails every other check with an error from inside
torch ("expected scalar type Double but found Float"). The runner adds the finding to those
messages too.

`check_boundary_inputs` runs one call whose batch rows are the edge cases (one case per row, so
the whole set costs one forward and one backward pass per strategy):

- every gate at each end of its declared range (`atlas_core.knobs.Gate.range`: alpha = 0 and 1,
  eta = 0 and 1, gamma = 0 and 1, theta = 0), or, without one, of the range its activation
  implies (sigmoid [0, 1], tanh [-1, 1], softplus and exp >= 0, times its scale; a bounded
  activation without a declared range is also a warning); every gate at its low end, every gate
  at its high end;
- zero q, k and v; one-hot keys and queries; one key repeated at every token; large-magnitude
  values and queries (v x 1e4, q x 1e2; keys stay unit-norm, as the memory layer makes them),
  with the step-size gates (declared >= 0 without an upper end: theta) divided by 1e4, so the
  case tests overflow in the arithmetic rather than a step too large for gradient descent;
- a memory whose entries are exactly zero in a checkerboard (the other rows start from a warm
  state, with no zero entry, so that a failure there is named for its own case);

and, for a retention with a gated retain factor, in float32 without gradients, a long call
(`EDGE_LONG_T` tokens) at the memory layer's default gates with the retention's gates at their
high end (alpha = 1: nothing forgotten), under the last strategy variant (a parallel one when one
runs the rule, else core:sequential). Outputs, final states and the gradients of every input and
initial-state tensor must be finite; a failure names the case and its batch row. A standalone rule
(no knobs) gets the same rows for each gate it declares (`Rule.gates`: each end of its range, all
low, all high; its call passes them as ``gates={...}``), then zero inputs, a repeated first token
and its other inputs x 100.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from atlas_core.knobs.gates import BOUNDED_ACTIVATIONS

from . import inputs as I
from .results import RULE_BEARING, Failure, register

EDGE_T = 6
EDGE_LONG_T = 128
LARGE_V, LARGE_Q = 1e4, 1e2
KNOB_SLOTS = ("structure", "bias", "retention", "algorithm", "feature_map")
_MODULE_ATTRS = frozenset(dir(torch.nn.Module))


# -- dtypes ---------------------------------------------------------------------------------------
def _float_dtypes(value: Any, depth: int = 0):
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            yield value.dtype
    elif depth < 2 and isinstance(value, dict):
        for v in value.values():
            yield from _float_dtypes(v, depth + 1)
    elif depth < 2 and isinstance(value, (list, tuple)):
        for v in value:
            yield from _float_dtypes(v, depth + 1)


def _input_dtype(args: tuple, kwargs: dict):
    for dt in _float_dtypes((args, kwargs)):
        return dt
    dt = kwargs.get("dtype")
    return dt if isinstance(dt, torch.dtype) else None


def _knob_label(subject, rule, slot: str) -> str:
    if subject.kind == slot:
        return subject.name
    raw = rule.spec.get(slot)
    if isinstance(raw, dict):
        raw = raw.get("use")
    return f"the {slot} {raw}" if isinstance(raw, str) else f"the {slot}"


def _watch(obj: Any, label: str, found: list) -> None:
    """Replace every public method of ``obj`` (on the instance) by one that records the first
    call whose floating-point inputs and outputs have different dtypes."""
    for name in dir(type(obj)):
        if (name.startswith("_") and name != "forward") or (name in _MODULE_ATTRS and name != "forward"):
            continue
        attr = getattr(type(obj), name, None)
        if not callable(attr) or isinstance(attr, (property, type, staticmethod, classmethod)):
            continue
        fn = getattr(obj, name)

        def watched(*args, _fn=fn, _name=name, **kwargs):
            out = _fn(*args, **kwargs)
            want = _input_dtype(args, kwargs)
            if want is not None and not found:
                got = next((d for d in _float_dtypes(out) if d != want), None)
                if got is not None:
                    found.append((label, _name, want, got))
            return out

        try:
            object.__setattr__(obj, name, watched)
        except (AttributeError, TypeError):  # a slotted or frozen object: left unwatched
            continue


def _dt(d) -> str:
    return str(d).replace("torch.", "")


@register(
    "check_dtype_follows_inputs",
    "a component computes in its inputs' dtype: given float64 (or float32) tensors every method of "
    "every knob returns that dtype, and the rule's y and state have it (run before the other "
    "checks, so that a dtype slip is named as one instead of failing them from inside torch).",
    RULE_BEARING,
)
def check_dtype_follows_inputs(subject) -> None:
    subject.require_buildable()
    for dtype in (torch.float64, torch.float32):
        rule = subject.build_rule(dtype=dtype)
        found: list = []
        if subject.composed(rule):
            for slot in KNOB_SLOTS:
                _watch(getattr(rule, slot), _knob_label(subject, rule, slot), found)
        flat = subject.inputs(rule, B=1, T=2, dtype=dtype)
        error = None
        try:
            out = I.outputs(rule(**I.unflatten(flat), strategy="core:sequential"), subject.name)
        except Exception as exc:  # noqa: BLE001 - reported below, with what was found first
            out, error = None, exc
        if found:
            label, method, want, got = found[0]
            problem = (f"{label} returns {_dt(got)} from {method}() for {_dt(want)} inputs")
            subject.dtype_problem = problem
            raise Failure(f"{problem}; a component must compute in its inputs' dtype (create "
                          "constants and cast parameters with .to(x) or like=x)", dtype=_dt(dtype))
        if error is not None:
            raise error
        for key, x in out.items():
            if x.dtype != dtype:
                problem = f"{subject.name} returns {key} of dtype {_dt(x.dtype)} for {_dt(dtype)} inputs"
                subject.dtype_problem = problem
                raise Failure(problem, dtype=_dt(dtype))


# -- boundary inputs ------------------------------------------------------------------------------
def _gate_edges(rule) -> list[tuple[str, dict[str, float]]]:
    """(label, {gate: value}) for each end of each gate's range (declared, or else implied by its
    activation: `Gate.tested_range`), and all low / all high."""
    ranged = [g for g in sorted(rule.gates, key=lambda g: g.name) if g.tested_range() is not None]
    out = []
    for g in ranged:
        lo, hi = g.tested_range()
        implied = "" if g.range is not None else f" (an end of its {g.activation} activation; no range declared)"
        for end in (lo, hi):
            if end is not None:
                out.append((f"{g.name} = {end:g}{implied}", {g.name: float(end)}))
    lows = {g.name: float(g.tested_range()[0]) for g in ranged if g.tested_range()[0] is not None}
    highs = {g.name: float(g.tested_range()[1]) for g in ranged if g.tested_range()[1] is not None}
    if len(lows) > 1:
        out.append(("every gate at its low end (" + ", ".join(f"{k} = {v:g}" for k, v in lows.items()) + ")", lows))
    if len(highs) > 1:
        out.append(("every gate at its high end (" + ", ".join(f"{k} = {v:g}" for k, v in highs.items()) + ")", highs))
    return out


def _composed_rows(rule) -> list[tuple[str, Callable[[dict, int], None]]]:
    def zero_qkv(flat, r):
        for key in ("q", "k", "v"):
            flat[key][r] = 0.0

    def one_hot(flat, r):
        for key, shift in (("k", 0), ("q", 1)):
            x = flat[key][r]
            eye = torch.zeros_like(x)
            for t in range(x.shape[0]):
                eye[t, ..., (t + shift) % x.shape[-1]] = 1.0
            flat[key][r] = eye

    def repeated(flat, r):
        flat["k"][r] = flat["k"][r, :1].expand_as(flat["k"][r]).clone()

    def large(flat, r):
        flat["v"][r] *= LARGE_V
        flat["q"][r] *= LARGE_Q
        for name in steps:  # the step shrinks as much: overflow is tested, not a divergent step
            flat[f"gates.{name}"][r] /= LARGE_V

    # step sizes: gates declared >= 0 without an upper end (theta)
    steps = [g.name for g in rule.gates if g.tested_range() is not None and g.tested_range()[1] is None]
    rows = [(label, _set_gates(values)) for label, values in _gate_edges(rule)]
    rows += [("zero q, k and v", zero_qkv), ("one-hot keys and queries", one_hot),
             ("one key repeated at every token", repeated),
             (f"large values and queries (v x {LARGE_V:g}, q x {LARGE_Q:g}"
              + (f", {', '.join(steps)} / {LARGE_V:g}" if steps else "") + ")", large)]
    return rows


def _set_gates(values: dict[str, float]) -> Callable[[dict, int], None]:
    def apply(flat, r):
        for name, value in values.items():
            key = f"gates.{name}"
            if key not in flat:
                raise Failure(f"the rule declares the gate {name!r} but its call has no gates[{name!r}] "
                              f"(inputs: {sorted(flat)}); a declared gate is passed as gates={{...}}")
            flat[key][r] = value
    return apply


def _standalone_rows(rule) -> list[tuple[str, Callable[[dict, int], None]]]:
    """A standalone rule's rows: each declared gate at each end of its range (as a composed
    rule's), then zero inputs, a repeated first token and its other inputs x 100 (its gates kept
    in their range)."""
    def zero(flat, r):
        for x in flat.values():
            x[r] = 0.0

    def repeated(flat, r):
        for x in flat.values():
            x[r] = x[r, :1].expand_as(x[r]).clone()

    def large(flat, r):
        for key, x in flat.items():
            if not key.startswith("gates."):
                x[r] *= 100.0

    rows = [(label, _set_gates(values)) for label, values in _gate_edges(rule)]
    kept = " (its gates kept)" if rule.gates else ""
    return rows + [("zero inputs", zero), ("the first token repeated", repeated), (f"inputs x 100{kept}", large)]


ZERO_ENTRIES = "memory entries exactly zero (a checkerboard of a warm state)"


def _zeroed(rule, warm: dict) -> dict:
    """``warm`` with every other entry of each memory weight set to exactly zero."""
    out = dict(warm)
    for key in rule.structure.weight_shapes():
        w = warm[key].clone()
        mask = torch.ones(w.numel(), dtype=torch.bool)
        mask[::2] = False
        w.view(-1)[~mask] = 0.0
        out[key] = w
    return out


def _first_bad_row(x: torch.Tensor) -> int | None:
    bad = ~torch.isfinite(x.detach())
    if x.dim() == 0 or not bool(bad.any()):
        return None
    return int(bad.flatten(1).any(1).nonzero()[0])


def _check_finite(named: dict, labels: list[str], what: str, nums: dict) -> None:
    for name, x in named.items():
        if x is None:
            continue
        r = _first_bad_row(x)
        if r is not None:
            n = int((~torch.isfinite(x[r].detach())).sum())
            raise Failure(f"{what} {name} has {n} non-finite entries in the boundary case "
                          f"'{labels[r]}' (batch row {r})", **nums)


@register(
    "check_boundary_inputs",
    "on boundary inputs (each gate at each end of its declared range, e.g. alpha = 1, theta = 0, "
    "or of the range its activation implies; "
    "zero q, k, v; one-hot and repeated keys; large values; memory entries exactly zero; for a "
    "standalone rule each gate it declares at each end, zero, repeated and large inputs) outputs, "
    f"final states and gradients stay finite under every strategy, and so do outputs and states "
    f"over {EDGE_LONG_T} tokens in float32 at the default gates with alpha = 1 (under the "
    "parallel variant when one runs the rule).",
    RULE_BEARING,
)
def check_boundary_inputs(subject) -> None:
    subject.require_buildable()
    rule = subject.build_rule(dtype=torch.float64)
    composed = subject.composed(rule)
    for g in rule.gates:  # a composed rule's (its knobs'), or a standalone rule's own
        if g.range is None and g.activation in BOUNDED_ACTIVATIONS:
            lo, hi = g.implied_range()
            subject.warn(f"gate {g.name!r} has a {g.activation} activation but no declared range; the "
                         f"kit tries the ends it implies, {lo:g} and {hi:g}: declare "
                         f"range=({lo:g}, {hi:g}) (docs/plugins.md#gates)")
    rows = _composed_rows(rule) if composed else _standalone_rows(rule)
    labels = [label for label, _ in rows] + ([ZERO_ENTRIES] if composed else [])
    R = len(labels)
    variants = subject.run_variants(rule)
    for variant in variants:
        target = subject.rule_for(rule, variant)
        flat = subject.inputs(rule, B=R, T=EDGE_T, dtype=torch.float64, seed=17)
        flat = {k: x.clone() for k, x in flat.items()}
        with torch.no_grad():
            for r, (_, apply) in enumerate(rows):
                apply(flat, r)
        state = None
        if composed:  # a warm state (non-zero entries) in every row; the last row's has zeros
            state = subject.warm_state(rule, variant, B=R, dtype=torch.float64)
            zeroed = _zeroed(target, {k: x[R - 1:] for k, x in state.items()})
            for key in target.structure.weight_shapes():
                state[key][R - 1] = zeroed[key][0]
        nums = {"strategy": variant.title, "dtype": "float64", "sizes": subject.sizes_text(R, EDGE_T)}
        x = I.leaves(flat)
        s = I.leaves(state) if state is not None else None
        out = subject.run(rule, x, variant, state=s)
        _check_finite(out, labels, "the output", nums)
        g = torch.Generator().manual_seed(23)
        loss = sum((o * torch.randn(o.shape, generator=g, dtype=torch.float64).to(o)).sum()
                   for o in out.values() if o.requires_grad)
        named = {**{f"of input {k}": t for k, t in x.items() if t.requires_grad},
                 **({f"of initial state[{k!r}]": t for k, t in s.items() if t.requires_grad} if s else {})}
        if named and isinstance(loss, torch.Tensor):
            grads = torch.autograd.grad(loss, list(named.values()), allow_unused=True)
            _check_finite(dict(zip(named, grads)), labels, "the gradient", nums)
    if composed and any(g.range is not None and g.range[1] is not None for g in _retention_gates(rule)):
        # the long call, under the kit's parallel variant when one runs the rule (at the default
        # gates alone it is check_long_sequence_stable's)
        _long_float32(subject, subject.build_rule(dtype=torch.float32), variants[-1])


def _retention_gates(rule) -> list:
    """The declarations of the retention's own gates (the rule's form names them)."""
    return [g for g in rule.gates if g.name in rule.form.retention_gates]


def _long_float32(subject, rule, variant) -> None:
    """A long float32 call at the memory layer's default gates, except the retention's gates at
    their high end (alpha = 1: nothing is forgotten)."""
    highs = {g.name: float(g.range[1]) for g in _retention_gates(rule)
             if g.range is not None and g.range[1] is not None}
    flat = subject.inputs(rule, B=1, T=EDGE_LONG_T, dtype=torch.float32, seed=19, mode="default")
    for name, value in highs.items():
        flat[f"gates.{name}"] = torch.full_like(flat[f"gates.{name}"], value)
    label = ("the default gates" + (f" but {', '.join(f'{k} = {v:g}' for k, v in highs.items())}"
                                    if highs else ""))
    nums = {"strategy": variant.title, "dtype": "float32", "sizes": subject.sizes_text(1, EDGE_LONG_T)}
    with torch.no_grad():
        out = subject.run(rule, flat, variant)
    for key, x in out.items():
        if not bool(torch.isfinite(x).all()):
            raise Failure(f"{key} has {int((~torch.isfinite(x)).sum())} non-finite entries after "
                          f"{EDGE_LONG_T} tokens in float32 with {label}", **nums)
