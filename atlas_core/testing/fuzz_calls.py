"""A seeded fuzzer of rule calls: ``y, state = rule(q, k, v, gates=..., state=...)``.

Each case starts from a valid call of a knob-composed rule and applies one mutation: a wrong
shape, rank, dtype or device (``"meta"``) of one tensor, a wrong container (a list or a bare
tensor for ``gates``/``state``), a missing or an extra gate or state entry, a NaN or inf, a gate
outside its declared range (`atlas_core.knobs.Gate.range`). The contract it holds the rule to:

- a call the rule cannot take ends in a ValueError or TypeError with a message (never a
  RuntimeError or an IndexError from inside torch);
- a NaN, inf or out-of-range gate is refused when the call asks for input checks
  (``check_inputs=True``) and runs without them;
- a valid call (and a harmless variant: another float dtype for a gate or the state) runs.

`fuzz(specs, n, seed)` returns the cases that broke the contract; tests/hostile/test_rule_fuzz.py
runs a bounded number, scripts/fuzz_rule_inputs.py as many as asked.
"""

from __future__ import annotations

import random
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch

# the outcome a mutation must have: "raise" (a clean ValueError/TypeError), "run", or "either"
RAISE, RUN, EITHER = "raise", "run", "either"
SIZES = {"B": 2, "T": 5, "H": 2, "Dk": 4, "Dv": 4}
DEFAULT_SPECS = (
    {"retention": "core:decay", "algorithm": "core:momentum"},
    "titans:titans",
    "omega:omega_titans",
    "titans:titans_deep",
)


@dataclass
class Call:
    q: Any
    k: Any
    v: Any
    gates: Any
    state: Any = None
    check_inputs: bool | None = None
    strategy: Any = None

    def run(self, rule):
        kwargs = {"gates": self.gates, "state": self.state}
        if self.check_inputs is not None:
            kwargs["check_inputs"] = self.check_inputs
        if self.strategy is not None:
            kwargs["strategy"] = self.strategy
        return rule(self.q, self.k, self.v, **kwargs)


@dataclass
class Outcome:
    spec: Any
    mutation: str
    expected: str
    got: str  # "ran" or "<ExceptionType>: message"
    ok: bool
    trace: str = ""


def valid_call(rule, rng: random.Random, dtype=torch.float64) -> Call:
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    B, T, H, Dk, Dv = (SIZES[k] for k in ("B", "T", "H", "Dk", "Dv"))
    T = rng.choice([1, 2, T])

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)

    q, k = randn(B, T, H, Dk), randn(B, T, H, Dk)
    q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    gates = {}
    for gate in rule.gates:
        shape = (B, T, H, Dk) if gate.shape == "key" else (B, T, H)
        gates[gate.name] = 0.1 + 0.8 * torch.rand(*shape, generator=g, dtype=dtype)
    return Call(q, k, randn(B, T, H, Dv), gates)


def _state(rule, call: Call):
    B = call.q.shape[0]
    return rule.init_state(B, dtype=call.q.dtype, device=call.q.device)


def _poke(x: torch.Tensor, value: float, rng: random.Random) -> torch.Tensor:
    x = x.clone()
    flat = x.view(-1)
    flat[rng.randrange(flat.numel())] = value
    return x


def _wrong_shape(x: torch.Tensor, rng: random.Random) -> torch.Tensor:
    how = rng.choice(["drop", "add", "grow", "shrink"])
    if how == "drop" or (how == "shrink" and x.dim() == 0):
        return x[..., 0] if x.dim() else x.reshape(1)
    if how == "add":
        return x.unsqueeze(rng.randrange(x.dim() + 1))
    axis = rng.randrange(x.dim())
    shape = list(x.shape)
    shape[axis] = shape[axis] + 1 if how == "grow" else max(shape[axis] - 1, 0)
    if shape == list(x.shape):
        shape[axis] += 1
    return torch.zeros(shape, dtype=x.dtype)


