"""Packed documents (``cu_seqlens``): one packed call equals one call per document.

For every registered rule and preset (enumerated from the registry, so rules added later are
covered), at anchor 1 and, for knob-composed rules, 16, and for every strategy that accepts it
(chunked ones at chunk size 4, so documents are not multiples of the chunk), a call over packed
documents of lengths 1, 7, 5, 7, 3 equals separate calls per document in float64: outputs, final
states (one row per document), and gradients w.r.t. every input, gate and the per-document
initial state. Plus the validation messages and the packed short convolution.
"""

from __future__ import annotations

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import SpecError, StrategyError
from atlas_core.host.manager import get_registry
from atlas_core.layer import ShortConv
from atlas_core.varlen import check_cu_seqlens, packed_short_conv

H, D = 2, 4
TOL = 1e-9
LENGTHS = (1, 7, 5, 7, 3)  # a one-token document, two of equal length, none a multiple of 4


def _cu(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.long)


def _cases() -> list[tuple[str, int]]:
    reg = get_registry()
    names = sorted(c.name for c in reg.all("rule"))
    return [(n, a) for n in names for a in (1, 16) if a == 1 or "preset" in reg.get("rule", n).capabilities]


def _strategies(rule) -> list:
    reg = get_registry()
    out = []
    for c in sorted(reg.all("strategy"), key=lambda c: c.name):
        fields = getattr(reg.get("strategy", c.name).load_params(), "model_fields", {}) or {}
        value = {"use": c.name, "chunk_size": 4} if "chunk_size" in fields else c.name
        try:
            rule.runner(value)
        except StrategyError:
            continue
        out.append(value)
    return out


