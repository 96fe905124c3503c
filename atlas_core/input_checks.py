"""Checks of a rule call's inputs: the containers always, the values on request.

Always on (cheap, type tests): ``gates`` and ``state`` must be mappings of named tensors (or
None); a list of gates, or a bare tensor, is one `TypeError` that says what to pass. No tensor may
be on the ``meta`` device (shapes without values): one ValueError naming it.

On request, because they read every value (a pass over the inputs and a device sync):
``rule(..., check_inputs=True)``, or ``ATLAS_CHECK_INPUTS=1`` in the environment for every call
that does not pass ``check_inputs`` (``check_inputs=False`` turns them off for one call). They
refuse, with a `InputCheckError` (a ValueError) that names the tensor, the value and its position
(batch, time, head):

- a non-finite value (NaN, inf) in any input tensor, any gate or any state tensor;
- a gate outside the range its declaration documents (`atlas_core.knobs.Gate.range`: alpha, eta
  and gamma in [0, 1], theta >= 0).

Off by default: the hot path pays one environment lookup per call.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Mapping

import torch

ENV = "ATLAS_CHECK_INPUTS"
_OFF = ("", "0", "false", "no", "off")
# the axes of a call tensor ([B, T, H, ...]) and of a state tensor ([B, H, ...] for a composed rule)
CALL_AXES = ("batch", "time", "head")
STEP_AXES = ("batch", "time", "step", "head")  # k, v and step gates of a rule with sub-steps
STATE_AXES = ("batch", "head")


class InputCheckError(ValueError):
    """An input refused by the opt-in checks (non-finite, or a gate outside its range)."""


def wanted(check_inputs: bool | None) -> bool:
    """Whether this call's values are checked: ``check_inputs`` when given, else the environment."""
    if check_inputs is not None:
        return bool(check_inputs)
    return os.environ.get(ENV, "").strip().lower() not in _OFF


def check_containers(gates: Any, state: Any) -> None:
    """``gates`` and ``state`` are None or mappings (always checked; no tensor is read)."""
    for what, value, example in (("gates", gates, "gates={'alpha': a, 'theta': th}"),
                                 ("state", state, "state=<the state an earlier call returned>")):
        if value is None or isinstance(value, Mapping):
            continue
        if isinstance(value, (list, tuple)):
            got = f"a {type(value).__name__} of {len(value)} item(s)"
            fix = "name each entry: pass a dict"
        else:
            got = f"a {type(value).__name__}"
            fix = "pass a dict"
        raise TypeError(f"{what} must be a dict mapping names to tensors ({example}), got {got}; {fix}")


def check_devices(args: tuple, kwargs: Mapping[str, Any]) -> None:
    """A call whose inputs are on the ``meta`` device, which has shapes but no values, is refused
    (always checked; a few type tests). Only the first tensor's device decides: a call that mixes
    devices gets the rule's own message naming both (``k is on meta but q is on cpu``)."""
    names = ("q", "k", "v")
    items = [(names[i] if i < len(names) else f"argument {i}", a) for i, a in enumerate(args)]
    items += list(kwargs.items())
    for name, value in items:
        inner = value.items() if isinstance(value, Mapping) else ()
        for label, x in ((name, value), *((f"{name}[{k!r}]", x) for k, x in inner)):
            if isinstance(x, torch.Tensor):
                if x.device.type == "meta":
                    raise ValueError(f"{label} is on the meta device, which has shapes but no "
                                     "values; a rule call needs tensors on a real device (cpu, cuda)")
                return


def _position(idx: tuple[int, ...], axes: tuple[str, ...]) -> str:
    named = ", ".join(f"{a} {i}" for a, i in zip(axes, idx))
    rest = idx[len(axes):]
    if rest:
        named += f", index {list(rest)} after those"
    return f"({named})" if named else "(a scalar)"


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0].tolist())


def _check_finite(name: str, x: torch.Tensor, axes: tuple[str, ...]) -> None:
    if not x.is_floating_point() or x.device.type == "meta":
        return
    bad = ~torch.isfinite(x.detach())
    if bool(bad.any()):
        idx = _first(bad)
        value = float(x.detach()[idx])
        raise InputCheckError(
            f"{name} has {int(bad.sum())} non-finite value(s); the first is {value} at "
            f"{_position(idx, axes)}; every input, gate and state value must be finite")


def _check_range(name: str, x: torch.Tensor, gate: Any, axes: tuple[str, ...] = CALL_AXES) -> None:
    lo, hi = gate.range
    d = x.detach()
    bad = torch.zeros_like(d, dtype=torch.bool)
    if lo is not None:
        bad |= d < lo
    if hi is not None:
        bad |= d > hi
    if bool(bad.any()):
        idx = _first(bad)
        summary = f" ({gate.summary})" if gate.summary else ""
        raise InputCheckError(
            f"{name} = {float(d[idx]):g} at {_position(idx, axes)} is outside its range "
            f"{gate.range_text()}{summary}; {int(bad.sum())} value(s) are outside it")


def _arguments(rule: Any, args: tuple, kwargs: dict) -> dict[str, Any] | None:
    try:
        bound = inspect.signature(rule.prepare).bind(*args, **kwargs)
    except TypeError:
        return None  # `prepare` itself reports a call it cannot take
    return dict(bound.arguments)


def _axes(rule: Any, key: str, sub: str | None = None) -> tuple[str, ...]:
    """The named axes of a call tensor: a rule with sub-steps (``steps_per_token > 1``) gives
    k, v and its step gates a step axis after time."""
    if rule.steps_per_token > 1 and (key in ("k", "v") or (key == "gates" and sub in rule.step_gates)):
        return STEP_AXES
    return CALL_AXES


def check_values(rule: Any, args: tuple, kwargs: dict) -> None:
    """The opt-in checks of one call of ``rule`` (see the module docstring). Tensors of the wrong
    type or shape are left to the rule's own validation."""
    arguments = _arguments(rule, args, kwargs)
    if arguments is None:
        return
    declared = {g.name: g for g in rule.gates}
    composed = rule.composed
    for key, value in arguments.items():
        if isinstance(value, torch.Tensor):
            _check_finite(key, value, _axes(rule, key))
        elif isinstance(value, Mapping):
            for sub, x in value.items():
                if not isinstance(x, torch.Tensor):
                    continue
                label = f"{key}[{sub!r}]"
                if key == "state":
                    axes = STATE_AXES if composed and x.dim() > 1 else ("batch",)
                    _check_finite(label, x, axes)
                    continue
                axes = _axes(rule, key, sub)
                _check_finite(label, x, axes)
                gate = declared.get(sub) if key == "gates" else None
                if gate is not None and gate.range is not None and x.is_floating_point() \
                        and x.device.type != "meta":
                    _check_range(label, x, gate, axes)
