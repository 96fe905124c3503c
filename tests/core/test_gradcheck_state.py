"""float64 gradcheck through the whole initial state (memory, momentum and, for an anchored rule
called inside a block, the carried anchor memory) and every gate, for both core strategies, with
T = 5 not a multiple of the chunk size (test_gradients.py checks M0 only)."""

import pytest
import torch

import atlas_core as ac

from .conftest import make_inputs

CASES = [("core:sequential", 1), ("core:sequential", 2), ({"use": "core:chunkwise", "chunk_size": 2}, 2)]
IDS = ["sequential", "sequential-anchor2", "chunkwise-C2-anchor2"]


@pytest.mark.parametrize("strategy,anchor", CASES, ids=IDS)
@pytest.mark.parametrize("read", ["after", "before"])
def test_gradcheck_initial_momentum_and_every_gate(strategy, anchor, read):
    q, k, v, gates = make_inputs(B=1, T=5, H=1, Dk=2, Dv=2, seed=4, requires_grad=True)
    rule = ac.build_rule({"retention": "core:decay", "algorithm": "core:momentum", "read": read,
                          "anchor": anchor}, heads=1, d_key=2, d_value=2)
    g = torch.Generator().manual_seed(5)
    M0 = torch.randn(1, 1, 2, 2, generator=g, dtype=torch.float64, requires_grad=True)
    Z0 = torch.randn(1, 1, 2, 2, generator=g, dtype=torch.float64, requires_grad=True)
    A0 = torch.randn(1, 1, 2, 2, generator=g, dtype=torch.float64, requires_grad=True)

    def f(q, k, v, M0, Z0, A0, alpha, eta, theta):
        state = {"M": M0, "Z.M": Z0}
        if anchor > 1:  # the call starts at position 1 of a block: its first token uses A0
            state.update({"anchor.pos": torch.ones(1, dtype=torch.float64), "anchor.M": A0})
        y, s = rule(q, k, v, gates={"alpha": alpha, "eta": eta, "theta": theta},
                    state=state, strategy=strategy)
        out = (y, s["M"], s["Z.M"])
        return out + ((s["anchor.M"],) if anchor > 1 else (A0 * 1,))

    args = (q, k, v, M0, Z0, A0, gates["alpha"], gates["eta"], gates["theta"])
    assert torch.autograd.gradcheck(f, args)
    if anchor > 1:  # the carried anchor memory is an input that matters
        y, *_ = f(*args)
        (gA,) = torch.autograd.grad(y.sum(), A0)
        assert gA.abs().max() > 0
