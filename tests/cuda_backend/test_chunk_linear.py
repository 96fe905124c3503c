"""``cuda:chunk_linear`` (Triton, forward and backward) against ``core:chunkwise``'s PyTorch code
and against the rule itself (``core:sequential``): a backend never changes the function.

The kernel takes each chunk's gradients at the chunk's start memory, so it serves rules whose
anchor equals the chunk size, on calls that cover whole anchor blocks, and per-token rules with the
prediction-free dot bias (anchoring changes nothing there) at any T. Every case carries a random
initial state (memory, momentum, Omega window buffer); the dot cases at anchor 1 use a T that is
not a multiple of the chunk size. Checked: the output, every final-state entry (the anchor entries
included) and the gradients w.r.t. q, k, v, every gate and every differentiable initial-state
entry: relative RMS error <= 1e-5 (kernel in float32, references in float64). Runs in Triton's CPU
interpreter (see conftest.py).
"""

from __future__ import annotations

import pytest
import torch
import triton  # noqa: F401 - without Triton this module must fail, not skip

import atlas_core as ac
from atlas_core.knobs.bias import Bias

from .oracle import B, D, H, compare, make_leaves, make_rule, rel_rms, run

pytestmark = pytest.mark.triton
TOL = 1e-5

# (bias, algorithm, read, window, chunk size, T, gamma mode, retention, anchor)
CASES = [
    ("l2", "gd", "after", 1, 4, 20, "gate", "core:decay", 4),
    ("l2", "gd", "before", 1, 16, 48, "gate", "core:decay", 16),
    ("l2", "momentum", "after", 1, 8, 24, "gate", "core:decay", 8),
    ("l2", "momentum", "before", 4, 8, 24, "gate", "core:decay", 8),
    ("dot", "gd", "after", 4, 4, 21, "gate", "core:decay", 1),  # per-token dot: any T
    ("dot", "momentum", "before", 1, 16, 21, "gate", "core:none", 1),
    ("l2", "gd", "after", 16, 16, 32, "gate", "core:decay", 16),
    ("l2", "momentum", "after", 16, 8, 40, "decay", "core:decay", 8),  # window longer than a chunk
    ("dot", "momentum", "after", 16, 16, 32, "uniform", "core:decay", 16),  # anchored dot
    ("l2", "gd", "before", 4, 1, 9, "gate", "core:decay", 1),  # chunk size 1: the per-token rule
    ("l2", "momentum", "after", 4, 32, 64, "gate", "core:none", 32),
]


def _id(case):
    bias, alg, read, c, C, T, gamma, ret, A = case
    return f"{bias}-{alg}-{read}-c{c}-{gamma}-A{A}-C{C}-T{T}-{ret.split(':')[1]}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_matches_pytorch_chunkwise_and_the_rule(case, device):
    bias, alg, read, c, C, T, gamma, ret, A = case
    rule = make_rule(bias, alg, read, c, gamma, ret, anchor=A)
    leaves = make_leaves(rule, T)
    want = run(rule, leaves, chunk_size=C, backend="torch")
    got = run(rule, leaves, chunk_size=C, backend="cuda:chunk_linear", dtype=torch.float32, device=device)
    seq = run(rule, leaves, chunk_size=C, backend="sequential")
    assert set(got[1]) == set(seq[1]) and (A > 1) == ("anchor.M" in got[1])
    for ref, tol in ((want, TOL), (seq, TOL)):
        errs = compare(got, ref)
        bad = {k: f"{v:.2e}" for k, v in errs.items() if not v <= tol}
        assert not bad, f"relative RMS error above {tol}: {bad}"
    # the PyTorch chunk form is the rule itself (float64, to rounding)
    errs = compare(want, seq)
    assert max(errs.values()) <= 1e-10, errs
    # the gradients are not trivially zero (a kernel that dropped a term would not pass this)
    assert all(g.abs().max() > 0 for g in got[2].values())


@pytest.mark.parametrize("momentum", [False, True], ids=["gd", "momentum"])
def test_value_dims_split_across_programs(momentum, device, monkeypatch):
    """Dv above the value block runs on several programs per (batch, head), each carrying its
    rows of M and Z; the gradients that sum over the value dims are added up from the blocks.
    Dv = 40 in blocks of 16: three programs, the last one ragged."""
    from atlas_plugins.cuda_backend import chunk_linear as op

    monkeypatch.setattr(op, "VALUE_BLOCK", 16)
    d, C = 40, 8
    cfg = op.Config.make(C, 4, d, d, "l2", "after", momentum, torch.float32)
    assert cfg.programs(d) == 3 and cfg.programs(d, backward=True) == 3
    rule = make_rule("l2", "momentum" if momentum else "gd", "after", 4, d=d, anchor=C)
    leaves = make_leaves(rule, 24, seed=9, d=d)
    want = run(rule, leaves, chunk_size=C, backend="torch")
    got = run(rule, leaves, chunk_size=C, backend="cuda:chunk_linear", dtype=torch.float32, device=device)
    errs = compare(got, want)
    bad = {k: f"{v:.2e}" for k, v in errs.items() if not v <= TOL}
    assert not bad, f"relative RMS error above {TOL}: {bad}"


