"""Random calls for the checks, and the helpers that cut, splice and compare them.

A call is kept *flat*: ``{"q": [B, T, H, Dk], "k": ..., "v": [B, T, H, Dv], "gates.alpha":
[B, T, H], ...}``; `unflatten` turns it into the keyword arguments of ``rule(**kwargs, state=...,
strategy=...)``. Every tensor of a call has time on dim 1 (the ``[B, T, ...]`` layout), which is
what lets the checks cut a call in two (state carry) or replace its future (causality) without
knowing the rule.

Standalone rules (a rule that is not a knob composition, e.g. the MRU) provide their own inputs
through ``rule.example_inputs(batch=, seq_len=, dtype=, device=, generator=)``: a mapping of
keyword arguments (tensors ``[B, T, ...]``, or one level of dicts of them such as ``gates``).
See docs/plugins.md#standalone-rules.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from .results import Failure, Skip

# Gate ranges of the random calls by the gate's role (docs/math.md conventions: alpha, eta, theta,
# gamma): wide enough to exercise every term; a gate without one of these roles draws OTHER_GATE.
RANDOM_GATES = {"retention": (0.6, 1.0), "momentum": (0.0, 0.9), "step_size": (0.05, 0.5),
                "weight": (0.5, 1.0)}
OTHER_GATE = (0.2, 0.8)
# "Default gates" of the stability check: the memory layer's initial gates, from each gate's
# declaration (atlas_core.knobs.Gate): scale * activation(bias + 0.5 * noise) (docs/math.md,
# "Defaults worth knowing": alpha 3.0, eta 2.0, theta -4.6, gamma 3.0).


def generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(int(seed))


def composed_inputs(rule, B: int, T: int, *, dtype, device, seed: int, mode: str = "random") -> dict:
    """A random call of a knob-composed rule (q and k l2-normalised, as the memory layer does)."""
    g = generator(seed)
    H, Dk, Dv = rule.structure.heads, rule.feature_map.d_in, rule.structure.d_out
    # sub-steps per token (rule.steps_per_token = n > 1): k, v [B, T, n, H, D], step gates [B, T, n, H]
    n = (rule.steps_per_token,) if rule.steps_per_token > 1 else ()
    q = torch.randn(B, T, H, Dk, generator=g, dtype=torch.float64)
    k = torch.randn(B, T, *n, H, Dk, generator=g, dtype=torch.float64)
    q = q / q.norm(dim=-1, keepdim=True)
    k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(B, T, *n, H, Dv, generator=g, dtype=torch.float64)
    flat = {"q": q, "k": k, "v": v}
    # every gate the rule declares, in its declared shape: [B, T, H] or [B, T, H, Dk] (a key gate)
    for gate in sorted(rule.gates, key=lambda d: d.name):  # rule.gate_names' order: same draws
        name = gate.name
        shape = (B, T, *(n if name in rule.step_gates else ()), H, *((Dk,) if gate.shape == "key" else ()))
        if mode == "default":  # the memory layer's initial gates: the declared bias and activation
            noise = 0.5 * torch.randn(*shape, generator=g, dtype=torch.float64)
            flat[f"gates.{name}"] = gate.activate(gate.bias + noise)
        else:
            lo, hi = RANDOM_GATES.get(gate.role, OTHER_GATE)
            flat[f"gates.{name}"] = lo + (hi - lo) * torch.rand(*shape, generator=g, dtype=torch.float64)
    return {k2: x.to(device=device, dtype=dtype) for k2, x in flat.items()}


def standalone_inputs(rule, name: str, B: int, T: int, *, dtype, device, seed: int) -> dict:
    raw = rule.example_inputs(batch=B, seq_len=T, dtype=dtype, device=torch.device(device),
                              generator=generator(seed))
    if raw is None:  # the Rule base's: no example inputs
        raise Skip(
            f"{name} is a standalone rule without example_inputs(batch=, seq_len=, dtype=, device=, "
            "generator=), so the kit cannot make calls for it (docs/plugins.md#standalone-rules)"
        )
    if not isinstance(raw, Mapping):
        raise Failure(f"example_inputs returned {type(raw).__name__}, not a mapping of keyword arguments")
    flat = flatten(raw)
    for key, x in flat.items():
        if x.dim() < 2 or x.shape[0] != B or x.shape[1] != T:
            raise Failure(
                f"example_inputs()[{key!r}] has shape {tuple(x.shape)}; every input must be "
                f"[B, T, ...] = [{B}, {T}, ...]"
            )
    return flat


def flatten(kwargs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    flat = {}
    for key, value in kwargs.items():
        if isinstance(value, Mapping):
            for sub, x in value.items():
                flat[f"{key}.{sub}"] = x
        elif isinstance(value, torch.Tensor):
            flat[key] = value
        else:
            raise Failure(f"input {key!r} is a {type(value).__name__}; inputs must be tensors or dicts of tensors")
    return flat


def unflatten(flat: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, x in flat.items():
        head, dot, sub = key.partition(".")
        if dot:
            out.setdefault(head, {})[sub] = x
        else:
            out[key] = x
    return out


def time_slice(flat: Mapping[str, torch.Tensor], start: int, stop: int | None) -> dict:
    return {k: x[:, start:stop] for k, x in flat.items()}


def splice_future(flat: Mapping, other: Mapping, t0: int) -> dict:
    """``flat`` up to token t0 - 1, ``other`` from token t0 on (both valid calls)."""
    return {k: torch.cat([x[:, :t0], other[k][:, t0:]], dim=1) for k, x in flat.items()}


def cast(flat: Mapping[str, torch.Tensor], dtype) -> dict:
    return {k: x.to(dtype) if x.is_floating_point() else x for k, x in flat.items()}


# State entries that are counters, not values: an anchored rule's position inside its anchor block
# (docs/math.md, "Anchoring as part of the rule"). No gradient flows to or from them, and gradcheck
# must not perturb them (a position of 3 - 1e-6 is another position).
DISCRETE_STATE = ("anchor.pos",)


def differentiable(key: str, x: torch.Tensor) -> bool:
    """Whether a call or state tensor takes part in gradients (``key`` without a ``state.`` prefix)."""
    return x.is_floating_point() and key.removeprefix("state.") not in DISCRETE_STATE


def leaves(flat: Mapping[str, torch.Tensor]) -> dict:
    """Detached copies that require grad (the `differentiable` tensors only)."""
    return {k: x.detach().clone().requires_grad_(differentiable(k, x)) for k, x in flat.items()}


def outputs(result: Any, what: str = "the rule") -> dict[str, torch.Tensor]:
    """``(y, state)`` -> ``{"y": y, "state.<key>": ...}``, checking the result's form."""
    if not (isinstance(result, tuple) and len(result) == 2):
        raise Failure(f"{what} returned {type(result).__name__}; the call contract is `y, state = rule(...)`")
    y, state = result
    if not isinstance(y, torch.Tensor):
        raise Failure(f"{what} returned y of type {type(y).__name__}, not a tensor")
    if not isinstance(state, Mapping):
        raise Failure(f"{what} returned a state of type {type(state).__name__}; it must map names to tensors")
    out = {"y": y}
    for key, x in state.items():
        if not isinstance(x, torch.Tensor):
            raise Failure(f"{what} returned state[{key!r}] of type {type(x).__name__}, not a tensor")
        out[f"state.{key}"] = x
    return out