def _inputs(rule, B: int, T: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    if not rule.takes_qkv:
        return dict(rule.example_inputs(batch=B, seq_len=T, dtype=torch.float64, generator=g))
    n = (rule.steps_per_token,) if rule.steps_per_token > 1 else ()
    q, k, v = (torch.randn(B, T, *s, H, D, generator=g, dtype=torch.float64) for s in ((), n, n))
    q, k = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
    shapes = {gate.name: gate.shape for gate in rule.gates}
    gates = {}
    for name in rule.gate_names:
        x = torch.rand(B, T, *(n if name in rule.step_gates else ()), H,
                       *((D,) if shapes[name] == "key" else ()), generator=g, dtype=torch.float64)
        gates[name] = 0.05 + 0.15 * x if name == "theta" else 0.6 + 0.35 * x
    return {"q": q, "k": k, "v": v, "gates": gates}


def _leaves(inputs: dict) -> tuple[dict, list[torch.Tensor]]:
    out, flat = {}, []
    for key in sorted(inputs):
        x = inputs[key]
        if isinstance(x, dict):
            out[key] = {n: x[n].detach().clone().requires_grad_(True) for n in sorted(x)}
            flat += list(out[key].values())
        else:
            out[key] = x.detach().clone().requires_grad_(True)
            flat.append(out[key])
    return out, flat


def _cut(inputs: dict, a: int, b: int) -> dict:
    return {k: ({n: t[:, a:b] for n, t in x.items()} if isinstance(x, dict) else x[:, a:b])
            for k, x in inputs.items()}


def _state_leaves(state0):
    if state0 is None:
        return None, []
    st = {k: t.detach().clone().requires_grad_(t.is_floating_point()) for k, t in state0.items()}
    return st, [t for t in st.values() if t.requires_grad]


def _loss(y, st):
    g = torch.Generator().manual_seed(7)
    loss = (y * torch.randn(y.shape, generator=g, dtype=y.dtype)).sum()
    for key in sorted(st):
        if st[key].is_floating_point():
            loss = loss + (st[key] * torch.randn(st[key].shape, generator=g, dtype=st[key].dtype)).sum()
    return loss


def _packed(rule, inputs, cu, strategy, state0):
    leaves, flat = _leaves(inputs)
    state, sflat = _state_leaves(state0)
    y, st = rule(**leaves, state=state, strategy=strategy, cu_seqlens=cu)
    grads = torch.autograd.grad(_loss(y, st), flat + sflat, allow_unused=True)
    return y.detach(), {k: t.detach() for k, t in st.items()}, grads


def _separate(rule, inputs, cu, strategy, state0):
    leaves, flat = _leaves(inputs)
    state, sflat = _state_leaves(state0)
    ys, states = [], []
    bounds = cu.tolist()
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        row = None if state is None else {k: t[i : i + 1] for k, t in state.items()}
        y, st = rule(**_cut(leaves, a, b), state=row, strategy=strategy)
        ys.append(y)
        states.append(st)
    y = torch.cat(ys, dim=1)
    st = {k: torch.cat([s[k] for s in states], dim=0) for k in states[0]}
    grads = torch.autograd.grad(_loss(y, st), flat + sflat, allow_unused=True)
    return y.detach(), {k: t.detach() for k, t in st.items()}, grads


def _close(ref, got, what):
    (ya, sa, ga), (yb, sb, gb) = ref, got
    torch.testing.assert_close(yb, ya, rtol=TOL, atol=TOL, msg=lambda m: f"{what}, outputs: {m}")
    assert set(sa) == set(sb), what
    for key in sa:
        assert sa[key].shape[0] == len(LENGTHS), f"{what}: state[{key!r}] has no row per document"
        torch.testing.assert_close(sb[key], sa[key], rtol=TOL, atol=TOL,
                                   msg=lambda m, key=key: f"{what}, state[{key!r}]: {m}")
    assert len(ga) == len(gb)
    for i, (x, y) in enumerate(zip(ga, gb)):
        if x is None or y is None:
            assert (x is None or not x.abs().any()) and (y is None or not y.abs().any()), f"{what}: gradient {i}"
            continue
        torch.testing.assert_close(y, x, rtol=TOL, atol=TOL, msg=lambda m, i=i: f"{what}, gradient {i}: {m}")


@pytest.mark.parametrize("rule_name,anchor", _cases(), ids=lambda x: str(x))
def test_packed_call_equals_one_call_per_document(rule_name, anchor):
    spec = {"use": rule_name}
    if "preset" in get_registry().get("rule", rule_name).capabilities:
        spec["anchor"] = anchor
    torch.manual_seed(0)
    try:
        rule = ac.build_rule(spec, heads=H, d_key=D, d_value=D).double()
    except SpecError as exc:  # a rule may refuse an anchor (a per-token gradient point)
        assert anchor != 1 and "anchor" in str(exc), exc
        return
    cu = _cu(LENGTHS)
    inputs = _inputs(rule, 1, int(cu[-1]), seed=1)
    # a non-zero start state per document: the states after 3 tokens of 5 other sequences
    warm = rule(**_inputs(rule, len(LENGTHS), 3, seed=5), strategy="core:sequential")[1]
    strategies = _strategies(rule)
    assert "core:sequential" in strategies
    for strategy in strategies:
        for state0 in (None, warm):
            what = f"{rule_name} anchor={anchor} under {strategy}, {'warm' if state0 else 'fresh'} start"
            _close(_separate(rule, inputs, cu, strategy, state0),
                   _packed(rule, inputs, cu, strategy, state0), what)


def test_documents_do_not_leak():
    """Changing one document changes no output of another."""
    rule = ac.build_rule({"use": "titans:titans"}, heads=H, d_key=D, d_value=D).double()
    cu = _cu((4, 6, 3))
    inputs = _inputs(rule, 1, 13, seed=2)
    y0 = rule(**inputs, cu_seqlens=cu)[0]
    changed = {**inputs, "v": inputs["v"].clone()}
    changed["v"][:, 4:10] += 1.0
    y1 = rule(**changed, cu_seqlens=cu)[0]
    assert torch.equal(y0[:, :4], y1[:, :4]) and torch.equal(y0[:, 10:], y1[:, 10:])
    assert not torch.equal(y0[:, 4:10], y1[:, 4:10])


@pytest.mark.parametrize("bad,words", [
    (torch.tensor([1, 13]), "must start at 0"),
    (torch.tensor([0, 12]), "must end at the number of tokens T = 13"),
    (torch.tensor([0, 8, 5, 13]), "strictly increasing"),
    (torch.tensor([0, 5, 5, 13]), "drop empty documents"),
    (torch.tensor([0.0, 13.0]), "integer tensor"),
    (torch.tensor([[0, 13]]), "one-dimensional"),
    ([0, 13], "must be a torch.Tensor"),
])
def test_a_bad_cu_seqlens_is_named(bad, words):
    rule = ac.build_rule({"use": "titans:titans"}, heads=H, d_key=D, d_value=D).double()
    with pytest.raises(ValueError, match=words) as info:
        rule(**_inputs(rule, 1, 13, seed=3), cu_seqlens=bad)
    assert "cu_seqlens" in str(info.value)


def test_batch_other_than_one_and_a_state_without_a_row_per_document_are_refused():
    rule = ac.build_rule({"use": "titans:titans"}, heads=H, d_key=D, d_value=D).double()
    with pytest.raises(ValueError, match="batch size 1"):
        rule(**_inputs(rule, 2, 13, seed=3), cu_seqlens=torch.tensor([0, 13]))
    state = rule(**_inputs(rule, 1, 3, seed=3))[1]
    with pytest.raises(ValueError, match="one row per document: batch N = 2"):
        rule(**_inputs(rule, 1, 13, seed=3), state=state, cu_seqlens=torch.tensor([0, 6, 13]))


def test_check_cu_seqlens_returns_the_boundaries():
    assert check_cu_seqlens(torch.tensor([0, 1, 4], dtype=torch.int32), 4) == [0, 1, 4]


@pytest.mark.parametrize("carried", [False, True])
def test_packed_short_conv_equals_one_conv_per_document(carried):
    torch.manual_seed(0)
    conv = ShortConv(3, 4).double()
    lengths = (1, 5, 2, 6)
    cu = _cu(lengths).tolist()
    x = torch.randn(1, sum(lengths), 3, dtype=torch.float64, requires_grad=True)
    cache = torch.randn(len(lengths), 3, 3, dtype=torch.float64, requires_grad=True) if carried else None
    y, new = packed_short_conv(conv, x, cache, cu)
    ys, caches = [], []
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        yi, ci = conv(x[:, a:b], None if cache is None else cache[i : i + 1])
        ys.append(yi)
        caches.append(ci)
    ref_y, ref_c = torch.cat(ys, 1), torch.cat(caches, 0)
    torch.testing.assert_close(y, ref_y, rtol=TOL, atol=TOL)
    torch.testing.assert_close(new, ref_c, rtol=TOL, atol=TOL)
    wrt = [x, conv.weight] + ([cache] if carried else [])
    g = torch.randn(y.shape, dtype=torch.float64)
    ga = torch.autograd.grad((y * g).sum() + new.sum(), wrt)
    gb = torch.autograd.grad((ref_y * g).sum() + ref_c.sum(), wrt)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, rtol=TOL, atol=TOL)