def test_chunk_size_one_equals_the_sequential_rule(device):
    rule = make_rule("l2", "momentum", "after", 4)
    leaves = make_leaves(rule, 7, seed=3)
    cast = {k: v.detach() for k, v in leaves.items()}
    gates = {n: cast[n] for n in rule.gate_names}
    state = {k[6:]: v for k, v in cast.items() if k.startswith("state.")}
    y_seq, s_seq = rule(cast["q"], cast["k"], cast["v"], gates=gates, state=state, strategy="core:sequential")
    f = {k: v.float().to(device) for k, v in cast.items()}
    y, s = rule(f["q"], f["k"], f["v"], gates={n: f[n] for n in rule.gate_names},
                state={k[6:]: v for k, v in f.items() if k.startswith("state.")},
                strategy={"use": "core:chunkwise", "chunk_size": 1, "backend": "cuda:chunk_linear"})
    assert rel_rms(y.cpu(), y_seq) <= TOL
    assert rel_rms(s["M"].cpu(), s_seq["M"]) <= TOL and rel_rms(s["Z.M"].cpu(), s_seq["Z.M"]) <= TOL


def test_state_carry_two_calls_equal_one(device):
    """Split on an anchor-block boundary, two kernel calls with the carried state equal one call."""
    rule = make_rule("l2", "momentum", "after", 4, anchor=8)
    leaves = {k: v.detach().float().to(device) for k, v in make_leaves(rule, 24, seed=5).items()}
    strat = {"use": "core:chunkwise", "chunk_size": 8, "backend": "cuda:chunk_linear"}
    gates = {n: leaves[n] for n in rule.gate_names}
    state = {k[6:]: v for k, v in leaves.items() if k.startswith("state.")}
    y, s = rule(leaves["q"], leaves["k"], leaves["v"], gates=gates, state=state, strategy=strat)
    cut = 16

    def part(sl, st):
        return rule(leaves["q"][:, sl], leaves["k"][:, sl], leaves["v"][:, sl],
                    gates={n: g[:, sl] for n, g in gates.items()}, state=st, strategy=strat)

    y1, s1 = part(slice(0, cut), state)
    y2, s2 = part(slice(cut, None), s1)
    assert rel_rms(torch.cat([y1, y2], dim=1), y) <= TOL
    assert set(s2) == set(s) and "anchor.M" in s
    for key in s:
        assert rel_rms(s2[key], s[key]) <= TOL, key


def test_calls_inside_anchor_blocks_fall_back_and_equal_one_call(monkeypatch, device):
    """Not forced, the kernel serves only the calls that cover whole anchor blocks; the others
    (a ragged call, a call starting inside a block) run on PyTorch: any split equals one call and
    decoding one token at a time equals it too."""
    from atlas_plugins.cuda_backend.backend_chunk import ChunkLinearBackend

    calls = []
    real_run = ChunkLinearBackend.run
    monkeypatch.setattr(ChunkLinearBackend, "run",
                        lambda self, strat, rule, p: calls.append(p.shape[2]) or real_run(self, strat, rule, p))
    rule = make_rule("l2", "momentum", "after", 4, anchor=8)
    leaves = {k: v.detach().float().to(device) for k, v in make_leaves(rule, 24, seed=5).items()}
    strat = {"use": "core:chunkwise", "chunk_size": 8}
    gates = {n: leaves[n] for n in rule.gate_names}
    state = {k[6:]: v for k, v in leaves.items() if k.startswith("state.")}

    def pieces(sizes):
        ys, st, i = [], state, 0
        for n in sizes:
            sl = slice(i, i + n)
            y, st = rule(leaves["q"][:, sl], leaves["k"][:, sl], leaves["v"][:, sl],
                         gates={g: x[:, sl] for g, x in gates.items()}, state=st, strategy=strat)
            ys.append(y)
            i += n
        return torch.cat(ys, dim=1), st

    y, s = pieces([24])
    assert calls == [24]
    calls.clear()
    y2, s2 = pieces([12, 12])  # [0, 12) is ragged; [12, 24) runs 4 tokens, then the block [16, 24)
    assert calls == [8]
    calls.clear()
    y3, s3 = pieces([5] + [1] * 19)  # decoding: one-token calls run the sequential step
    assert calls == []
    y_seq, s_seq = rule(leaves["q"], leaves["k"], leaves["v"], gates=gates, state=state, strategy="core:sequential")
    for got_y, got_s in ((y2, s2), (y3, s3), (y_seq, s_seq)):
        assert rel_rms(got_y, y) <= TOL
        assert set(got_s) == set(s)
        for key in s:
            assert rel_rms(got_s[key], s[key]) <= TOL, key


