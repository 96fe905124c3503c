"""Every MRU scan strategy dispatches to ``cuda:mru_scan`` and matches the loop."""

import pytest
import torch
import triton  # noqa: F401  (a missing Triton fails the run, never skips)

import atlas_core as ac

pytestmark = pytest.mark.triton


@pytest.mark.parametrize("strategy", ["mru:brent_kung", "mru:sklansky", "mru:hillis_steele"])
def test_scan_strategies_run_the_kernel(strategy, monkeypatch, device):
    import atlas_plugins.cuda_backend.backend_mru as backend_mru

    calls = []
    backend_cls = type(ac.get_registry().build("backend", "cuda:mru_scan"))
    original = backend_cls.run
    monkeypatch.setattr(backend_cls, "run", lambda self, *a: calls.append(1) or original(self, *a))
    g = torch.Generator().manual_seed(0)
    Z = 0.3 * torch.randn(1, 11, 2, 4, 4, generator=g)
    X = torch.linalg.matrix_exp(Z - Z.transpose(-1, -2)).to(device)
    rule = ac.build_rule({"use": "mru:mru"})
    # the reference first: core:sequential has no backends, and a strategy binds its backends
    # (reading ATLAS_BACKEND) once, when the rule first resolves it
    H_ref, state_ref = rule(X, strategy="core:sequential")
    monkeypatch.setenv("ATLAS_BACKEND", "cuda:mru_scan")  # forced: a refusal would be an error
    H, state = rule(X, strategy=strategy)
    assert calls, f"{strategy} did not use the kernel backend"
    assert backend_mru is not None
    torch.testing.assert_close(H, H_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state["H"], state_ref["H"], atol=1e-5, rtol=1e-5)
