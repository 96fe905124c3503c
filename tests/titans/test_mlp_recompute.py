"""``core:chunkwise`` on the deep memory ``titans:mlp`` (the dual form) with bounded training
memory (atlas_core/forms/recompute.py): per-chunk recomputation and the segment grid
(``memory_budget_mib``) give the same outputs, final state and gradients as the plain run and the
sequential reference, float64."""

from __future__ import annotations

import pytest
import torch

from atlas_core.strategies.chunkwise import Chunkwise, ChunkwiseParams

from .test_mlp_dual import CASES, DT, make, run

MODES = {
    "per-chunk": {"checkpoint": True},
    "segments": {"memory_budget_mib": 1e-9},
    "segments-and-chunks": {"checkpoint": True, "memory_budget_mib": 1e-9},
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("case", [CASES[2], CASES[5]], ids=["mom-after", "mom-win3-before"])
def test_bounded_memory_equals_plain_and_reference(case, mode):
    rule, q, k, v, gates = make(*case, T=29, anchor=4)
    leaves = [q, k, v, *gates.values()]
    for x in leaves:
        x.requires_grad_(True)
    params = list(rule.parameters())

    def grads(strategy):
        y, state = strategy(rule)
        g = torch.Generator().manual_seed(7)
        loss = (y * torch.randn(y.shape, generator=g, dtype=DT)).sum()
        for key in sorted(state):
            loss = loss + (state[key] * torch.randn(state[key].shape, generator=g, dtype=DT)).sum()
        return (y, state), torch.autograd.grad(loss, leaves + params)

    def chunked(**kw):
        strat = Chunkwise(ChunkwiseParams(chunk_size=4, **kw))
        return lambda r: run(strat, r, q, k, v, gates)

    plain_out, plain = grads(chunked(checkpoint=False, memory_budget_mib=None))
    out, got = grads(chunked(**MODES[mode]))
    ref_out, ref = grads(lambda r: r.reference(r.prepare(q, k, v, gates)))
    torch.testing.assert_close(out[0], plain_out[0], rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(out[0], ref_out[0], rtol=1e-10, atol=1e-12)
    assert set(out[1]) == set(ref_out[1])
    for key in out[1]:
        torch.testing.assert_close(out[1][key], plain_out[1][key], rtol=1e-12, atol=1e-13)
    for a, b, c in zip(got, plain, ref):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)
        torch.testing.assert_close(a, c, rtol=1e-9, atol=1e-11)
