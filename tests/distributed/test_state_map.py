"""The chunk maps of a piece from the rule's chunk form (`atlas_core.distributed.state_map`)
carry a memory as the map measured by running the rule does (`context._probe`: the map read
back from `SliceMap.apply` equals it), in float64 to 1e-10, for every family they cover:
the delta rule, Gated DeltaNet (gradient at the decayed memory), KDA (per-key decay) and Omega
(read after and before), Longhorn (a key-dependent weight), Gated DeltaProduct (2 sub-steps a
token), Titans' momentum with and without an anchor (read after and before), an Omega window with
an anchor, gd with decay and an anchor. Slices start at several positions inside anchor blocks
and span several chunks (small chunk sizes); carried through the two halves of a slice (split
calls) a memory ends where the whole slice's map takes it; the gradient of the slice's outputs
and of a loss on its final memory with respect to its initial memory (`SliceMap.read_grad`, with
and without a gradient after the slice) equals autograd's. One process: the maps are per rank
(tests/distributed/test_context_parallel.py checks whole runs over 2 to 5 ranks)."""

from __future__ import annotations

import types

import pytest
import torch

import atlas_core as ac
from atlas_core.distributed import context as cx
from atlas_core.distributed import state_map
from atlas_core.distributed.state_map import analytic_form, positions, slice_map

from . import cases

B, H, D = cases.B, cases.H, cases.D
LINEAR = {"structure": "core:linear", "bias": "core:l2"}
FAMILIES = {
    "delta": ({**LINEAR, "algorithm": "core:gd"}, "exact"),
    "delta_before": ({**LINEAR, "algorithm": "core:gd", "read": "before"}, "exact"),
    "gated_deltanet": ({"use": "zoo:gated_deltanet"}, "exact"),
    "gated_deltanet_before": ({"use": "zoo:gated_deltanet", "read": "before"}, "exact"),
    "longhorn": ({"use": "zoo:longhorn"}, "exact"),
    "gated_delta_product": ({"use": "zoo:gated_delta_product"}, "exact"),
    "kda": ({"use": "zoo:kda"}, "key"),
    "kda_before": ({"use": "zoo:kda", "read": "before"}, "key"),
    "titans": ({"use": "titans:titans"}, "exact"),
    "titans_before": ({"use": "titans:titans", "read": "before"}, "exact"),
    "omeganet": ({"use": "omega:omeganet"}, "exact"),
    "omeganet_before": ({"use": "omega:omeganet", "read": "before"}, "exact"),
    "titans_anchor4": ({"use": "titans:titans", "anchor": 4}, "anchored"),
    "titans_anchor8_before": ({"use": "titans:titans", "anchor": 8, "read": "before"}, "anchored"),
    "omeganet_anchor8": ({"use": "omega:omeganet", "anchor": 8}, "anchored"),
    "gd_decay_anchor4": ({**LINEAR, "algorithm": "core:gd", "retention": "core:decay", "anchor": 4},
                         "anchored"),
}


def _rule(name):
    torch.manual_seed(0)
    return ac.build_rule(dict(FAMILIES[name][0]), heads=H, d_key=D, d_value=D).double()


def _inputs(rule, T: int, pos: int):
    x = cases.inputs(rule, tokens=T, pos=pos)
    return x["q"], x["k"], x["v"], x["gates"], x["state"]


def _split(state):
    keys = sorted(state)
    memory = [key for key in keys if key not in cx.CARRIED]
    return memory, {key: state[key] for key in keys if key in cx.CARRIED}


def _probed(rule, q, k, v, gates, state):
    memory, carried = _split(state)
    call = types.SimpleNamespace(memory_keys=memory, run=lambda q, k, v, g, s: rule(
        q, k, v, gates=g or None, state=s, strategy="core:sequential"))
    return cx._probe(call, q, k, v, gates, carried, cx._rows(state, memory))


def _analytic(rule, q, k, v, gates, state, chunk):
    memory, _ = _split(state)
    return slice_map(rule, rule.prepare(q, k, v, gates or None, state), memory, chunk_size=chunk)


def _chunks(rule):
    return (1, 2, None) if analytic_form(rule) == "anchored" else (1, 3, None)


def _close(a, b, msg):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=msg)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_form_covers_the_family(name):
    assert analytic_form(_rule(name)) == FAMILIES[name][1]


@pytest.fixture(params=["tree", "chunks"], autouse=True)
def composition(request, monkeypatch):
    """Both ways of carrying through a piece's chunk maps, for every form: composed in a tree
    first, or chunk by chunk (at the sizes here the default is the tree)."""
    monkeypatch.setattr(state_map, "TREE_BELOW", 10 ** 9 if request.param == "tree" else 0)
    return request.param


def _read_back(sm, like):
    """``(P, C)`` of a piece from its chunk maps: C from the memory 0, P's columns from basis
    memories (as `context._probe` measures them with the rule)."""
    B_, H_, Dv, n = like.shape
    C = sm.apply(torch.zeros_like(like))
    P = torch.zeros(B_, H_, n, n, dtype=like.dtype)
    eye = torch.eye(n, dtype=like.dtype)
    for lo in range(0, n, Dv):
        hi = min(lo + Dv, n)
        basis = torch.zeros_like(like)
        basis[:, :, :hi - lo] = eye[lo:hi]
        P[..., lo:hi] = (sm.apply(basis) - C)[:, :, :hi - lo].transpose(-1, -2)
    return P, C


