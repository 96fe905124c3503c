"""Deep memory (titans:mlp) with anchor A under ``atlas_muon:atlas_parallel`` (C dividing A) against
the hand-written anchored loop of loops.py and core:sequential on the same rule."""

import pytest
import torch
import torch.nn.functional as F

from .conftest import make_inputs
from .loops import muon_mlp_loop
from .test_muon_rule import _initial_weights, deep_rule


@pytest.mark.parametrize("window,read,C,anchor", [(1, "after", 4, 4), (8, "before", 3, 3), (1, "before", 2, 6)],
                         ids=["c1-after-C4-A4", "c8-before-C3-A3", "c1-before-C2-A6"])
def test_deep_chunks_equal_the_hand_written_anchored_loop(window, read, C, anchor):
    rule = deep_rule(window, read, anchor=anchor)
    per_token = deep_rule(window, read)
    per_token.load_state_dict(rule.state_dict())  # the same initial memory, anchor = 1
    q, k, v, gates = make_inputs(T=10)
    if window > 1:  # the hand loop weighs every window term 1
        gates["gamma"] = torch.ones_like(gates["alpha"])
    with torch.no_grad():
        y, state = rule(q, k, v, gates=gates, strategy={"use": "atlas_muon:atlas_parallel", "chunk_size": C})
        y_seq, s_seq = rule(q, k, v, gates=gates, strategy="core:sequential")
        y_tok, _ = per_token(q, k, v, gates=gates, strategy="core:sequential")
    y_ref, Ws, Zs = muon_mlp_loop(_initial_weights(rule), q, k, v, gates, F.silu, window=window,
                                  read=read, anchor_every=anchor)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    for i, (w, z) in enumerate(zip(Ws, Zs), start=1):
        torch.testing.assert_close(state[f"W{i}"], w, rtol=0, atol=1e-10)
        torch.testing.assert_close(state[f"Z.W{i}"], z, rtol=0, atol=1e-10)
    # the reference loop computes the same anchored function, anchor entries included
    torch.testing.assert_close(y_seq, y, rtol=0, atol=1e-10)
    assert set(s_seq) == set(state) and {"anchor.pos", "anchor.W1", "anchor.W2"} <= set(state)
    for key in state:
        torch.testing.assert_close(state[key], s_seq[key], rtol=0, atol=1e-10, msg=key)
    assert (y - y_tok).abs().max() > 1e-6  # the anchoring is real
