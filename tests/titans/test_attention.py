"""Sliding-window attention with a persistent prefix against a readable per-query loop, and the
cache: pieces with a carried cache equal one call, and the cache never exceeds the window."""

from __future__ import annotations

import math

import pytest
import torch

from atlas_plugins.titans.attention import SlidingWindowAttention, rotary

DT = torch.float64


def reference(attn: SlidingWindowAttention, x, prefix):
    """Per query: softmax over the prefix and the tokens t - window + 1 .. t, written out."""
    B, T, d = x.shape
    H, Dh = attn.heads, d // attn.heads
    Np = prefix.shape[0]
    seq = torch.cat([prefix.unsqueeze(0).expand(B, -1, -1), x], dim=1)  # positions 0 .. Np+T-1
    q, k, v = attn.qkv(seq).split(d, dim=-1)
    split = lambda z: z.reshape(B, Np + T, H, Dh).transpose(1, 2)  # noqa: E731
    pos = torch.arange(Np + T)
    q, k, v = rotary(split(q), pos, attn.base), rotary(split(k), pos, attn.base), split(v)
    out = torch.zeros(B, H, T, Dh, dtype=x.dtype)
    for t in range(T):
        i = Np + t
        keys = list(range(Np)) + [Np + j for j in range(max(0, t - attn.window + 1), t + 1)]
        s = q[:, :, i : i + 1] @ k[:, :, keys].transpose(-1, -2) / math.sqrt(Dh)
        out[:, :, t] = (s.softmax(-1) @ v[:, :, keys])[:, :, 0]
    return attn.out(out.transpose(1, 2).reshape(B, T, d))


@pytest.mark.parametrize("window,Np", [(1, 0), (3, 2), (20, 1)], ids=["w1-p0", "w3-p2", "w20-p1"])
def test_matches_reference_and_cache_pieces(window, Np):
    torch.manual_seed(0)
    attn = SlidingWindowAttention(8, 2, window, 10000.0).to(DT)
    x = torch.randn(2, 11, 8, dtype=DT)
    prefix = torch.randn(Np, 8, dtype=DT)
    with torch.no_grad():
        y, cache = attn(x, None, prefix=prefix)
        torch.testing.assert_close(y, reference(attn, x, prefix), rtol=0, atol=1e-12)
        outs, c = [], None
        for s, e in [(0, 4), (4, 5), (5, 11)]:
            yy, c = attn(x[:, s:e], c, prefix=prefix)
            outs.append(yy)
            assert c["k"].shape[2] <= window - 1 and c["pk"].shape[2] == Np
    torch.testing.assert_close(torch.cat(outs, 1), y, rtol=0, atol=1e-12)
    assert cache["pos"] == 11 and cache["k"].shape[2] == min(window - 1, 11)


def test_rotary_is_relative():
    """Scores depend on the distance between positions only."""
    torch.manual_seed(1)
    q, k = torch.randn(1, 1, 1, 8, dtype=DT), torch.randn(1, 1, 1, 8, dtype=DT)
    s = lambda a, b: (rotary(q, torch.tensor([a]), 100.0) * rotary(k, torch.tensor([b]), 100.0)).sum()  # noqa: E731
    torch.testing.assert_close(s(7, 3), s(104, 100), rtol=0, atol=1e-12)
    assert abs(s(7, 3) - s(7, 4)) > 1e-6


def test_bad_window():
    with pytest.raises(ValueError, match="window=0"):
        SlidingWindowAttention(8, 2, 0, 10000.0)
