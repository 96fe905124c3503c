"""The core's softmax attention (`atlas_core.attention`) against a readable per-query reference.

The reference (`reference`, float64) projects every token on its own, normalises q and k with an
RMSNorm written out (per head, or over all heads' features), rotates the first R features of each
head by the rotate-half rule, and computes every query's output with an explicit softmax over its
key set (the keys at most ``window - 1`` tokens back, the persistent prefix always), head h reading
key/value head ``h // (H / G)``; the sigmoid output gate and the output projection follow. Beside
it: split calls with the carried cache equal one call, the cache stays within ``window - 1`` keys,
packed documents equal each document alone (outputs and gradients), partial rotary leaves the
unrotated features alone and matches transformers' ``apply_rotary_pos_emb``, and bad sizes are
clear ValueErrors.
"""

from __future__ import annotations

import math

import pytest
import torch

from atlas_core.attention import AttentionParams, SoftmaxAttention, attention_from_params, rope, rotary_dims

D_MODEL, H, HEAD = 16, 4, 8
BASE = 10000.0


def make(kv_heads=4, fraction: float | None = 1.0, qk_norm="none", gate=False, window=None, bias=False,
         seed=0) -> SoftmaxAttention:
    """An attention of 4 query heads of size 8 on d_model 16, every parameter random (norm weights
    around 1), in float64. ``fraction``: the rotated share of each head (None: no rotary)."""
    torch.manual_seed(seed)
    R = 0 if fraction is None else rotary_dims(HEAD, fraction, True)
    att = SoftmaxAttention(D_MODEL, H, kv_heads=kv_heads, head_dim=HEAD, bias=bias, out_bias=bias,
                           qk_norm=qk_norm, rotary=R, rotary_base=BASE,
                           output_gate="sigmoid" if gate else "none", window=window).double()
    with torch.no_grad():
        for name, p in att.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.3)
    return att


def tokens(B=2, n=7, seed=1, requires_grad=False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, n, D_MODEL, generator=g, dtype=torch.float64).requires_grad_(requires_grad)


# -- the readable reference -------------------------------------------------------------------

def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean() + eps) * weight


def rotate(x: torch.Tensor, p: int, R: int, base: float) -> torch.Tensor:
    """One head's vector ``x: [D]`` at position p: pairs (x_i, x_{i + R/2}), i < R/2, turned by
    ``p * base^(-2i/R)``; features R.. unchanged."""
    if R == 0:
        return x
    half = R // 2
    angle = torch.tensor([p * base ** (-2 * i / R) for i in range(half)], dtype=x.dtype)
    x1, x2 = x[:half], x[half:R]
    return torch.cat([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin(), x[R:]])


def reference(att: SoftmaxAttention, x: torch.Tensor, prefix: torch.Tensor | None = None) -> torch.Tensor:
    """``x: [B, n, d]`` -> ``[B, n, d]``, one query at a time. ``prefix``: ``[N_p, d]`` persistent
    tokens at positions 0 .. N_p - 1, visible to every query (tokens then at N_p + t)."""
    B, n, _ = x.shape
    Hq, G, D, R, W = att.heads, att.kv_heads, att.head_dim, att.rotary, att.window
    Np = 0 if prefix is None else prefix.shape[0]
    eps = att.q_norm.eps if att.qk_norm != "none" else None
    rows = []
    for b in range(B):
        seq = x[b] if prefix is None else torch.cat([prefix, x[b]])
        qs, ks, vs, gs = [], [], [], []
        for t in range(Np + n):  # token t of seq sits at position t
            z = att.qkv.weight @ seq[t] + (att.qkv.bias if att.qkv.bias is not None else 0.0)
            q, k, v = z[:Hq * D], z[Hq * D:(Hq + G) * D], z[(Hq + G) * D:(Hq + 2 * G) * D]
            if att.qk_norm == "all":
                q, k = rms(q, att.q_norm.weight, eps), rms(k, att.k_norm.weight, eps)
            q, k, v = q.reshape(Hq, D), k.reshape(G, D), v.reshape(G, D)
            if att.qk_norm == "head":
                q = torch.stack([rms(q[h], att.q_norm.weight, eps) for h in range(Hq)])
                k = torch.stack([rms(k[j], att.k_norm.weight, eps) for j in range(G)])
            qs.append(torch.stack([rotate(q[h], t, R, att.base) for h in range(Hq)]))
            ks.append(torch.stack([rotate(k[j], t, R, att.base) for j in range(G)]))
            vs.append(v)
            gs.append(z[(Hq + 2 * G) * D:])
        out = []
        for t in range(n):
            i = Np + t
            seen = list(range(Np)) + [Np + s for s in range(t + 1) if W is None or t - s < W]
            heads = []
            for h in range(Hq):
                kv = h // (Hq // G)
                scores = torch.stack([qs[i][h] @ ks[j][kv] for j in seen]) / math.sqrt(D)
                p = torch.softmax(scores, dim=0)
                heads.append(sum(p[m] * vs[j][kv] for m, j in enumerate(seen)))
            o = torch.cat(heads)
            if att.gated:
                o = o * torch.sigmoid(gs[i])
            out.append(att.out.weight @ o + (att.out.bias if att.out.bias is not None else 0.0))
        rows.append(torch.stack(out))
    return torch.stack(rows)