def _wrong_dtype(x: torch.Tensor, rng: random.Random) -> torch.Tensor:
    return x.to(rng.choice([torch.int64, torch.int32, torch.bool, torch.complex64]))


def _not_a_tensor(x: torch.Tensor, rng: random.Random) -> Any:
    return rng.choice([None, 1.0, "q", x.tolist(), x.numpy() if x.device.type == "cpu" else None, (x,)])


def mutations(rule, call: Call, rng: random.Random) -> list[tuple[str, str, Callable[[Call], Call]]]:
    """(label, expected outcome, function making the mutated call) for one valid call."""
    from dataclasses import replace

    out: list[tuple[str, str, Callable[[Call], Call]]] = [("valid", RUN, lambda c: c)]
    tensors = ["q", "k", "v"]
    for name in tensors:
        out += [
            (f"{name}: wrong shape", RAISE, lambda c, n=name: replace(c, **{n: _wrong_shape(getattr(c, n), rng)})),
            (f"{name}: wrong dtype", RAISE, lambda c, n=name: replace(c, **{n: _wrong_dtype(getattr(c, n), rng)})),
            (f"{name}: not a tensor", RAISE, lambda c, n=name: replace(c, **{n: _not_a_tensor(getattr(c, n), rng)})),
            (f"{name}: on meta", RAISE, lambda c, n=name: replace(c, **{n: getattr(c, n).to("meta")})),
            (f"{name}: other float dtype", RAISE,
             lambda c, n=name: replace(c, **{n: getattr(c, n).to(torch.float32)})),
            (f"{name}: NaN, checked", RAISE,
             lambda c, n=name: replace(c, check_inputs=True, **{n: _poke(getattr(c, n), float("nan"), rng)})),
            (f"{name}: inf, unchecked", RUN,
             lambda c, n=name: replace(c, check_inputs=False, **{n: _poke(getattr(c, n), float("inf"), rng)})),
        ]
    out += [
        ("all on meta", RAISE, lambda c: replace(
            c, q=c.q.to("meta"), k=c.k.to("meta"), v=c.v.to("meta"),
            gates={n: g.to("meta") for n, g in c.gates.items()})),
        ("gates: a list", RAISE, lambda c: replace(c, gates=list(c.gates.values()))),
        ("gates: a tuple", RAISE, lambda c: replace(c, gates=tuple(c.gates.values()))),
        ("gates: a bare tensor", RAISE, lambda c: replace(c, gates=next(iter(c.gates.values()), c.q))),
        ("gates: a string", RAISE, lambda c: replace(c, gates="alpha")),
        ("gates: an extra gate", RAISE, lambda c: replace(c, gates={**c.gates, "zeta": c.q[..., 0]})),
        ("state: a list", RAISE, lambda c: replace(c, state=list(_state(rule, c).values()))),
        ("state: a bare tensor", RAISE, lambda c: replace(c, state=c.q)),
        ("state: an extra entry", RAISE, lambda c: replace(c, state={**_state(rule, c), "extra": c.q})),
        ("state: float32", RUN, lambda c: replace(c, state={k: x.float() for k, x in _state(rule, c).items()})),
        ("strategy: chunkwise", EITHER, lambda c: replace(c, strategy={"use": "core:chunkwise", "chunk_size": 2})),
    ]
    if rule.gates:
        out.append(("gates: None", RAISE, lambda c: replace(c, gates=None)))
        for gate in rule.gates:
            n = gate.name
            out += [
                (f"gates[{n}]: missing", RAISE, lambda c, n=n: replace(c, gates={k: g for k, g in c.gates.items() if k != n})),
                (f"gates[{n}]: wrong shape", RAISE, lambda c, n=n: replace(c, gates={**c.gates, n: _wrong_shape(c.gates[n], rng)})),
                (f"gates[{n}]: wrong dtype", RAISE, lambda c, n=n: replace(c, gates={**c.gates, n: _wrong_dtype(c.gates[n], rng)})),
                (f"gates[{n}]: not a tensor", RAISE, lambda c, n=n: replace(c, gates={**c.gates, n: _not_a_tensor(c.gates[n], rng)})),
                (f"gates[{n}]: on meta", RAISE, lambda c, n=n: replace(c, gates={**c.gates, n: c.gates[n].to("meta")})),
                (f"gates[{n}]: float32", RUN, lambda c, n=n: replace(c, gates={**c.gates, n: c.gates[n].float()})),
                (f"gates[{n}]: NaN, checked", RAISE,
                 lambda c, n=n: replace(c, check_inputs=True, gates={**c.gates, n: _poke(c.gates[n], float("nan"), rng)})),
            ]
            if gate.range is not None:
                lo, hi = gate.range
                bad = (hi + 0.5) if hi is not None else (lo - 1.0)
                out += [
                    (f"gates[{n}] = {bad:g}, checked", RAISE,
                     lambda c, n=n, b=bad: replace(c, check_inputs=True, gates={**c.gates, n: _poke(c.gates[n], b, rng)})),
                    (f"gates[{n}] = {bad:g}, unchecked", RUN,
                     lambda c, n=n, b=bad: replace(c, check_inputs=False, gates={**c.gates, n: _poke(c.gates[n], b, rng)})),
                ]
    for key in sorted(_state(rule, call)):
        out += [
            (f"state[{key}]: missing", RAISE, lambda c, key=key: replace(
                c, state={k: x for k, x in _state(rule, c).items() if k != key})),
            (f"state[{key}]: wrong shape", RAISE, lambda c, key=key: replace(
                c, state={**_state(rule, c), key: _wrong_shape(_state(rule, c)[key], rng)})),
            (f"state[{key}]: not a tensor", RAISE, lambda c, key=key: replace(
                c, state={**_state(rule, c), key: _not_a_tensor(_state(rule, c)[key], rng)})),
            (f"state[{key}]: on meta", RAISE, lambda c, key=key: replace(
                c, state={**_state(rule, c), key: _state(rule, c)[key].to("meta")})),
            (f"state[{key}]: NaN, checked", RAISE, lambda c, key=key: replace(
                c, check_inputs=True, state={**_state(rule, c), key: _poke(_state(rule, c)[key], float("nan"), rng)})),
        ]
    return out


