"""core:chunkwise on linear memory never forms a d x d tensor per token (docs/math.md, "Parallel forms")."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import atlas_core as ac

from .conftest import make_inputs


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any operator produces (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.largest = (0, None, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.numel() > self.largest[0]:
                self.largest = (t.numel(), tuple(t.shape), str(func))
        return out


def test_no_per_token_state_tensor_forward_and_backward():
    B, T, H, D, C = 1, 64, 2, 16, 8
    q, k, v, gates = make_inputs(B=B, T=T, H=H, Dk=D, Dv=D, requires_grad=True)
    rule = ac.build_rule({"retention": "core:decay", "algorithm": "core:momentum", "anchor": C})
    with LargestTensor() as probe:
        y, s = rule(q, k, v, gates=gates, strategy={"use": "core:chunkwise", "chunk_size": C})
        (y.sum() + s["M"].sum()).backward()
    per_chunk_states = B * H * C * D * D  # what one [B, H, C, Dv, Dk] tensor would hold
    numel, shape, op = probe.largest
    assert numel < per_chunk_states, f"{op} produced {shape}: a per-token state tensor"
    # the largest are whole-sequence tensors ([B, H, T, D]) and the chunk kernels of all chunks
    # at once ([B, H, T / C, C, C])
    assert numel <= B * H * T * max(C, D)


def test_generic_path_is_per_chunk_not_per_sequence():
    """The deep-memory path materialises per-token weights one chunk at a time only."""
    from atlas_core.strategies.chunkwise import Chunkwise

    B, T, H, D, C = 1, 64, 2, 8, 8
    q, k, v, gates = make_inputs(B=B, T=T, H=H, Dk=D, Dv=D)
    rule = ac.build_rule({"retention": "core:decay", "algorithm": "core:momentum"})
    p = rule.prepare(q, k, v, gates=gates)
    strat = Chunkwise()
    strat.chunk_size = C
    strat.fast_path = lambda r: False
    with LargestTensor() as probe:
        strat.run_torch(rule, p)
    assert probe.largest[0] <= B * H * C * D * D
