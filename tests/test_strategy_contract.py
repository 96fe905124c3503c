"""The strategy contract over every bundled rule (docs/math.md, "The strategy contract").

For every registered rule and preset, every strategy that accepts it equals ``core:sequential`` in
float64 (outputs, final state, gradients with respect to every input, gate and the initial state)
at chunk sizes 1, 5, 16 and 64, for ``anchor = 1`` and ``anchor = 16``; a strategy that refuses
says why. Any split of a 100-token sequence into 2 or 3 calls equals one call, for every strategy
that accepts the rule. The comparisons are against ``core:sequential`` on the same rule, never
against another fast path.
"""

from __future__ import annotations

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import StrategyError
from atlas_core.host.manager import get_registry

H, D = 2, 4
RTOL = 1e-9


def _rule_names() -> list[str]:
    return sorted(c.name for c in get_registry().all("rule"))


def _strategies() -> list[str]:
    return sorted(c.name for c in get_registry().all("strategy") if c.name != "core:sequential")


def _chunked(name: str) -> bool:
    fields = getattr(get_registry().get("strategy", name).load_params(), "model_fields", {}) or {}
    return "chunk_size" in fields


def _build(name: str, anchor: int):
    spec = {"use": name}
    standalone = "preset" not in get_registry().get("rule", name).capabilities
    if standalone:
        if anchor != 1:
            return None
    else:
        spec["anchor"] = anchor
    torch.manual_seed(0)
    return ac.build_rule(spec, heads=H, d_key=D, d_value=D).double()


