"""Per-key decay: ``zoo:gla`` and ``zoo:kda`` against fla-core's reference loops, and the exact
chunked forms of per-key decay (``core:exact_chunk``, ``core:chunkwise``) against the reference.

Map (docs/zoo.md): our ``M = S^T``; ``alpha = exp(gk)`` per key dimension; ``theta`` = fla's
``beta`` (KDA) or 1 (GLA, whose writes carry no strength); q as given (fla's GLA multiplies q by
``1/sqrt(Dk)`` inside, so our q is divided by it first; KDA takes ``scale = 1``). fla's loops
compute in float32, so those comparisons are at float32 accuracy; ours run in float64.
"""

from __future__ import annotations

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import SpecError, StrategyError
from atlas_core.forms.key_decay_chunk import decayed_scores

from ..fla_refs import fla_reference
from .strategies import accepting

B, T, H, D = 2, 40, 3, 8
DT = torch.float64


def _inputs(seed=0, lo=0.7, hi=0.999, dtype=DT):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=g, dtype=dtype) for _ in range(3))
    k = torch.nn.functional.normalize(k, dim=-1)
    alpha = lo + (hi - lo) * torch.rand(B, T, H, D, generator=g, dtype=dtype)  # per key
    beta = 0.1 + 0.8 * torch.rand(B, T, H, generator=g, dtype=dtype)
    S0 = 0.5 * torch.randn(B, H, D, D, generator=g, dtype=dtype)  # fla's [K, V] initial state
    return q, k, v, alpha, beta, S0


