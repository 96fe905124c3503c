import pytest
import torch


def make_inputs(B=2, T=11, H=3, Dk=4, Dv=5, dtype=torch.float64, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, Dk, generator=g, dtype=dtype)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, Dk, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(B, T, H, Dv, generator=g, dtype=dtype)
    gates = {
        "alpha": 0.5 + 0.5 * torch.rand(B, T, H, generator=g, dtype=dtype),
        "eta": torch.rand(B, T, H, generator=g, dtype=dtype),
        "theta": 0.1 + 0.9 * torch.rand(B, T, H, generator=g, dtype=dtype),
    }
    if requires_grad:
        for t in (q, k, v, *gates.values()):
            t.requires_grad_(True)
    return q, k, v, gates


@pytest.fixture
def inputs():
    return make_inputs