def test_documents_at_different_anchor_positions_continue_exactly():
    """Per-document states at different positions inside their anchor blocks (documents of equal
    length, so only the position keeps them from one batched call) continue as separate calls."""
    torch.manual_seed(0)
    rule = ac.build_rule({"use": "titans:titans", "anchor": 4}, heads=H, d_key=D, d_value=D).double()
    strategy = {"use": "core:chunkwise", "chunk_size": 2}
    a = rule(**_inputs(rule, 1, 3, seed=8), strategy=strategy)[1]
    b = rule(**_inputs(rule, 1, 6, seed=9), strategy=strategy)[1]
    state0 = {k: torch.cat([a[k], b[k], a[k]], dim=0) for k in a}
    assert state0["anchor.pos"].tolist() == [3, 2, 3]
    cu = _cu((5, 5, 5))
    inputs = _inputs(rule, 1, 15, seed=10)
    ref = _separate(rule, inputs, cu, strategy, state0)
    got = _packed(rule, inputs, cu, strategy, state0)
    torch.testing.assert_close(got[0], ref[0], rtol=TOL, atol=TOL)
    for key in ref[1]:
        torch.testing.assert_close(got[1][key], ref[1][key], rtol=TOL, atol=TOL)
    for x, y in zip(ref[2], got[2]):
        if x is not None:
            torch.testing.assert_close(y, x, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("memory", [
    {"use": "titans:titans", "parallel": {"use": "core:exact_chunk", "chunk_size": 4}},
    {"use": "omega:omeganet", "parallel": "core:sequential"},
])
def test_memory_layer_packed_with_carried_states(memory):
    """A layer call over packed documents, each continuing its own carried state (convolution
    inputs and rule state), equals one layer call per document."""
    from atlas_core.layer import MemoryLayer

    torch.manual_seed(0)
    layer = MemoryLayer.from_spec({"memory": memory, "layer": {"conv_size": 3}}, d_model=8, heads=2).double()
    lengths = (2, 5, 1, 5)
    cu = _cu(lengths)
    x = torch.randn(1, sum(lengths), 8, dtype=torch.float64)
    _, warm = layer(torch.randn(len(lengths), 3, 8, dtype=torch.float64))
    y, state = layer(x, warm, cu_seqlens=cu)
    b = cu.tolist()
    parts = [layer(x[:, a:c], {k: t[i : i + 1] for k, t in warm.items()}) for i, (a, c) in enumerate(zip(b, b[1:]))]
    torch.testing.assert_close(y, torch.cat([p[0] for p in parts], 1), rtol=TOL, atol=TOL)
    assert set(state) == set(warm) and any(k.startswith("conv.") for k in state)
    for key in state:
        torch.testing.assert_close(state[key], torch.cat([p[1][key] for p in parts], 0), rtol=TOL, atol=TOL)
