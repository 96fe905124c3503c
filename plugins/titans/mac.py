"""``titans:mac``: Memory as Context (Titans Sec 4.1; seed 003), in the paper's order.

The sequence is split into segments S^(i) of ``segment_size`` tokens. For a block that carries
memory, with ``s = RMSNorm(x)`` on segment i and M_{i-1} the memory committed by the segments
before it (the learned initial memory for the first)::

    h   = W_r M*_{i-1}(W_Q s)                    # 1. retrieve: a read of the COMMITTED memory,
                                                 #    no update (one retrieved token per token)
    y   = Attn([p_1..p_Np] || h || s)            # 2. attention inside the segment; token t sees
                                                 #    p, h_1..h_t and s_1..s_t
    m   = M_i(y)  with  M_i = M_{i-1} updated by y   # 3. the memory stores the attention output,
                                                 #    token by token; m_t reads M after token t
    x   = x + W_o (norm(y) * sigmoid(norm(m)))   # 4. gate with a read of the updated memory
    x   = x + MLP(RMSNorm(x))

Retrieval inside a segment sees only committed memory: changes the segment makes reach later
segments only. Blocks not in ``memory_layers`` are sliding-window attention blocks.

Inference (segment buffering, seed 003): the state holds the committed memory, and for the
current segment the retrieved and token keys/values and the attention outputs ``y`` so far. Each
new token attends over that buffer, and the memory layer re-runs over the buffered ``y`` from the
committed state (so it sees the segment exactly as in training, for any strategy); at a segment
boundary the memory is committed and the buffer cleared. Cost per token is bounded by the segment
size.

Shapes: ``ids: [B, T]`` -> ``logits: [B, T, vocab_size]``; inside a block ``x: [B, n, d_model]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from pydantic import ValidationInfo, field_validator
from atlas_core.attention import band_mask
from atlas_core.params import size_field
from torch import nn

from .attention import SlidingWindowAttention, attention_block
from .common import (BranchGate, TitansLM, WindowAttentionParams, build_blocks, make_mlp,
                     persistent_at_most)


class MACParams(WindowAttentionParams):
    segment_size: int = size_field(64, "seq_len", ge=1, description="tokens per segment (C)")
    persistent_tokens: int = size_field(4, "seq_len", ge=0, description="learned input-independent tokens prefixed to every attention"
    )

    @field_validator("persistent_tokens")
    @classmethod
    def _check_persistent(cls, v: int, info: ValidationInfo) -> int:
        return persistent_at_most(v, info, "segment_size")


class SegmentAttention(SlidingWindowAttention):
    """Causal attention over ``[p | h | s]`` inside one segment. Positions: ``p_j -> j``,
    ``h_j -> N_p + j``, ``s_j -> N_p + C + j`` (j counted from the segment start)."""

    def __init__(self, d_model: int, heads: int, segment: int, rotary_base: float) -> None:
        super().__init__(d_model, heads, segment, rotary_base)
        self.segment = segment

    def forward(self, s: torch.Tensor, h: torch.Tensor, buf: dict, pk: torch.Tensor, pv: torch.Tensor):
        """``s, h: [B, n, d]`` the segment's new tokens and their retrieved tokens; ``buf`` holds
        the keys/values of the earlier tokens of this segment (``hk, hv, sk, sv``). Returns
        ``(y [B, n, d], buf)``."""
        n, dev = s.shape[1], s.device
        Np, C, n0 = pk.shape[2], self.segment, buf["sk"].shape[2]
        pos = torch.arange(n0, n0 + n, device=dev)  # in-segment indices of the new tokens
        q, sk, sv = self.project(s, pos + Np + C)
        _, hk, hv = self.project(h, pos + Np)
        buf = {"hk": torch.cat([buf["hk"], hk], 2), "hv": torch.cat([buf["hv"], hv], 2),
               "sk": torch.cat([buf["sk"], sk], 2), "sv": torch.cat([buf["sv"], sv], 2)}
        seen = band_mask(pos, torch.arange(n0 + n, device=dev), None)  # j <= t
        mask = torch.cat([torch.ones(n, Np, dtype=torch.bool, device=dev), seen, seen], dim=1)
        K = torch.cat([pk, buf["hk"], buf["sk"]], dim=2)
        V = torch.cat([pv, buf["hv"], buf["sv"]], dim=2)
        y = F.scaled_dot_product_attention(q, K, V, attn_mask=mask)  # (B, H, n, Dh)
        return self.out(rearrange(y, "b h n d -> b n (h d)")), buf


class MACBlock(nn.Module):
    def __init__(self, p: MACParams, memory) -> None:
        super().__init__()
        d = p.d_model
        self.segment = p.segment_size
        self.persistent = nn.Parameter(0.02 * torch.randn(p.persistent_tokens, d))
        self.norm_in = nn.RMSNorm(d, eps=p.norm_eps)
        self.memory = memory
        # a query per q/k head, read from the memories of the value heads it serves ([layer]
        # value_heads: G = memory.groups consecutive memories a query head, as the layer's q)
        H, Hv, Dk, Dv = memory.heads, memory.value_heads, memory.d_key, memory.d_value
        self.retrieve_q = nn.Linear(d, H * Dk, bias=False)  # W_Q of the paper
        self.retrieve_out = nn.Linear(Hv * Dv, d, bias=False)  # retrieved values -> tokens
        self.attn = SegmentAttention(d, p.attn_heads or p.heads, p.segment_size, p.rotary_base)
        self.gate = BranchGate(d, p.norm_eps)
        self.norm_mlp = nn.RMSNorm(d, eps=p.norm_eps)
        self.mlp = make_mlp(p)  # [model] mlp: gelu or swiglu

    def retrieve(self, s: torch.Tensor, committed: dict | None) -> torch.Tensor:
        """``h = W_r M*(W_Q s)`` from the committed memory, no update: ``[B, n, d]``."""
        L, rule = self.memory, self.memory.rule
        q = rearrange(self.retrieve_q(s), "b n (h d) -> b n h d", h=L.heads)
        if L.params.qk_norm:
            q = F.normalize(q, dim=-1)
        if L.groups > 1:  # (B, n, H, Dk) -> (B, n, Hv, Dk)
            q = q.repeat_interleave(L.groups, dim=-2)
        psi = rearrange(rule.feature_map(q), "b n h d -> b h n d")
        names = list(rule.structure.weight_shapes())
        if committed is None:
            W = rule.retention.start(rule.structure.init_state(s.shape[0], dtype=s.dtype, device=s.device))
        else:
            W = {k: committed[f"rule.{k}"] for k in names}
        r = rule.structure.read({k: W[k] for k in names}, psi)  # (B, H, n, Dv)
        return self.retrieve_out(rearrange(r, "b h n d -> b n (h d)"))

    def empty_buffer(self, like: torch.Tensor) -> dict:
        e = like[:, :, :0]
        return {"hk": e, "hv": e, "sk": e, "sv": e, "y": like.new_zeros(like.shape[0], 0, self.persistent.shape[1])}

    def forward(self, x: torch.Tensor, state, keep_state: bool):
        s_all = self.norm_in(x)
        if state is None:
            pk, pv = self.attn.prefix_kv(self.persistent, x)
            committed, buf = None, self.empty_buffer(pk)
        else:
            pk, pv, committed, buf = state["pk"], state["pv"], state["committed"], state["buf"]
        outs, i, T = [], 0, x.shape[1]
        while i < T:  # one piece per segment (the first may continue a buffered segment)
            n0 = buf["sk"].shape[2]
            n = min(self.segment - n0, T - i)
            s = s_all[:, i : i + n]
            h = self.retrieve(s, committed)
            y, kv = self.attn(s, h, buf, pk, pv)
            ys = torch.cat([buf["y"], y], dim=1)  # the segment's attention outputs so far
            m, updated = self.memory(ys, committed)  # re-run from the committed memory
            outs.append(self.gate(y, m[:, n0:]))
            if n0 + n == self.segment:  # segment complete: commit its memory, clear the buffer
                committed, buf = updated, self.empty_buffer(pk)
            else:
                buf = {**kv, "y": ys}
            i += n
        x = x + torch.cat(outs, dim=1)
        x = x + self.mlp(self.norm_mlp(x))
        state = {"pk": pk, "pv": pv, "committed": committed, "buf": buf} if keep_state else None
        return x, state


class MAC(TitansLM):
    packs_in_one_pass = False  # segments count from each document's start: documents run alone
    context_parallel = False  # its attention mixes tokens across time


def build(params: MACParams, ctx) -> MAC:
    p = params
    return MAC(p, build_blocks(p, ctx, lambda mem: MACBlock(p, mem), lambda: attention_block(p),
                                arch="titans:mac", read_only=True))