def _ours(spec, gates, q, k, v, M0):
    """(y, M) under every strategy that accepts the rule, one call and three; each split run must
    equal its one-call run to float64 rounding. Returns the results and the strategies that ran."""
    rule = ac.build_rule(spec, heads=H, d_key=D, d_value=D).double()
    results, ran = [], []
    for strategy in accepting(rule, chunks=(1, 5, 16, 64)):
        with torch.no_grad():
            y, st = rule(q, k, v, gates=gates, state={"M": M0}, strategy=strategy)
            ys, s = [], {"M": M0}
            for a, b in ((0, 7), (7, 23), (23, T)):
                yy, s = rule(q[:, a:b], k[:, a:b], v[:, a:b], gates={n: x[:, a:b] for n, x in gates.items()},
                             state=s, strategy=strategy)
                ys.append(yy)
        torch.testing.assert_close(torch.cat(ys, 1), y, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(s["M"], st["M"], rtol=1e-10, atol=1e-10)
        results.append((y, st["M"]))
        ran.append(strategy)
    return results, ran


def _check(results, y_ref, S_ref, tol=1e-5):
    scale = max(1.0, float(y_ref.abs().max()))
    for y, M in results:
        torch.testing.assert_close(y.float(), y_ref.float(), rtol=tol, atol=tol * scale)
        torch.testing.assert_close(M.float(), S_ref.float().transpose(-1, -2), rtol=tol, atol=tol * scale)


def _names(ran):
    return {s if isinstance(s, str) else s["use"] for s in ran}


def test_gla_equals_fla():
    ref = fla_reference("ops/gla/naive.py")
    q, k, v, alpha, _, S0 = _inputs(1)
    y_ref, S_ref = ref.naive_recurrent_gla(q, k, v, alpha.log(), initial_state=S0, output_final_state=True)
    gates = {"alpha": alpha, "theta": torch.ones(B, T, H, dtype=DT)}
    # fla scales q by 1/sqrt(K) inside its loop; our rule reads with q as given
    results, ran = _ours("zoo:gla", gates, q * D ** -0.5, k, v, S0.transpose(-1, -2))
    assert {"core:sequential", "core:exact_chunk", "core:chunkwise"} <= _names(ran)
    _check(results, y_ref, S_ref)


def test_kda_equals_fla():
    ref = fla_reference("ops/kda/naive.py")
    q, k, v, alpha, beta, S0 = _inputs(2)
    y_ref, S_ref = ref.naive_recurrent_kda(q, k, v, alpha.log(), beta, scale=1.0, initial_state=S0.float(),
                                           output_final_state=True)
    gates = {"alpha": alpha, "theta": beta}
    results, ran = _ours("zoo:kda", gates, q, k, v, S0.transpose(-1, -2))
    assert _names(ran) == {"core:sequential", "core:exact_chunk"}  # chunkwise: no shared anchor
    _check(results, y_ref, S_ref)


def test_kda_is_not_the_current_gradient_rule():
    """KDA takes the gradient at the decayed memory: the same gates with the gradient at M_{t-1}
    (zoo:key_decay + l2) give another function, which every strategy also runs exactly."""
    q, k, v, alpha, beta, S0 = _inputs(3, lo=0.5, hi=0.9)
    gates = {"alpha": alpha, "theta": beta}
    kda, _ = _ours("zoo:kda", gates, q, k, v, S0)
    cur, ran = _ours({"use": "zoo:kda", "retention": "zoo:key_decay"}, gates, q, k, v, S0)
    assert "core:exact_chunk" in _names(ran)
    for y, M in cur[1:]:
        torch.testing.assert_close(y, cur[0][0], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(M, cur[0][1], rtol=1e-9, atol=1e-9)
    assert (kda[0][0] - cur[0][0]).abs().max() > 1e-2


@pytest.mark.parametrize("preset, scalar", [("zoo:gla", "zoo:simple_gla"), ("zoo:kda", "zoo:gated_deltanet")])
def test_equal_keys_reduce_to_the_scalar_presets(preset, scalar):
    """A per-key factor with every key equal is the per-head rule: GLA -> simple GLA, KDA ->
    Gated DeltaNet (both read, neither computed from the other's code path)."""
    q, k, v, alpha, beta, S0 = _inputs(4)
    a = alpha[..., 0]
    keyed = ac.build_rule(preset, heads=H, d_key=D, d_value=D).double()
    head = ac.build_rule(scalar, heads=H, d_key=D, d_value=D).double()
    with torch.no_grad():
        y1, s1 = keyed(q, k, v, gates={"alpha": a[..., None].expand(B, T, H, D), "theta": beta},
                       state={"M": S0}, strategy="core:sequential")
        y2, s2 = head(q, k, v, gates={"alpha": a, "theta": beta}, state={"M": S0}, strategy="core:sequential")
    torch.testing.assert_close(y1, y2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s1["M"], s2["M"], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("spec", [
    "zoo:gla", "zoo:kda", {"use": "zoo:kda", "retention": "zoo:key_decay"},
    {"use": "zoo:gla", "read": "before"}, {"use": "zoo:kda", "read": "before"},
], ids=str)
@pytest.mark.parametrize("lo, hi", [(0.45, 0.55), (0.01, 0.1)])
def test_exact_chunk_is_safe_for_strong_decay_in_float32(spec, lo, hi):
    """A 64-token chunk with alpha near 0.5 (cumulative decay 2^-64), and near 0.05 (e^-190:
    a ratio of cumulative products overflows float32 there), one key's gate exactly 0, in
    float32, against the float64 reference loop: outputs, final state and gradients finite and
    close (the gradient at the zero gate itself is 0 in the chunked forms, see `decay.safe_log`)."""
    q, k, v, alpha, beta, S0 = _inputs(5, lo=lo, hi=hi)
    alpha = alpha.clone()
    alpha[..., : D // 2] = 0.97 + 0.02 * alpha[..., : D // 2]  # some keys keep a long memory
    alpha[:, 30, :, -1] = 0.0  # a key cleared exactly
    gates = {"alpha": alpha, "theta": beta}
    rule = ac.build_rule(spec, heads=H, d_key=D, d_value=D)

    def run(dtype, strategy):
        leaves = [x.to(dtype).requires_grad_(True) for x in (q, k, v, alpha, beta, S0)]
        qq, kk, vv, aa, bb, ss = leaves
        y, st = rule.to(dtype)(qq, kk, vv, gates={"alpha": aa, "theta": bb}, state={"M": ss}, strategy=strategy)
        loss = (y * torch.linspace(-1, 1, y.numel(), dtype=dtype).view_as(y)).sum() + st["M"].sum()
        return y.detach(), st["M"].detach(), torch.autograd.grad(loss, leaves)

    y_ref, M_ref, g_ref = run(torch.float64, "core:sequential")
    y, M, grads = run(torch.float32, {"use": "core:exact_chunk", "chunk_size": 64})
    assert torch.isfinite(y).all() and torch.isfinite(M).all()
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(M.double(), M_ref, rtol=1e-4, atol=1e-4)
    for i, (g, gr) in enumerate(zip(grads, g_ref)):
        assert torch.isfinite(g).all(), f"gradient {i} is not finite"
        if i == 3:  # d alpha at a gate of exactly 0: 0 in the chunked forms (decay.safe_log)
            zero = alpha == 0
            assert not g[zero].any()
            g, gr = g.masked_fill(zero, 0.0), gr.masked_fill(zero, 0.0)
        scale = max(1.0, float(gr.abs().max()))
        torch.testing.assert_close(g.double(), gr, rtol=1e-3, atol=1e-4 * scale, msg=f"gradient {i}")
    del gates


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("lo", [0.3, 1e-5])
@pytest.mark.parametrize("C, block", [(1, None), (7, 3), (16, None), (37, 8), (40, 1), (64, None), (70, None)])
def test_decayed_scores_equal_the_pairwise_sum(C, block, strict, lo):
    """Both forms (factored through sub-block starts, picked when no key decays by more than e^30
    over a sub-block; pairwise, forced by ``block`` or picked for gates near 0) equal the sum."""
    g = torch.Generator().manual_seed(C)
    rows, cols = torch.randn(2, 2, C, 5, generator=g, dtype=DT)
    b = torch.log(lo + (1 - lo) * torch.rand(2, C, 5, generator=g, dtype=DT)).cumsum(-2)
    r = torch.cat([torch.zeros_like(b[:, :1]), b[:, :-1]], dim=1) if strict else b
    want = torch.zeros(2, C, C, dtype=DT)
    for t in range(C):
        for i in range(t if strict else t + 1):
            want[:, t, i] = (rows[:, t] * cols[:, i] * torch.exp(r[:, t] - b[:, i])).sum(-1)
    torch.testing.assert_close(decayed_scores(rows, r, cols, b, strict=strict, block=block), want,
                               rtol=1e-12, atol=1e-12)


def test_compositions_that_cannot_decay_per_key_are_refused():
    with pytest.raises(SpecError, match="cannot apply"):
        ac.build_rule({"use": "zoo:gla", "structure": "titans:mlp"})
    with pytest.raises(SpecError, match="changes the key dimension"):
        ac.build_rule({"use": "zoo:gla", "feature_map": {"use": "omega:poly", "mode": "tensor", "degree": 2, "dim": 16}})
    with pytest.raises(SpecError, match="anchor"):
        ac.build_rule({"use": "zoo:kda", "anchor": 16})
    mom = ac.build_rule({"use": "zoo:gla", "algorithm": "core:momentum"}, heads=H, d_key=D, d_value=D)
    for strategy, words in (({"use": "core:exact_chunk", "chunk_size": 8}, "core:gd"),
                            ({"use": "core:chunkwise", "chunk_size": 8}, "per key")):
        with pytest.raises(StrategyError, match=words):
            mom.runner(strategy)
    with pytest.raises(StrategyError, match="decayed memory"):  # KDA: no anchor a chunk could share
        ac.build_rule("zoo:kda").runner({"use": "core:chunkwise", "chunk_size": 1})


def test_the_cuda_backend_refuses_per_key_decay():
    from atlas_core.strategies.chunkwise import Chunkwise, ChunkwiseParams
    from atlas_plugins.cuda_backend.backend_chunk import ChunkLinearBackend

    rule = ac.build_rule("zoo:gla", heads=H, d_key=D, d_value=D)
    q, k, v, alpha, beta, _ = _inputs(6, dtype=torch.float32)
    p = rule.prepare(q, k, v, gates={"alpha": alpha, "theta": beta})
    ok, why = ChunkLinearBackend().verify(Chunkwise(ChunkwiseParams(chunk_size=8)), rule, p)
    assert not ok and "per key" in why


def test_a_per_key_gate_of_the_wrong_shape_is_named():
    rule = ac.build_rule("zoo:gla", heads=H, d_key=D, d_value=D)
    q, k, v, alpha, beta, _ = _inputs(7, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"gates\['alpha'\] must have 4 dimensions \[B, T, H, Dk\]"):
        rule(q, k, v, gates={"alpha": alpha[..., 0], "theta": beta})


def test_the_memory_layer_makes_a_per_key_alpha_gate():
    from atlas_core.layer import LayerParams, MemoryLayer

    torch.manual_seed(0)
    layer = MemoryLayer(12, 3, ac.build_rule("zoo:gla"), LayerParams(), strategy="core:sequential")
    x = torch.randn(2, 5, 12)
    gates = layer.gates(x)
    assert gates["alpha"].shape == (2, 5, 3, layer.d_key)
    assert abs(float(gates["alpha"].detach().mean()) - float(torch.sigmoid(torch.tensor(3.0)))) < 0.02
    y, _ = layer(x)
    assert y.shape == x.shape and torch.isfinite(y).all()


@pytest.mark.parametrize("lo, form", [(0.5, "factored"), (1e-4, "pairwise")])
def test_decayed_scores_pick_a_safe_form_in_float32(lo, form):
    """float32 scores of 64 tokens: mild decays take the factored form, decays beyond e^30 per
    8 tokens the pairwise one; both equal the float64 pairwise sum to float32 accuracy."""
    from atlas_core.forms.key_decay_chunk import _RANGE, _max_range

    g = torch.Generator().manual_seed(3)
    rows, cols = torch.randn(2, 4, 64, 16, generator=g, dtype=DT)
    b = torch.log(lo * (1 + torch.rand(4, 64, 16, generator=g, dtype=DT))).cumsum(-2)  # a in [lo, 2 lo]
    r = torch.cat([torch.zeros_like(b[:, :1]), b[:, :-1]], dim=1)
    assert (_max_range(b.float(), 8) > _RANGE[torch.float32]) == (form == "pairwise")
    want = decayed_scores(rows, r, cols, b, strict=True, block=1)  # float64, every pair on its own
    got = decayed_scores(rows.float(), r.float(), cols.float(), b.float(), strict=True)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("read", ["after", "before"])
def test_chunkwise_runs_an_anchored_per_key_delta_rule(read):
    """The delta rule with per-key decay and gradients anchored at 16-token blocks (zoo:key_decay +
    l2, anchor 16): core:chunkwise (chunks 8 and 16, a call split inside a block) equals the
    reference loop, outputs, final state and gradients, in float64."""
    rule = ac.build_rule({"use": "zoo:kda", "retention": "zoo:key_decay", "anchor": 16, "read": read},
                         heads=H, d_key=D, d_value=D).double()
    q, k, v, alpha, beta, S0 = _inputs(8, lo=0.5, hi=0.99)

    def run(strategy, cuts=()):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v, alpha, beta)]
        qq, kk, vv, aa, bb = leaves
        st, ys, edges = None, [], [0, *cuts, T]
        for a, b in zip(edges, edges[1:]):
            y, st = rule(qq[:, a:b], kk[:, a:b], vv[:, a:b], gates={"alpha": aa[:, a:b], "theta": bb[:, a:b]},
                         state=st, strategy=strategy)
            ys.append(y)
        y = torch.cat(ys, 1)
        loss = (y * torch.linspace(-1, 1, y.numel(), dtype=DT).view_as(y)).sum() + st["M"].pow(2).sum()
        return y.detach(), st["M"].detach(), torch.autograd.grad(loss, leaves)

    ref = run("core:sequential")
    for C, cuts in ((16, ()), (8, ()), (8, (21,))):
        got = run({"use": "core:chunkwise", "chunk_size": C}, cuts)
        for a, b in zip((ref[0], ref[1], *ref[2]), (got[0], got[1], *got[2])):
            torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-9)


def test_the_zoo_benchmark_runs_and_agrees(capsys):
    """benchmarks/bench_zoo.py at a tiny size: every row's outputs equal fla's (it asserts so)."""
    import importlib.util
    from pathlib import Path

    fla_reference("ops/kda/naive.py")  # skips without fla-core, as the benchmark needs it
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_zoo.py"
    spec = importlib.util.spec_from_file_location("_bench_zoo", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--T", "64", "--H", "1", "--D", "8", "--C", "16", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("| `zoo:") == 8 and "`zoo:kda` | `core:exact_chunk`" in out