def _inputs(rule, T: int, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    if not rule.takes_qkv:  # the MRU: X of random rotations
        return rule.example_inputs(batch=2, seq_len=T, dtype=torch.float64, generator=g)
    n = (rule.steps_per_token,) if rule.steps_per_token > 1 else ()  # sub-steps: k, v [2, T, n, H, D]
    q, k, v = (torch.randn(2, T, *s, H, D, generator=g, dtype=torch.float64) for s in ((), n, n))
    q, k = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
    gates = {}
    shapes = {gate.name: gate.shape for gate in rule.gates}
    for name in rule.gate_names:
        x = torch.rand(2, T, *(n if name in rule.step_gates else ()), H,
                       *((D,) if shapes[name] == "key" else ()), generator=g, dtype=torch.float64)
        gates[name] = 0.05 + 0.15 * x if name == "theta" else 0.6 + 0.35 * x
    return {"q": q, "k": k, "v": v, "gates": gates}


def _leaves(inputs: dict) -> dict:
    """The inputs with every tensor a fresh leaf that requires grad."""
    out = {}
    for key, x in inputs.items():
        if isinstance(x, dict):
            out[key] = {n: t.detach().clone().requires_grad_(True) for n, t in x.items()}
        else:
            out[key] = x.detach().clone().requires_grad_(True)
    return out


def _tensors(inputs: dict) -> list[torch.Tensor]:
    out = []
    for key in sorted(inputs):
        x = inputs[key]
        out += [x[n] for n in sorted(x)] if isinstance(x, dict) else [x]
    return out


def _cut(inputs: dict, a: int, b: int) -> dict:
    return {k: ({n: t[:, a:b] for n, t in x.items()} if isinstance(x, dict) else x[:, a:b])
            for k, x in inputs.items()}


def _run(rule, inputs: dict, strategy, cuts=(), state0=None):
    """(y, final state, gradients of a fixed random projection of both w.r.t. every input and
    the initial state), running the sequence in pieces at ``cuts``."""
    leaves = _leaves(inputs)
    state = None
    if state0 is not None:
        state = {k: t.detach().clone().requires_grad_(t.is_floating_point() and not k.startswith("anchor.pos"))
                 for k, t in state0.items()}
    T = _tensors(leaves)[0].shape[1]
    edges = [0, *cuts, T]
    ys, st = [], state
    for a, b in zip(edges, edges[1:]):
        y, st = rule(**_cut(leaves, a, b), state=st, strategy=strategy)
        ys.append(y)
    y = torch.cat(ys, dim=1)
    g = torch.Generator().manual_seed(7)
    loss = (y * torch.randn(y.shape, generator=g, dtype=y.dtype)).sum()
    for key in sorted(st):
        if st[key].is_floating_point() and key != "anchor.pos":
            loss = loss + (st[key] * torch.randn(st[key].shape, generator=g, dtype=st[key].dtype)).sum()
    wrt = _tensors(leaves) + ([t for t in state.values() if t.requires_grad] if state else [])
    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    return y.detach(), {k: t.detach() for k, t in st.items()}, grads


def _close(a, b, what: str) -> None:
    ya, sa, ga = a
    yb, sb, gb = b
    torch.testing.assert_close(yb, ya, rtol=RTOL, atol=RTOL, msg=lambda m: f"{what}, outputs: {m}")
    assert set(sa) == set(sb), f"{what}: state keys {sorted(sb)} != {sorted(sa)}"
    for key in sa:
        torch.testing.assert_close(sb[key], sa[key], rtol=RTOL, atol=RTOL,
                                   msg=lambda m, key=key: f"{what}, state[{key!r}]: {m}")
    for i, (x, y) in enumerate(zip(ga, gb)):
        if x is None or y is None:
            assert (x is None or not x.abs().any()) and (y is None or not y.abs().any()), f"{what}: gradient {i}"
            continue
        torch.testing.assert_close(y, x, rtol=RTOL, atol=RTOL, msg=lambda m, i=i: f"{what}, gradient {i}: {m}")


def _variants(name: str):
    if _chunked(name):
        return [{"use": name, "chunk_size": C} for C in (1, 5, 16, 64)]
    return [name]


def _accepts(rule, strategy) -> tuple[bool, str]:
    try:
        rule.runner(strategy)
    except StrategyError as exc:
        return False, str(exc)
    return True, ""


def _rule_anchor_cases() -> list[tuple[str, int]]:
    """Every rule at anchor 1 and, for knob-composed ones (a standalone rule has none), 16."""
    reg = get_registry()
    return [(n, a) for n in _rule_names() for a in (1, 16)
            if a == 1 or "preset" in reg.get("rule", n).capabilities]


@pytest.mark.parametrize("rule_name,anchor", _rule_anchor_cases(), ids=lambda x: str(x))
def test_every_accepting_strategy_equals_sequential(rule_name, anchor):
    from atlas_core.errors import SpecError

    try:
        rule = _build(rule_name, anchor)
    except SpecError as exc:  # a rule may refuse an anchor (a per-token gradient point): say so
        assert anchor != 1 and "anchor" in str(exc), exc
        return
    inputs = _inputs(rule, 37)
    warm = _run(rule, _inputs(rule, 3, seed=5), "core:sequential")[1]  # a non-zero start state
    ref = _run(rule, inputs, "core:sequential", state0=warm)
    ran, refused = 0, []
    for strat_name in _strategies():
        for strategy in _variants(strat_name):
            ok, why = _accepts(rule, strategy)
            if not ok:
                assert why.strip(), f"{strategy} refused {rule_name} without a reason"
                refused.append(strategy)
                continue
            _close(ref, _run(rule, inputs, strategy, state0=warm), f"{rule_name} anchor={anchor} under {strategy}")
            ran += 1
    # an anchored rule with a linear retention has a parallel strategy; the MRU has its scans
    linear = getattr(getattr(rule, "retention", None), "linear", False)
    if (anchor == 16 and linear) or rule_name == "mru:mru":
        assert ran, f"no parallel strategy accepted {rule_name} (refused: {refused})"


SPLIT_RULES = [
    ("titans:titans", 1),
    ("titans:titans", 16),
    ("titans:titans_deep", 16),
    ("omega:omeganet", 1),
    ("omega:omeganet", 16),
    ("atlas_muon:atlas", 16),
    ("delta", 1),
    ("delta", 16),
    ("zoo:gla", 1),
    ("zoo:kda", 1),
    ("zoo:longhorn", 1),
    ("zoo:rwkv7", 1),
    ("zoo:gated_delta_product", 1),
]


@pytest.mark.parametrize("rule_name,anchor", SPLIT_RULES, ids=lambda x: str(x))
def test_any_split_equals_one_call(rule_name, anchor):
    if rule_name == "delta":
        torch.manual_seed(0)
        rule = ac.build_rule({"retention": "core:decay", "anchor": anchor}, heads=H, d_key=D, d_value=D).double()
    else:
        rule = _build(rule_name, anchor)
    inputs = _inputs(rule, 100)
    for strat_name in ["core:sequential", *_strategies()]:
        for strategy in _variants(strat_name):
            if not _accepts(rule, strategy)[0]:
                continue
            one = _run(rule, inputs, strategy)
            for cuts in ((37,), (1, 50), (13, 14, 99)[:2], (29, 83)):
                _close(one, _run(rule, inputs, strategy, cuts=cuts),
                       f"{rule_name} anchor={anchor} under {strategy}, split at {cuts}")


def test_a_per_token_rule_is_refused_by_an_anchoring_chunk():
    rule = _build("titans:titans", 1)
    ok, why = _accepts(rule, {"use": "core:chunkwise", "chunk_size": 64})
    assert not ok and "anchor = 64" in why


def test_a_chunk_that_does_not_divide_the_anchor_is_refused():
    rule = _build("titans:titans", 16)
    ok, why = _accepts(rule, {"use": "core:chunkwise", "chunk_size": 5})
    assert not ok and "does not divide" in why and "anchor=16" in why