def _verdict(expected: str, exc: BaseException | None) -> bool:
    if exc is None:
        return expected in (RUN, EITHER)
    clean = isinstance(exc, (ValueError, TypeError)) and bool(str(exc).strip())
    return clean and expected in (RAISE, EITHER)


def fuzz(specs=DEFAULT_SPECS, n: int = 100, seed: int = 0) -> tuple[list[Outcome], int]:
    """``n`` mutated calls spread over ``specs`` (every mutation of a rule once before any twice);
    returns (the outcomes that broke the contract, the number of calls made)."""
    from atlas_core.rule import build_rule

    rng = random.Random(seed)
    rules = []
    for spec in specs:
        torch.manual_seed(0)
        rules.append((spec, build_rule(spec, heads=SIZES["H"], d_key=SIZES["Dk"], d_value=SIZES["Dv"])))
    bad: list[Outcome] = []
    made = 0
    queues: dict[int, list] = {}
    while made < n:
        i = made % len(rules)
        spec, rule = rules[i]
        if not queues.get(i):
            base = valid_call(rule, rng)
            queues[i] = [(m, base) for m in mutations(rule, base, rng)]
            rng.shuffle(queues[i])
        (label, expected, make), base = queues[i].pop()
        made += 1
        exc = None
        try:
            call = make(base)
            call.run(rule)
        except Exception as e:  # noqa: BLE001 - the point is what comes out
            exc = e
        if not _verdict(expected, exc):
            got = "ran" if exc is None else f"{type(exc).__name__}: {exc}"
            trace = "" if exc is None else "".join(traceback.format_exception(exc)[-3:])
            bad.append(Outcome(spec, label, expected, got[:400], False, trace))
    return bad, made
