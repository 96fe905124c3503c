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


# --- grouped value heads (GVA) ------------------------------------------------------------------

def _gva(HV, seed=4):
    """q, k with H heads, v with HV heads (a multiple of H)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=g, requires_grad=True)
    k = torch.randn(B, T, H, K, generator=g, requires_grad=True)
    v = torch.randn(B, T, HV, V, generator=g, requires_grad=True)
    return q, k, v, g


def test_gated_delta_rule_with_grouped_value_heads_matches_fla_naive_per_value_head():
    """GVA as fla's kernels index it (``i_h = i_hv // (HV // H)``): fla's ungrouped naive loop
    run on q and k gathered per value head."""
    ref = fla_reference("ops/gated_delta_rule/naive.py").naive_recurrent_gated_delta_rule
    HV = 2 * H
    q, k, v, g = _gva(HV)
    raw_beta, raw_g = torch.randn(B, T, HV, generator=g), torch.randn(B, T, HV, generator=g)
    A_log, dt_bias = torch.randn(HV, generator=g).requires_grad_(), torch.randn(HV, generator=g).requires_grad_()
    ours = oracle.gated_delta_rule(q, k, v, raw_g, raw_beta, use_qk_l2norm_in_kernel=True,
                                   use_beta_sigmoid_in_kernel=True, use_gate_in_kernel=True,
                                   A_log=A_log, dt_bias=dt_bias, output_final_state=True)
    assert ours[0].shape == (B, T, HV, V) and ours[1].shape == (B, HV, K, V)
    head = torch.arange(HV) // (HV // H)  # the q/k head each value head reads: 0, 0, 1, 1, 2, 2
    gate = -A_log.exp() * F.softplus(raw_g + dt_bias)
    theirs = ref(oracle.l2norm(q)[:, :, head], oracle.l2norm(k)[:, :, head], v, raw_beta.sigmoid(), gate,
                 output_final_state=True)
    _same(ours, theirs, (q, k, v, A_log, dt_bias))


def test_kda_with_grouped_value_heads_matches_fla_naive():
    """fla's naive KDA takes grouped value heads itself (``q.repeat_interleave(HV // H)``)."""
    ref = fla_reference("ops/kda/naive.py").naive_recurrent_kda
    HV = 3 * H
    q, k, v, g = _gva(HV, seed=5)
    raw_beta, raw_g = torch.randn(B, T, HV, generator=g), torch.randn(B, T, HV, K, generator=g)
    A_log = torch.randn(HV, generator=g).requires_grad_()
    dt_bias = torch.randn(HV * K, generator=g).requires_grad_()
    ours = oracle.kda(q, k, v, raw_g, raw_beta, A_log=A_log, dt_bias=dt_bias, use_qk_l2norm_in_kernel=True,
                      use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, output_final_state=True)
    gate = -A_log.exp()[:, None] * F.softplus(raw_g + dt_bias.view(HV, K))
    theirs = ref(oracle.l2norm(q), oracle.l2norm(k), v, gate, raw_beta.sigmoid(), output_final_state=True)
    _same(ours, theirs, (q, k, v, A_log, dt_bias))


def test_grouped_value_heads_must_be_a_multiple():
    q, k, _, g = _gva(H)
    with pytest.raises(ValueError, match="multiple"):
        oracle.recurrence(q, k, torch.randn(B, T, H + 1, V, generator=g))


# --- softmax attention (flash_attn_func) --------------------------------------------------------

