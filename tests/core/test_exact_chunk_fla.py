"""core:exact_chunk against published pure-PyTorch references of flash-linear-attention (fla-core).

An oracle written outside this project: fla's reference implementations of

- the (gated) delta rule, ``fla/ops/gated_delta_rule/naive.py``: its recurrent loop and its
  chunked WY form. fla's Gated DeltaNet takes the gradient at the DECAYED memory, a different rule
  from ours with decay; without decay (``g = 0``, our ``core:none``) they are the same rule;
- the momentum delta rule, ``fla/ops/momentum_delta_rule/naive.py``: ``Z_t = mu_t Z_{t-1} +
  eta_t k_t e_t^T``, ``S_t = alpha_t S_{t-1} - beta_t Z_t`` with the error ``e_t = S_{t-1}^T p_t -
  v_t`` at the undecayed memory: Titans (``titans:titans``) with ``p = k`` and ``beta = 1``.
  Only its recurrent loop is used: its chunked ``chunk_momentum_delta_rule_ref`` (fla-core 0.6.0)
  does not agree with that loop itself (max difference about 5 at T = 64, alpha >= 0.8).

Map: our ``M = S^T`` (fla keeps ``[Dk, Dv]``), ``theta`` = fla's ``beta`` (delta rule) / ``eta``
(momentum), our momentum decay ``eta`` = fla's ``mu``, ``scale = 1``. fla's references compute in
float32, so the comparison is at float32 accuracy (2e-4 of the largest value); exactness against
our own float64 reference loop is tested in test_exact_chunk.py and test_exact_chunk_rules.py.

The modules are loaded from their files (they import only torch and einops), not through
``import fla``, whose package import pulls in its Triton kernels. Skipped when fla-core is not
installed (``pip install --no-deps fla-core``).
"""


import pytest
import torch

import atlas_core as ac

from ..fla_refs import fla_reference

B, T, H, D = 2, 100, 2, 8
TOL = 2e-4



def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    f64 = dict(generator=g, dtype=torch.float64)
    q = torch.randn(B, T, H, D, **f64)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, D, **f64), dim=-1)
    v = torch.randn(B, T, H, D, **f64)
    u = lambda: torch.rand(B, T, H, **f64)  # noqa: E731
    gates = {"alpha": 0.8 + 0.2 * u(), "eta": 0.9 * u(), "theta": 0.1 + 0.8 * u()}
    M0 = 0.3 * torch.randn(B, H, D, D, **f64)
    Z0 = 0.3 * torch.randn(B, H, D, D, **f64)
    return q, k, v, gates, M0, Z0


def _close(got, want, what):
    got, want = got.double(), want.double()
    scale = want.abs().max().item()
    err = (got - want).abs().max().item()
    assert err <= TOL * scale, f"{what}: max error {err:.3e} against scale {scale:.3e}"


@pytest.mark.parametrize("C", [16, 64])
def test_delta_rule_equals_fla_gated_delta_rule_without_decay(C):
    fla = fla_reference("ops/gated_delta_rule/naive.py")
    q, k, v, gates, M0, _ = _inputs(seed=C)
    rule = ac.build_rule({"retention": "core:none"}, heads=H, d_key=D, d_value=D)
    y, s = rule(q, k, v, gates={"theta": gates["theta"]}, state={"M": M0},
                strategy={"use": "core:exact_chunk", "chunk_size": C})
    f32 = lambda x: x.float()  # noqa: E731
    beta, g = f32(gates["theta"]), torch.zeros(B, T, H)
    S0 = f32(M0.transpose(-1, -2))
    o_rec, S_rec = fla.naive_recurrent_gated_delta_rule(
        f32(q), f32(k), f32(v), beta, g, scale=1.0, initial_state=S0, output_final_state=True)
    o_chk, S_chk = fla.naive_chunk_gated_delta_rule(
        f32(q), f32(k), f32(v), g, beta, chunk_size=C, scale=1.0, initial_state=S0,
        output_final_state=True)
    _close(y, o_rec, "outputs vs fla's recurrent reference")
    _close(s["M"], S_rec.transpose(-1, -2), "final memory vs fla's recurrent reference")
    _close(y, o_chk, "outputs vs fla's chunked reference")
    _close(s["M"], S_chk.transpose(-1, -2), "final memory vs fla's chunked reference")


@pytest.mark.parametrize("C", [16, 64])
def test_titans_equals_fla_momentum_delta_rule(C):
    fla = fla_reference("ops/momentum_delta_rule/naive.py")
    q, k, v, gates, M0, Z0 = _inputs(seed=100 + C)
    rule = ac.build_rule({"use": "titans:titans"}, heads=H, d_key=D, d_value=D)
    y, s = rule(q, k, v, gates=gates, state={"M": M0, "Z.M": Z0},
                strategy={"use": "core:exact_chunk", "chunk_size": C})
    f32 = lambda x: x.float()  # noqa: E731
    args = dict(
        q=f32(q), k=f32(k), v=f32(v), p=f32(k), log_alpha=f32(gates["alpha"].log()),
        log_mu=f32(gates["eta"].log()), beta=torch.ones(B, T, H), eta=f32(gates["theta"]),
        scale=1.0, initial_S=f32(M0.transpose(-1, -2)), initial_M=f32(Z0.transpose(-1, -2)),
        output_final_state=True,
    )
    o_rec, st = fla.recurrent_momentum_delta_rule_ref(**args)
    _close(y, o_rec, "outputs vs fla's recurrent momentum reference")
    _close(s["M"], st[0].transpose(-1, -2), "final memory vs fla's recurrent momentum reference")
    _close(s["Z.M"], st[1].transpose(-1, -2), "final momentum vs fla's recurrent momentum reference")
