"""Shared inputs for the Omega plugin tests (float64, tiny sizes)."""

import pytest
import torch

import atlas_core as ac


@pytest.fixture(autouse=True)
def _one_intra_op_thread():
    """Tiny tensors gain nothing from torch's intra-op threads, and on a busy 2-core machine some
    kernels pay milliseconds per call to wake the pool (a bool ``tril`` in
    `atlas_core.forms.decay.decay_matrix` took ~20 ms per call under load). A workaround
    for test speed only; the previous setting is restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

ALL_GATES = ("alpha", "eta", "theta", "gamma")


def make_inputs(B=2, T=12, H=2, Dk=3, Dv=4, dtype=torch.float64, seed=0, gates=ALL_GATES,
                requires_grad=False):
    """q, k (l2-normalised), v: [B, T, H, D]; gates {name: [B, T, H]} in their docs/math.md ranges."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, Dk, generator=g, dtype=dtype)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, Dk, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(B, T, H, Dv, generator=g, dtype=dtype)
    u = lambda: torch.rand(B, T, H, generator=g, dtype=dtype)  # noqa: E731
    every = {
        "alpha": 0.6 + 0.4 * u(),
        "eta": 0.9 * u(),
        "theta": 0.05 + 0.25 * u(),
        "gamma": u(),
    }
    gates = {n: every[n] for n in gates}
    if requires_grad:
        for t in (q, k, v, *gates.values()):
            t.requires_grad_(True)
    return q, k, v, gates


def window_rule(window, gamma="gate", algorithm="core:gd", read="after", decay=None,
                retention="core:decay", structure="core:linear", feature_map="core:identity",
                inner="core:l2", anchor=1):
    bias = {"use": "omega:window", "window": window, "gamma": gamma, "inner": inner}
    if decay is not None:
        bias["decay"] = decay
    return ac.build_rule({"structure": structure, "bias": bias, "retention": retention,
                          "algorithm": algorithm, "feature_map": feature_map, "read": read,
                          "anchor": anchor})


def gates_for(rule, gates):
    """Only the gates this rule uses."""
    return {n: g for n, g in gates.items() if n in rule.gate_names}


def chunk(C):
    return {"use": "core:chunkwise", "chunk_size": C}


def assert_same(a, b, atol=1e-10):
    """Two ``(y, state)`` results agree: outputs and every state entry (the same keys)."""
    (ya, sa), (yb, sb) = a, b
    torch.testing.assert_close(ya, yb, atol=atol, rtol=0)
    assert set(sa) == set(sb)
    for name in sa:
        torch.testing.assert_close(sa[name], sb[name], atol=atol, rtol=0, msg=f"state[{name!r}]")
