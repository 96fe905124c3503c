import pytest
import torch

DT = torch.float64


@pytest.fixture(autouse=True)
def _seed():
    """Every test draws from a seeded global generator: results do not depend on test order."""
    torch.manual_seed(0)


def make_inputs(B=2, T=11, H=2, Dk=4, Dv=4, dtype=DT, seed=0, gamma=False, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, Dk, generator=g, dtype=dtype)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, Dk, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(B, T, H, Dv, generator=g, dtype=dtype)
    gates = {
        "alpha": 0.8 + 0.2 * torch.rand(B, T, H, generator=g, dtype=dtype),
        "eta": 0.9 * torch.rand(B, T, H, generator=g, dtype=dtype),
        "theta": 0.05 + 0.2 * torch.rand(B, T, H, generator=g, dtype=dtype),
    }
    if gamma:
        gates["gamma"] = torch.rand(B, T, H, generator=g, dtype=dtype)
    if requires_grad:
        for t in (q, k, v, *gates.values()):
            t.requires_grad_(True)
    return q, k, v, gates
