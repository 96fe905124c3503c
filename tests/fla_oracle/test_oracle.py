"""The CPU oracle's pieces (tests/fla_oracle/oracle.py) against fla-core's own pure-PyTorch
references (``fla/ops/<rule>/naive.py``, loaded by path) and torch's modules: outputs, final
states and gradients, before the oracle stands in for fla's kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.fla_oracle import oracle
from tests.fla_refs import fla_reference

B, T, H, K, V = 2, 9, 3, 8, 5


def _qkv(steps=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=g, requires_grad=True)
    k = torch.randn(B, T * steps, H, K, generator=g, requires_grad=True)
    v = torch.randn(B, T * steps, H, V, generator=g, requires_grad=True)
    return q, k, v, g


def _same(ours, theirs, inputs):
    """Outputs, final states and the gradients of one weighted sum of the outputs agree."""
    (o1, s1), (o2, s2) = ours, theirs
    torch.testing.assert_close(o1, o2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s1, s2, rtol=1e-5, atol=1e-5)
    w = torch.randn_like(o1)
    g1 = torch.autograd.grad((o1 * w).sum(), inputs, retain_graph=True)
    g2 = torch.autograd.grad((o2 * w).sum(), inputs)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_delta_rule_matches_fla_naive():
    ref = fla_reference("ops/delta_rule/naive.py").delta_rule_recurrence
    q, k, v, g = _qkv()
    beta = torch.randn(B, T, H, generator=g).requires_grad_()
    ours = oracle.delta_rule(q, k, v, beta, use_qk_l2norm_in_kernel=True, output_final_state=True)
    qn, kn = oracle.l2norm(q), oracle.l2norm(k)
    t = lambda x: x.transpose(1, 2)  # noqa: E731 - the reference takes [B, H, T, D]
    o, s = ref(t(qn), t(kn), t(v), t(beta))
    _same(ours, (t(o), s), (q, k, v, beta))


def test_gated_delta_rule_with_in_kernel_gates_matches_fla_naive():
    ref = fla_reference("ops/gated_delta_rule/naive.py").naive_recurrent_gated_delta_rule
    q, k, v, g = _qkv()
    raw_beta, raw_g = torch.randn(B, T, H, generator=g), torch.randn(B, T, H, generator=g)
    A_log, dt_bias = torch.randn(H, generator=g).requires_grad_(), torch.randn(H, generator=g).requires_grad_()
    ours = oracle.gated_delta_rule(q, k, v, raw_g, raw_beta, use_qk_l2norm_in_kernel=True,
                                   use_beta_sigmoid_in_kernel=True, use_gate_in_kernel=True,
                                   A_log=A_log, dt_bias=dt_bias, output_final_state=True)
    gate = -A_log.exp() * F.softplus(raw_g + dt_bias)  # Mamba-2's decay, as fla's gate kernel
    theirs = ref(oracle.l2norm(q), oracle.l2norm(k), v, raw_beta.sigmoid(), gate, output_final_state=True)
    _same(ours, theirs, (q, k, v, A_log, dt_bias))
    # state_v_first: the same state, transposed
    vf = oracle.gated_delta_rule(q, k, v, gate, raw_beta.sigmoid(), use_qk_l2norm_in_kernel=True,
                                 state_v_first=True, output_final_state=True)[1]
    torch.testing.assert_close(vf, theirs[1].transpose(-1, -2), rtol=1e-5, atol=1e-5)


def test_gated_delta_product_matches_fla_naive():
    ref = fla_reference("ops/gated_delta_product/naive.py").naive_recurrent_gated_delta_product
    q, k, v, g = _qkv(steps=3)
    beta = torch.rand(B, T * 3, H, generator=g).requires_grad_()
    gate = -torch.rand(B, T, H, generator=g).requires_grad_()
    ours = oracle.gated_delta_product(q, k, v, gate, beta, num_householder=3, use_qk_l2norm_in_kernel=True,
                                      output_final_state=True)
    theirs = ref(oracle.l2norm(q), oracle.l2norm(k), v, gate, beta, scale=K ** -0.5,
                 output_final_state=True, num_householder=3)
    _same(ours, theirs, (q, k, v, beta, gate))


def test_kda_matches_fla_naive():
    ref = fla_reference("ops/kda/naive.py").naive_recurrent_kda
    q, k, v, g = _qkv()
    raw_beta, raw_g = torch.randn(B, T, H, generator=g), torch.randn(B, T, H, K, generator=g)
    A_log = torch.randn(H, generator=g).requires_grad_()
    dt_bias = torch.randn(H * K, generator=g).requires_grad_()
    ours = oracle.kda(q, k, v, raw_g, raw_beta, A_log=A_log, dt_bias=dt_bias, use_qk_l2norm_in_kernel=True,
                      use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, output_final_state=True)
    gate = -A_log.exp()[:, None] * F.softplus(raw_g + dt_bias.view(H, K))  # fla's naive_kda_gate
    theirs = ref(oracle.l2norm(q), oracle.l2norm(k), v, gate, raw_beta.sigmoid(), output_final_state=True)
    _same(ours, theirs, (q, k, v, A_log, dt_bias))


def test_gla_matches_fla_naive():
    ref = fla_reference("ops/gla/naive.py").naive_recurrent_gla
    q, k, v, g = _qkv()
    gk = F.logsigmoid(torch.randn(B, T, H, K, generator=g)).div(16).requires_grad_()
    ours = oracle.gla(q, k, v, g=gk, output_final_state=True)
    theirs = ref(q, k, v, gk, output_final_state=True)
    _same(ours, theirs, (q, k, v, gk))
    torch.testing.assert_close(oracle.gla(q, k, v, gk=gk)[0], ours[0])  # fused_recurrent_gla's keyword


def test_retention_matches_fla_naive():
    ref = fla_reference("ops/retention/naive.py").naive_retention
    q, k, v, _ = _qkv()
    ours = oracle.retention(q, k, v, output_final_state=True)
    t = lambda x: x.transpose(1, 2)  # noqa: E731 - the reference takes [B, H, T, D]
    want = t(ref(t(q), t(k), t(v)))
    # the reference gives no state: the state is the recurrence's, read by a query of e_i
    S = oracle.recurrence(q, k, v, g=torch.log(1 - 2.0 ** (-5.0 - torch.arange(H))).expand(B, T, H),
                          delta=False, output_final_state=True)[1]
    _same(ours, (want, S), (q, k, v))


def test_linear_attn_matches_fla_naive():
    ref = fla_reference("ops/linear_attn/naive.py").naive_recurrent_linear_attn
    q, k, v, _ = _qkv()
    ours = oracle.linear_attn(q, k, v, output_final_state=True)
    _same(ours, ref(q, k, v, output_final_state=True), (q, k, v))
    with pytest.raises(NotImplementedError, match="normalised"):
        oracle.linear_attn(q, k, v, normalize=True)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_matches_fla_reference_and_complex_rotation(interleaved):
    pytest.importorskip("fla.modules", reason="flash-linear-attention is in the test extra")
    from fla.modules.rotary.ops import RotaryEmbedding, rotary_embedding_ref

    rope = RotaryEmbedding(dim=K)
    rope._update_cos_sin_cache(20, dtype=torch.float32)
    x = torch.randn(B, T, H, K + 2)  # two features past the rotated ones stay as they are
    got = oracle.rotary_embedding(x, rope._cos_cached[:, :3], rope._sin_cached[:, :3], interleaved,
                                  seqlen_offsets=5)
    want = rotary_embedding_ref(x, rope._cos_cached[5:5 + T, :3], rope._sin_cached[5:5 + T, :3], interleaved)
    torch.testing.assert_close(got, want)
    # independently: pair (x_i, x_{i + R/2}) (or (x_2i, x_2i+1)) times e^(i p f_i), f_i = 10000^(-2i/K)
    f = 10000.0 ** (-torch.arange(0, K, 2).float() / K)
    pos = torch.arange(5, 5 + T).float()
    z = torch.polar(torch.ones(T, 3), pos[:, None] * f[:3])[None, :, None]
    pairs = (x[..., 0:6:2], x[..., 1:6:2]) if interleaved else (x[..., :3], x[..., 3:6])
    r = torch.complex(*pairs) * z
    assert torch.allclose(got[..., 0:6:2] if interleaved else got[..., :3], r.real, atol=1e-5)
    assert torch.allclose(got[..., 1:6:2] if interleaved else got[..., 3:6], r.imag, atol=1e-5)
    assert torch.equal(got[..., 6:], x[..., 6:])


def test_the_oracle_refuses_a_carried_state():
    q, k, v, _ = _qkv()
    with pytest.raises(NotImplementedError, match="no state"):
        oracle.delta_rule(q, k, v, torch.rand(B, T, H), initial_state=torch.zeros(B, H, K, V))


def test_conv_and_norms_match_torch():
    pytest.importorskip("fla.modules", reason="flash-linear-attention is in the test extra")
    from fla.modules import FusedRMSNormGated, RMSNorm, ShortConvolution

    torch.manual_seed(0)
    conv = ShortConvolution(6, 4, bias=True, activation="silu")
    x = torch.randn(2, 7, 6)
    with oracle.fla_on_cpu():
        y, _ = conv(x)
        norm, gated = RMSNorm(6, eps=1e-5), FusedRMSNormGated(6, eps=1e-5, activation="sigmoid")
        for p in (norm.weight, gated.weight):
            p.data.normal_()
        r = torch.randn(2, 7, 6)
        n, s = norm(x, r, True)
        gn = gated(x, r)
    want = F.silu(torch.nn.Conv1d.forward(conv, x.transpose(1, 2))[..., :7].transpose(1, 2))
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s, x + r)
    torch.testing.assert_close(n, F.rms_norm(x + r, (6,), norm.weight, 1e-5), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gn, F.rms_norm(x, (6,), gated.weight, 1e-5) * torch.sigmoid(r), rtol=1e-5, atol=1e-6)
    assert ShortConvolution.forward is not oracle.short_conv_forward  # restored after the block
