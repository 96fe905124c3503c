"""float64 gradcheck through the whole initial state (memory AND momentum) and every gate, for both
core strategies, with T = 5 not a multiple of the chunk size (test_gradients.py checks M0 only)."""

import pytest
import torch

import atlas_core as ac

from .conftest import make_inputs


@pytest.mark.parametrize("strategy", ["core:sequential", {"use": "core:chunkwise", "chunk_size": 2}],
                         ids=["sequential", "chunkwise-C2"])
@pytest.mark.parametrize("read", ["after", "before"])
def test_gradcheck_initial_momentum_and_every_gate(strategy, read):
    q, k, v, gates = make_inputs(B=1, T=5, H=1, Dk=2, Dv=2, seed=4, requires_grad=True)
    rule = ac.build_rule({"retention": "core:decay", "algorithm": "core:momentum", "read": read},
                         heads=1, d_key=2, d_value=2)
    g = torch.Generator().manual_seed(5)
    M0 = torch.randn(1, 1, 2, 2, generator=g, dtype=torch.float64, requires_grad=True)
    Z0 = torch.randn(1, 1, 2, 2, generator=g, dtype=torch.float64, requires_grad=True)

    def f(q, k, v, M0, Z0, alpha, eta, theta):
        y, s = rule(q, k, v, gates={"alpha": alpha, "eta": eta, "theta": theta},
                    state={"M": M0, "Z.M": Z0}, strategy=strategy)
        return y, s["M"], s["Z.M"]

    args = (q, k, v, M0, Z0, gates["alpha"], gates["eta"], gates["theta"])
    assert torch.autograd.gradcheck(f, args)