def attention_loop(q, k, v, causal, window_size):
    """flash-attn's attention, one query at a time in float64: query i (at key position
    ``i + Tk - Tq``) of head h over the keys j of kv head ``h // (H / G)`` with
    ``pos - left <= j <= pos + right`` (right = 0 when causal, a negative side unbounded)."""
    Bq, Tq, Hq, D = q.shape
    Tk, G = k.shape[1], k.shape[2]
    left, right = window_size
    right = 0 if causal else right
    out = torch.zeros(Bq, Tq, Hq, D, dtype=torch.float64)
    for b in range(Bq):
        for h in range(Hq):
            kv = h // (Hq // G)
            for i in range(Tq):
                pos = i + Tk - Tq
                keys = [j for j in range(Tk) if (left < 0 or j >= pos - left) and (right < 0 or j <= pos + right)]
                s = torch.stack([q[b, i, h].double() @ k[b, j, kv].double() for j in keys]) / D ** 0.5
                p = s.softmax(0)
                out[b, i, h] = sum(p[n] * v[b, j, kv].double() for n, j in enumerate(keys))
    return out


@pytest.mark.parametrize("G, window, Tq", [(4, None, T), (2, None, T), (1, 3, T), (2, 4, 3), (4, None, 1)],
                         ids=["H4-G4", "H4-G2", "H4-G1-window3", "H4-G2-window4-Tq3", "H4-G4-Tq1"])
def test_softmax_attention_matches_a_per_query_loop(G, window, Tq):
    g = torch.Generator().manual_seed(6)
    q = torch.randn(B, Tq, 4, K, generator=g, requires_grad=True)
    k = torch.randn(B, T, G, K, generator=g, requires_grad=True)
    v = torch.randn(B, T, G, K, generator=g, requires_grad=True)
    ws = (-1, -1) if window is None else (window - 1, 0)  # as fla's Attention passes it
    got = oracle.softmax_attention(q, k, v, causal=True, window_size=ws)
    want = attention_loop(q, k, v, True, ws)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    w = torch.randn(got.shape, generator=g)
    g1 = torch.autograd.grad((got * w).sum(), (q, k, v))
    g2 = torch.autograd.grad((want * w.double()).sum(), (q, k, v))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # both float32 (the inputs' dtype)
    if window is not None and Tq == T:  # the window matters: the full causal attention differs
        full = oracle.softmax_attention(q, k, v, causal=True)
        assert (full - got).abs().max() > 1e-2


def test_fla_attention_is_built_and_run_inside_the_oracle_only():
    pytest.importorskip("fla.layers", reason="flash-linear-attention is in the test extra")
    import fla.layers.attn as attn_mod
    from fla.layers.attn import Attention

    if attn_mod.flash_attn_func is not None:  # flash-attn installed: nothing of it to stand in for
        assert attn_mod.flash_attn_func.__module__.startswith("flash_attn")
        return
    with pytest.raises(ImportError, match="Flash Attention"):
        Attention(hidden_size=16, num_heads=4)
    torch.manual_seed(0)
    with oracle.fla_on_cpu():
        layer = Attention(hidden_size=16, num_heads=4, num_kv_heads=2, window_size=3)
        x = torch.randn(2, 6, 16)
        y, _, _ = layer(x)
        with pytest.raises(NotImplementedError, match="varlen"):
            layer(x, attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1]] * 2))
    # the same function by hand: rotate q and k (fla's RotaryEmbedding, base 10000), attend, project
    q = layer.q_proj(x).view(2, 6, 4, 4)
    k, v = layer.k_proj(x).view(2, 6, 2, 4), layer.v_proj(x).view(2, 6, 2, 4)
    f = 10000.0 ** (-torch.arange(0, 4, 2).float() / 4)
    ang = torch.arange(6).float()[:, None] * f  # (T, 2)
    c, s = ang.cos()[None, :, None], ang.sin()[None, :, None]
    rot = lambda x: torch.cat([x[..., :2] * c - x[..., 2:] * s, x[..., 2:] * c + x[..., :2] * s], -1)  # noqa: E731
    want = layer.o_proj(attention_loop(rot(q), rot(k), v, True, (2, 0)).float().reshape(2, 6, 16))
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    assert attn_mod.flash_attn_func is None and not hasattr(attn_mod, "flash_attn_varlen_func")  # restored
