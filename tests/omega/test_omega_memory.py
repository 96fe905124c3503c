"""The Omega window under ``core:chunkwise`` on linear memory uses the banded window matrix inside
each chunk: no operator, forward or backward, allocates a d x d tensor per token (not even per
token of one chunk), also when the window is longer than the chunk."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .conftest import gates_for, make_inputs, window_rule


class LargestAllocation(TorchDispatchMode):
    """The largest storage any operator's output lives in (forward and backward). A view (the
    strategy cuts overlapping chunk windows with ``unfold``) shares its input's storage and
    allocates nothing, so storages, not view shapes, are measured."""

    def __init__(self):
        super().__init__()
        self.largest = (0, None, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                n = t.untyped_storage().nbytes() // t.element_size()
                if n > self.largest[0]:
                    self.largest = (n, tuple(t.shape), str(func))
        return out


@pytest.mark.parametrize("c,C", [(16, 8), (4, 16)], ids=["window-longer-than-chunk", "window-in-chunk"])
def test_no_per_token_state_tensor(c, C):
    B, T, H, D = 1, 64, 2, 32  # D > C + c: a d x d per token stands out from d x window
    q, k, v, gates = make_inputs(B=B, T=T, H=H, Dk=D, Dv=D, requires_grad=True)
    rule = window_rule(c, "gate", "core:momentum", anchor=C)
    with LargestAllocation() as probe:
        y, s = rule(q, k, v, gates=gates_for(rule, gates), strategy={"use": "core:chunkwise", "chunk_size": C})
        (y.sum() + s["M"].sum()).backward()
    numel, shape, op = probe.largest
    assert numel < B * H * C * D * D, f"{op} produced {shape}: a per-token state tensor"
    # the largest are O(T d) tensors: the (window-extended) keys and values, also cut into
    # overlapping [C + c - 1, D] chunk windows, and the C x (C + c - 1) masks of every chunk
    N = T // C
    assert numel <= B * H * max((T + c - 1) * D, N * (C + c - 1) * D, N * C * (C + c - 1)), (shape, op)
