"""Deep memory (titans:mlp) under ``atlas_muon:atlas_parallel`` with C > 1 against the hand-written
anchored loop of loops.py (test_atlas_parallel.py compares it with the rule's own reference)."""

import pytest
import torch
import torch.nn.functional as F

from .conftest import make_inputs
from .loops import muon_mlp_loop
from .test_muon_rule import _initial_weights, deep_rule


@pytest.mark.parametrize("window,read,C", [(1, "after", 4), (8, "before", 3)], ids=["c1-after-C4", "c8-before-C3"])
def test_deep_chunks_equal_the_hand_written_anchored_loop(window, read, C):
    rule = deep_rule(window, read)
    q, k, v, gates = make_inputs(T=10)
    if window > 1:  # the hand loop weighs every window term 1
        gates["gamma"] = torch.ones_like(gates["alpha"])
    with torch.no_grad():
        y, state = rule(q, k, v, gates=gates, strategy={"use": "atlas_muon:atlas_parallel", "chunk_size": C})
        y_seq, _ = rule(q, k, v, gates=gates, strategy="core:sequential")
    y_ref, Ws, Zs = muon_mlp_loop(_initial_weights(rule), q, k, v, gates, F.silu, window=window,
                                  read=read, anchor_every=C)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    for i, (w, z) in enumerate(zip(Ws, Zs), start=1):
        torch.testing.assert_close(state[f"W{i}"], w, rtol=0, atol=1e-10)
        torch.testing.assert_close(state[f"Z.W{i}"], z, rtol=0, atol=1e-10)
    assert (y - y_seq).abs().max() > 1e-6  # the anchoring is real