class LearnedLagWindow(Bias):
    """A window bias whose lag weights are a learned tensor (a foreign wrapper around l2)."""

    gamma_gate = True
    error_kind = "l2"  # declared: its error is pred - v (the kernel serves declared kinds only)

    def __init__(self, lag: torch.Tensor) -> None:
        self.window = lag.shape[0]
        self.lag = lag

    def error(self, pred, v):
        return pred - v

    def lag_weights(self, dtype, device):
        return self.lag.to(device=device, dtype=dtype)


def test_learned_lag_weights_get_gradients(device):
    base = make_rule("l2", "gd", "after", 1)
    lag = torch.tensor([1.0, 0.7, 0.5, 0.2], dtype=torch.float64, requires_grad=True)
    rule = ac.ComposedRule(base.structure, LearnedLagWindow(lag), base.retention, base.algorithm,
                           base.feature_map, read="after", anchor=8)
    leaves = make_leaves(rule, 24, seed=7)
    leaves["lag"] = lag
    want = run(rule, leaves, chunk_size=8, backend="torch")
    got = run(rule, leaves, chunk_size=8, backend="cuda:chunk_linear", dtype=torch.float32, device=device)
    errs = compare(got, want)
    assert errs["grad[lag]"] <= TOL and max(errs.values()) <= TOL, errs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_inputs_accumulate_in_float32(dtype, device):
    """Half inputs go through the op directly (the rule itself upcasts): y comes back in the input
    dtype, the state in float32, and everything is close to the float64 reference computed from
    the same rounded inputs (the only rounding left is y's final cast and the products' inputs).
    Under the interpreter the TF32 products are emulated (conftest.py), so these tolerances are the
    GPU's: the state stays within 1e-5 because every product with a computed float32 operand is
    IEEE."""
    from atlas_plugins.cuda_backend.chunk_linear import chunk_linear

    g = torch.Generator().manual_seed(11)
    T, C = 21, 8
    psi, xk = (torch.nn.functional.normalize(torch.randn(B, H, T, D, generator=g), dim=-1) for _ in range(2))
    xv = torch.randn(B, H, T, D, generator=g)
    alpha = 0.5 + 0.45 * torch.rand(B, H, T, generator=g)
    theta = 0.1 + 0.8 * torch.rand(B, H, T, generator=g)
    eta = 0.5 + 0.45 * torch.rand(B, H, T, generator=g)
    m0, z0 = 0.3 * torch.randn(B, H, D, D, generator=g), 0.3 * torch.randn(B, H, D, D, generator=g)
    ones, lag = torch.ones(B, H, T), torch.ones(1)
    half = [t.to(device=device, dtype=dtype).requires_grad_(True) for t in (psi, xk, xv)]
    on = [t.to(device) for t in (ones, alpha, theta, eta, lag, m0, z0)]
    y, M, Z = chunk_linear(*half, *on, chunk_size=C)
    assert y.dtype == dtype and M.dtype == torch.float32 and Z.dtype == torch.float32
    # reference: the same (rounded) inputs through the op in float32 = the PyTorch chunk form
    ref = [t.detach().cpu().float().requires_grad_(True) for t in half]
    rule = make_rule("l2", "momentum", "after", 1, anchor=C)  # the op's function: anchor = chunk
    from atlas_core.rule import MemoryInputs
    from atlas_core.strategies.chunkwise import Chunkwise, ChunkwiseParams

    p = MemoryInputs(psi=ref[0].double(), phik=ref[1].double(), v=ref[2].double(), alpha=alpha.double(),
                     gamma=ones.double(), gates={"alpha": alpha.double(), "eta": eta.double(), "theta": theta.double()},
                     state={"M": m0.double(), "Z.M": z0.double(), "anchor.pos": torch.zeros(B, dtype=torch.float64),
                            "anchor.M": m0.double()})
    y_ref, s_ref = Chunkwise(ChunkwiseParams(chunk_size=C)).run_torch(rule, p)
    tol = {torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    assert rel_rms(y.float().cpu(), y_ref) <= tol
    assert rel_rms(M.cpu(), s_ref["M"]) <= 1e-5 and rel_rms(Z.cpu(), s_ref["Z.M"]) <= 1e-5
    w = torch.randn(y.shape, generator=g)
    (y.float() * w.to(device)).sum().backward()
    (y_ref * w.double()).sum().backward()
    for h, r in zip(half, ref):
        assert h.grad.dtype == dtype
        assert rel_rms(h.grad.float().cpu(), r.grad) <= tol
