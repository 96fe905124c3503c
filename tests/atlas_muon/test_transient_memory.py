"""``atlas_muon:atlas_parallel`` materialises per-token weights (momenta, NS iterates) one chunk at
a time: no operator, forward or backward, allocates an O(T d^2) tensor; the d^2-sized ones hold at
most the C + c - 1 tokens of one chunk's (window-extended) span."""

import pytest
import torch

import atlas_core as ac
from tests.omega.test_omega_memory import LargestAllocation

from .conftest import make_inputs

SPECS = {
    "linear": {"retention": "core:decay", "algorithm": "atlas_muon:muon"},
    "linear-window8": {"use": "atlas_muon:atlas_linear"},
    "deep-window8": {"use": "atlas_muon:atlas", "structure": {"use": "titans:mlp", "expansion": 1.0}},
}


@pytest.mark.parametrize("name", list(SPECS))
def test_transient_memory_is_per_chunk(name):
    B, H, D, C, T = 1, 2, 16, 8, 128
    rule = ac.build_rule(SPECS[name], heads=H, d_key=D, d_value=D).double()
    c = rule.window
    q, k, v, gates = make_inputs(B=B, T=T, H=H, Dk=D, Dv=D, gamma=True, requires_grad=True)
    gates = {n: g for n, g in gates.items() if n in rule.gate_names}
    with LargestAllocation() as probe:
        y, s = rule(q, k, v, gates=gates, strategy={"use": "atlas_muon:atlas_parallel", "chunk_size": C})
        (y.sum() + sum(x.sum() for x in s.values())).backward()
    numel, shape, op = probe.largest
    N = T // C
    per_chunk = (C + c - 1) * D * D  # one chunk's per-token weights over its window span
    assert numel <= B * H * max(per_chunk, N * (C + c - 1) * D, (T + c - 1) * D), (shape, op)
    assert numel < B * H * T * D * D // 4, f"{op} produced {shape}: O(T d^2)"