@pytest.mark.parametrize("name", list(FAMILIES))
def test_map_equals_the_probed_map(name, composition):
    rule = _rule(name)
    for T, pos in ((13, 0), (30, 1), (5, 3), (16, 0), (21, 6)):
        x = _inputs(rule, T, pos)
        P, C = _probed(rule, *x)
        like = cx._rows(x[-1], _split(x[-1])[0])
        for chunk in _chunks(rule):
            sm = _analytic(rule, *x, chunk)
            assert sm.tree == (composition == "tree")
            got_P, got_C = _read_back(sm, like)
            _close(got_P, P, f"{name} P, T = {T}, pos = {pos}, chunk = {chunk}")
            _close(got_C, C, f"{name} C, T = {T}, pos = {pos}, chunk = {chunk}")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_map_of_split_calls_composes(name):
    """Two calls, the second from the state the first leaves: a memory carried through the
    first's chunk maps, then the second's, ends where the one call's maps take it."""
    rule = _rule(name)
    T, cut = 23, 9
    q, k, v, gates, state = _inputs(rule, T, pos=1)
    memory, _ = _split(state)
    whole = _analytic(rule, q, k, v, gates, state, None)
    head = [x[:, :cut] for x in (q, k, v)], {n: g[:, :cut] for n, g in gates.items()}
    tail = [x[:, cut:] for x in (q, k, v)], {n: g[:, cut:] for n, g in gates.items()}
    first = _analytic(rule, *head[0], head[1], state, None)
    _, mid = rule(*head[0], gates=head[1] or None, state=state, strategy="core:sequential")
    second = _analytic(rule, *tail[0], tail[1], mid, None)
    rows = torch.randn(cx._rows(state, memory).shape, generator=torch.Generator().manual_seed(7),
                       dtype=torch.float64)
    _close(second.apply(first.apply(rows)), whole.apply(rows), name)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_read_grad_equals_autograd(name):
    """With the outputs' gradient alone and with a gradient at the final memory too (a piece of
    a context-parallel slice: the gradient after it carried back with its reads)."""
    rule = _rule(name)
    g = torch.Generator().manual_seed(5)
    for T, pos in ((13, 0), (22, 3), (16, 0)):
        q, k, v, gates, state = _inputs(rule, T, pos)
        memory, carried = _split(state)
        rows = cx._rows(state, memory).clone().requires_grad_(True)
        y, final = rule(q, k, v, gates=gates or None, state={**carried, **cx._unrows(rows, memory)},
                        strategy="core:sequential")
        gy = torch.randn(y.shape, generator=g, dtype=torch.float64)
        after = torch.randn(rows.shape, generator=g, dtype=torch.float64)
        (want,) = torch.autograd.grad((y * gy).sum(), rows, retain_graph=True)
        (want_after,) = torch.autograd.grad((y * gy).sum() + (cx._rows(final, memory) * after).sum(), rows)
        for chunk in _chunks(rule):
            sm = _analytic(rule, q, k, v, gates, state, chunk)
            _close(sm.read_grad(positions(rule, gy)), want, f"{name} T = {T}, pos = {pos}, chunk = {chunk}")
            _close(sm.read_grad(positions(rule, gy), after), want_after,
                   f"{name} with a gradient after, T = {T}, pos = {pos}, chunk = {chunk}")


def test_empty_slice_is_the_identity():
    rule = _rule("titans_anchor4")
    q, k, v, gates, state = _inputs(rule, 0, pos=2)
    sm = _analytic(rule, q, k, v, gates, state, None)
    rows = torch.randn(B, H, D, 3 * D, dtype=torch.float64)
    _close(sm.apply(rows), rows, "apply")
    _close(sm.read_grad(torch.zeros(B, H, 0, D, dtype=torch.float64), rows), rows, "read_grad")


def test_rules_without_a_form_are_probed():
    """An affine rule outside the forms gets None and `context` probes it (momentum with a
    per-key decay, run by tests/distributed/test_context_parallel.py); a deep memory has no
    form."""
    spec = {**LINEAR, "algorithm": "core:momentum", "retention": "zoo:key_decay"}
    assert analytic_form(ac.build_rule(spec, heads=H, d_key=D, d_value=D)) is None
    deep = ac.build_rule({"use": "titans:titans_deep"}, heads=H, d_key=D, d_value=D)
    assert analytic_form(deep) is None
    with pytest.raises(ValueError, match="no chunk form here"):
        slice_map(deep, None, ["M"])


def test_flush_subnormals_is_scoped():
    """Inside, float32 subnormals read as 0; after, the mode is as before (also on an error)."""
    tiny = torch.tensor([1e-39], dtype=torch.float32)
    assert (tiny * 2).item() > 0
    with state_map.flush_subnormals():
        assert (tiny * 2).item() == 0.0
    assert (tiny * 2).item() > 0
    with pytest.raises(RuntimeError), state_map.flush_subnormals():
        raise RuntimeError("inside")
    assert (tiny * 2).item() > 0