def state_of(out: Mapping[str, torch.Tensor]) -> dict:
    return {k[len("state."):]: x for k, x in out.items() if k.startswith("state.")}


def max_abs(x: torch.Tensor) -> float:
    if x.numel() == 0:
        return 0.0
    return float(x.detach().abs().max().to(torch.float64))


def compare(got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor], tol: float,
            what: str, keys: Any = None, **numbers: Any) -> None:
    """Fail unless every tensor of ``got`` is within ``tol * max(1, max |want|)`` of ``want``."""
    names = list(keys) if keys is not None else list(want)
    missing = [k for k in names if k not in got]
    if missing or (keys is None and set(got) != set(want)):
        raise Failure(f"{what}: the results have different entries ({sorted(got)} vs {sorted(want)})", **numbers)
    worst = None  # (ratio, |diff|, key, scale); NaN counts as the worst
    for key in names:
        a, b = got[key], want[key]
        if tuple(a.shape) != tuple(b.shape):
            raise Failure(f"{what}: {key} has shape {tuple(a.shape)}, expected {tuple(b.shape)}", **numbers)
        if a.numel() == 0:
            continue
        a64, b64 = a.detach().to(torch.float64), b.detach().to(torch.float64)
        s = max(1.0, max_abs(b64)) if torch.isfinite(b64).all() else 1.0
        d = float((a64 - b64).abs().max())
        if math.isnan(d) or (torch.isfinite(a64) != torch.isfinite(b64)).any():
            d = float("nan")
        ratio = math.inf if math.isnan(d) else d / s
        if worst is None or ratio > worst[0]:
            worst = (ratio, d, key, s)
    if worst is None:
        return
    _, d, key, s = worst
    if math.isnan(d) or d > tol * s:
        raise Failure(f"{what}: {key} differs", max_abs_diff=d, tolerance=tol * s, **numbers)