CASES = {  # id -> make() arguments; every value of every option, alone and together
    "H4-G4": {},
    "H4-G2": {"kv_heads": 2},
    "H4-G1": {"kv_heads": 1},
    "rot0.5-G2": {"kv_heads": 2, "fraction": 0.5},
    "norotary-G2": {"kv_heads": 2, "fraction": None},
    "qknorm-head-G2": {"kv_heads": 2, "qk_norm": "head"},
    "qknorm-all-G2": {"kv_heads": 2, "qk_norm": "all"},
    "qknorm-all-G1": {"kv_heads": 1, "qk_norm": "all"},
    "gate": {"gate": True},
    "window3": {"window": 3},
    "window1-G1": {"kv_heads": 1, "window": 1},
    "bias": {"bias": True},
    "all-G2-rot0.5-all-gate-w3-bias": {"kv_heads": 2, "fraction": 0.5, "qk_norm": "all", "gate": True,
                                       "window": 3, "bias": True},
    "all-G1-norot-head-gate-w3": {"kv_heads": 1, "fraction": None, "qk_norm": "head", "gate": True,
                                  "window": 3},
}


@pytest.mark.parametrize("case", list(CASES))
def test_equals_per_query_reference(case):
    att = make(**CASES[case])
    x = tokens()
    y, cache = att(x)
    assert y.shape == x.shape and cache["pos"] == 7
    torch.testing.assert_close(y, reference(att, x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", ["H4-G2", "all-G2-rot0.5-all-gate-w3-bias", "all-G1-norot-head-gate-w3"])
def test_gradients_equal_reference(case):
    att = make(**CASES[case])
    x, x_ref = tokens(n=5, requires_grad=True), tokens(n=5, requires_grad=True)
    w = torch.randn(2, 5, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    params = list(att.parameters())
    got = torch.autograd.grad((att(x)[0] * w).sum(), [x, *params])
    want = torch.autograd.grad((reference(att, x_ref) * w).sum(), [x_ref, *params])
    for name, a, b in zip(["x", *(n for n, _ in att.named_parameters())], got, want):
        assert b.abs().sum() > 0, name
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=lambda m: f"d/d{name}: {m}")


@pytest.mark.parametrize("shared", [True, False], ids=["prefix-shared", "prefix-per-row"])
def test_persistent_prefix_equals_reference(shared):
    att = make(kv_heads=2, fraction=0.5, qk_norm="head", gate=True, window=3)
    x = tokens()
    g = torch.Generator().manual_seed(5)
    prefix = torch.randn(*(() if shared else (2,)), 3, D_MODEL, generator=g, dtype=torch.float64)
    y, cache = att(x, prefix=prefix)
    want = torch.cat([reference(att, x[b:b + 1], prefix if shared else prefix[b]) for b in range(2)])
    torch.testing.assert_close(y, want, rtol=1e-10, atol=1e-10)
    assert cache["pk"].shape == (2, 2, 3, HEAD) and cache["k"].shape[2] == 2  # the prefix apart


# -- the cache ----------------------------------------------------------------------------------

SPLITS = [(3, 4), (1, 6), (6, 1), (2, 2, 3), (1,) * 7]
CACHE_CASES = ["H4-G2", "window3", "window1-G1", "all-G2-rot0.5-all-gate-w3-bias"]


def _calls(att, x, sizes, prefix=None):
    ys, cache, a = [], None, 0
    for s in sizes:
        y, cache = att(x[:, a:a + s], cache, prefix=prefix if cache is None else None)
        ys.append(y)
        a += s
    return torch.cat(ys, dim=1), cache


@pytest.mark.parametrize("sizes", SPLITS, ids=lambda s: "split-" + "-".join(map(str, s)))
@pytest.mark.parametrize("case", CACHE_CASES)
def test_split_calls_with_the_cache_equal_one_call(case, sizes):
    att = make(**CASES[case])
    x = tokens()
    one, last = att(x)
    split, cache = _calls(att, x, sizes)
    torch.testing.assert_close(split, one, rtol=1e-11, atol=1e-11)
    assert cache["pos"] == last["pos"] == 7
    torch.testing.assert_close(cache["k"], last["k"], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cache["v"], last["v"], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("sizes", [(3, 4), (1,) * 7], ids=["split-3-4", "split-1x7"])
def test_split_calls_with_a_prefix_equal_one_call(sizes):
    att = make(kv_heads=2, fraction=0.5, gate=True, window=3)
    x, prefix = tokens(), tokens(B=1, n=2, seed=4)[0]
    one, _ = att(x, prefix=prefix)
    split, cache = _calls(att, x, sizes, prefix=prefix)
    torch.testing.assert_close(split, one, rtol=1e-11, atol=1e-11)
    assert cache["pk"].shape[2] == 2 and cache["k"].shape[2] == 2


@pytest.mark.parametrize("window", [None, 1, 3], ids=["nowindow", "window1", "window3"])
def test_cache_holds_at_most_window_minus_one_keys(window):
    att = make(kv_heads=2, window=window)
    x = tokens(n=9)
    cache = None
    for t in range(9):
        _, cache = att(x[:, t:t + 1], cache)
        held = t + 1 if window is None else min(t + 1, window - 1)
        assert cache["k"].shape == cache["v"].shape == (2, 2, held, HEAD), f"after {t + 1} tokens"
    _, one = att(x)  # one call of 9 tokens keeps the same tail
    assert one["k"].shape[2] == (9 if window is None else window - 1)
    _, none = att(x, keep_state=False)
    assert none is None


# -- packed documents ---------------------------------------------------------------------------

def _alone(att, x, cu, prefix=None):
    out = []
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        p = None if prefix is None else (prefix if prefix.dim() == 2 else prefix[i])
        out.append(att(x[:, a:b], prefix=p)[0])
    return torch.cat(out, dim=1)


PACKED = {  # id -> (document lengths, make() arguments, prefix: None, "shared" or "per-doc")
    "docs1-4-7-3-nowindow": ((1, 4, 7, 3), {"kv_heads": 2}, None),
    "docs1-4-7-3-window3": ((1, 4, 7, 3), {"kv_heads": 2, "window": 3, "gate": True}, None),
    "docs1-4-7-3-window3-prefix": ((1, 4, 7, 3), {"kv_heads": 1, "window": 3, "qk_norm": "all"}, "shared"),
    "docs1-4-7-3-nowindow-prefix-per-doc": ((1, 4, 7, 3), {"kv_heads": 2, "fraction": 0.5}, "per-doc"),
    # more than one block of 128 queries: the bands across block edges
    "docs130-1-150-19-nowindow": ((130, 1, 150, 19), {"kv_heads": 2}, None),
    "docs130-1-150-19-window3": ((130, 1, 150, 19), {"kv_heads": 2, "window": 3}, None),
}


def _prefix(kind, N):
    g = torch.Generator().manual_seed(6)
    if kind is None:
        return None
    return torch.randn(*(() if kind == "shared" else (N,)), 2, D_MODEL, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("case", list(PACKED))
def test_packed_equals_each_document_alone(case):
    lengths, kw, kind = PACKED[case]
    att = make(**kw)
    cu = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    x, prefix = tokens(B=1, n=cu[-1]), _prefix(kind, len(lengths))
    y = att.packed(x, cu, prefix)
    torch.testing.assert_close(y, _alone(att, x, cu, prefix), rtol=1e-10, atol=1e-10)
    # the boundaries matter: one document of the same tokens differs after the first
    assert not torch.allclose(y[:, 1:], att(x, prefix=None if kind != "shared" else prefix)[0][:, 1:])


@pytest.mark.parametrize("window", [None, 3], ids=["nowindow", "window3"])
def test_packed_gradients_equal_separate_calls(window):
    att = make(kv_heads=2, fraction=0.5, qk_norm="head", gate=True, window=window, bias=True)
    cu = [0, 1, 5, 12, 15]
    x, x_sep = tokens(B=1, n=15, requires_grad=True), tokens(B=1, n=15, requires_grad=True)
    w = torch.randn(1, 15, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    params = list(att.parameters())
    got = torch.autograd.grad((att.packed(x, cu) * w).sum(), [x, *params])
    want = torch.autograd.grad((_alone(att, x_sep, cu) * w).sum(), [x_sep, *params])
    for name, a, b in zip(["x", *(n for n, _ in att.named_parameters())], got, want):
        assert b.abs().sum() > 0, name
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11, msg=lambda m: f"d/d{name}: {m}")


# -- rotary -------------------------------------------------------------------------------------

@pytest.mark.parametrize("R", [2, 4, 6], ids=lambda r: f"rotary{r}-of-8")
def test_partial_rope_rotates_the_first_features_only(R):
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64)
    pos = torch.arange(5) + 11
    y = rope(x, pos, BASE, R)
    assert torch.equal(y[..., R:], x[..., R:])  # untouched, bit for bit
    torch.testing.assert_close(y[..., :R], rope(x[..., :R].clone(), pos, BASE))
    assert not torch.allclose(y[..., :R], x[..., :R])
    # a rotation: each pair (i, i + R/2) keeps its length
    h = R // 2
    torch.testing.assert_close(y[..., :h] ** 2 + y[..., h:R] ** 2, x[..., :h] ** 2 + x[..., h:R] ** 2)
    assert torch.equal(rope(x, pos, BASE, 0), x)


def test_rope_per_row_positions_equal_one_row_at_a_time():
    x = torch.randn(2, 3, 5, 8, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    pos = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    y = rope(x, pos, BASE, 4)
    for b in range(2):
        torch.testing.assert_close(y[b:b + 1], rope(x[b:b + 1], pos[b], BASE, 4), rtol=0, atol=0)


@pytest.mark.parametrize("R", [8, 4, 2], ids=lambda r: f"rotary{r}-of-8")
@pytest.mark.parametrize("base", [10000.0, 500.0], ids=lambda b: f"theta{int(b)}")
def test_rope_equals_transformers_apply_rotary_pos_emb(R, base):
    # imported here: transformers' qwen3_5 modeling module may pick up fla (GPU kernels)
    from transformers.models.qwen3_5.modeling_qwen3_5 import apply_rotary_pos_emb

    g = torch.Generator().manual_seed(10)
    q = torch.randn(2, 4, 6, 8, generator=g, dtype=torch.float64)  # [B, H, n, D]
    k = torch.randn(2, 2, 6, 8, generator=g, dtype=torch.float64)
    pos = torch.arange(6) + 3
    # transformers' rotary embedding: inv_freq = 1 / base^(arange(0, R, 2) / R), emb = cat(freqs, freqs)
    inv_freq = 1.0 / (base ** (torch.arange(0, R, 2, dtype=torch.float64) / R))
    freqs = pos.to(torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)[None].expand(2, -1, -1)  # [B, n, R]
    q_hf, k_hf = apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    torch.testing.assert_close(rope(q, pos, base, R), q_hf, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rope(k, pos, base, R), k_hf, rtol=1e-12, atol=1e-12)


# -- params and errors --------------------------------------------------------------------------

def test_attention_from_params_reads_every_field():
    p = AttentionParams(heads=4, kv_heads=2, head_dim=6, bias=True, qk_norm="all", rotary_fraction=0.34,
                        rotary_base=500.0, output_gate="sigmoid", window=5)
    att = attention_from_params(p, 16, 2, 1e-5)
    assert (att.heads, att.kv_heads, att.head_dim, att.rotary, att.base, att.window) == (4, 2, 6, 2, 500.0, 5)
    assert att.gated and att.qkv.bias is not None and att.out.bias is None
    assert att.qkv.out_features == 4 * 6 + 2 * 2 * 6 + 4 * 6
    assert att.q_norm.normalized_shape == (24,) and att.k_norm.normalized_shape == (12,)
    assert att.q_norm.eps == 1e-5
    defaults = attention_from_params(AttentionParams(), 16, 2, 1e-6)  # the model's heads, all rotated
    assert (defaults.heads, defaults.kv_heads, defaults.head_dim, defaults.rotary) == (2, 2, 8, 8)
    assert attention_from_params(AttentionParams(rotary=False), 16, 2, 1e-6).rotary == 0


@pytest.mark.parametrize("kwargs,message", [
    ({"kv_heads": 3}, "kv_heads=3 must divide heads=4"),
    ({"rotary": 3}, r"the rotated features \(3\) must be even"),
    ({"rotary": 6}, r"at most the head size 4"),
    ({"window": 0}, "window=0 must be >= 1"),
], ids=["kv_heads-3-of-4", "rotary-odd", "rotary-wider-than-head", "window-0"])
def test_bad_sizes_are_clear_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SoftmaxAttention(16, 4, **kwargs)


def test_bad_params_are_clear_value_errors():
    with pytest.raises(ValueError, match="d_model=18 is not divisible by heads=4"):
        SoftmaxAttention(18, 4)
    with pytest.raises(ValueError, match="kv_heads=3 must divide heads=4"):
        AttentionParams(heads=4, kv_heads=3)
    with pytest.raises(ValueError, match=r"rotated features \(3\) must be even"):  # int(6 * 0.5) = 3
        attention_from_params(AttentionParams(head_dim=6, rotary_fraction=0.5), 16, 4, 1e-6)
    with pytest.raises(ValueError, match="d_model=18 is not divisible by attention heads=4"):
        attention_from_params(AttentionParams(), 18, 4, 1e-6)
