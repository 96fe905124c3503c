"""flash-linear-attention's models on the CPU, for tests: the Triton entry points fla's layers call,
replaced inside the test process by pure-PyTorch code that computes what each kernel computes.

fla's layers (``fla.layers.*``) call Triton kernels that need a GPU. `fla_on_cpu` (a context manager) swaps, for its duration:

- the rule kernels each layer module imported (``chunk_delta_rule``, ``fused_recurrent_delta_rule``,
  ``chunk_gated_delta_rule``, ``fused_recurrent_gated_delta_rule``, ``chunk_gated_delta_product``,
  ``chunk_kda``, ``fused_recurrent_kda``, ``chunk_gla``, ``fused_chunk_gla``, ``fused_recurrent_gla``,
  the retention kernels, the linear-attention kernels) for `recurrence`, after the preprocessing the kernels do inside (read from their sources):
  q and k l2-normalised as ``x / sqrt(|x|^2 + 1e-6)`` (``use_qk_l2norm_in_kernel``), beta
  ``sigmoid``-ed (``use_beta_sigmoid_in_kernel``) and doubled (``allow_neg_eigval``), the decay made
  in the kernel (``use_gate_in_kernel``: ``g = -exp(A_log) softplus(g + dt_bias)``), q scaled by
  ``scale`` (default ``1/sqrt(K)``), retention's fixed decay ``log(1 - 2^(-5 - h))`` per head;
  the final state as ``[B, H, K, V]`` (``[B, H, V, K]`` with
  ``state_v_first``); grouped value heads (GVA: ``v: [B, T, HV, V]`` and the gates per value head,
  q and k per q/k head, ``HV`` a multiple of ``H``) with value head ``i`` reading q/k head
  ``i // (HV / H)``, as fla's kernels index them;
- ``flash_attn_func`` in ``fla.layers.attn`` (fla's softmax ``Attention``, the ``attn`` layers of a
  hybrid config) for `softmax_attention`, causal softmax attention with grouped key/value heads and
  flash-attn's sliding ``window_size``; ``flash_attn_varlen_func`` (padding masks, packed
  sequences) is refused. fla's ``Attention.__init__`` raises ImportError when ``flash_attn_func`` is
  None (flash-attn not installed), so a model with ``attn`` layers is built inside the block too
  (`build`);
- ``ShortConvolution.forward`` and ``causal_conv1d`` (depthwise causal conv, bias, SiLU),
  ``RMSNorm.forward`` (with fla's residual/prenorm form), ``FusedRMSNormGated.forward``
  (``rmsnorm(x) * w * act(g)``), ``SwiGLULinear.forward`` (``W (silu(x) * y) + b``), the rotary
  embedding (``fla.modules.rotary.ops.rotary_embedding``, rotate-half) and linear attention's
  ``elu_p1`` (``elu(x) + 1``).

Every computation is float32, as fla's kernels accumulate. Only what a forward pass from no state
needs is covered: a carried cache or packed sequences (``cu_seqlens``) are refused. `recurrence`
is checked against fla-core's own ``naive.py`` loops (tests/fla_oracle/test_oracle.py) before it is used.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

L2_EPS = 1e-6  # fla.modules.l2norm's default


def l2norm(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2_EPS)


def recurrence(q, k, v, beta=None, g=None, gk=None, *, scale=None, delta=True, steps=1,
               initial_state=None, output_final_state=False):
    """The linear-memory recurrence fla's kernels compute, one token at a time, in float32.

    ``q: [B, T, H, K]``; ``k: [B, T n, H, K]``, ``v: [B, T n, H, V]`` and ``beta: [B, T n, H]`` with
    ``n = steps`` sub-steps a token (sub-step j of token t at ``t n + j``); ``g: [B, T, H]`` log
    decay per head, ``gk: [B, T, H, K]`` log decay per key. State ``S: [B, H, K, V]``; per token
    ``S <- S exp(g) exp(gk)`` (rows), then per sub-step ``S <- S + k (beta (v - S^T k))^T`` (delta)
    or ``S <- S + k (beta v)^T``; ``o_t = S^T (scale q_t)``. Returns ``(o [B, T, H, V], S or None)``.

    Grouped value heads (GVA): ``v``, ``beta``, ``g``, ``gk``, the state and ``o`` have ``HV`` heads,
    a multiple of q's and k's ``H``; q and k are repeated to ``HV`` heads, value head i reading
    q/k head ``i // (HV / H)`` (fla's kernels: ``i_h = i_hv // (HV // H)``)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    q, k, v = q.float() * scale, k.float(), v.float()
    HV = v.shape[2]
    if HV != H:  # grouped value heads: value head i reads q/k head i // (HV / H), as the kernels
        if HV % H:
            raise ValueError(f"value heads HV={HV} must be a multiple of the q/k heads H={H}")
        q, k = q.repeat_interleave(HV // H, dim=2), k.repeat_interleave(HV // H, dim=2)
        H = HV
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.float().clone()
    o = q.new_empty(B, T, H, V)
    for t in range(T):
        if g is not None:
            S = S * g[:, t].float().exp()[..., None, None]
        if gk is not None:
            S = S * gk[:, t].float().exp()[..., None]
        for j in range(steps):
            i = t * steps + j
            kt, vt = k[:, i], v[:, i]
            if delta:
                vt = vt - torch.einsum("bhkv,bhk->bhv", S, kt)
            if beta is not None:
                vt = vt * beta[:, i].float()[..., None]
            S = S + kt[..., None] * vt[..., None, :]
        o[:, t] = torch.einsum("bhkv,bhk->bhv", S, q[:, t])
    return o, (S if output_final_state else None)


def _refuse_state(kw: dict) -> None:
    if kw.get("initial_state") is not None or kw.get("cu_seqlens") is not None:
        raise NotImplementedError("the CPU oracle runs a forward pass from no state, unpacked")


def _prepare(q, k, beta, kw, *, g=None, per_key=False):
    """The kernels' in-kernel preprocessing of q, k, beta and the decay (see the module docstring)."""
    _refuse_state(kw)
    if kw.get("use_qk_l2norm_in_kernel"):
        q, k = l2norm(q), l2norm(k)
    if beta is not None:
        beta = beta.float()
        if kw.get("use_beta_sigmoid_in_kernel"):
            beta = beta.sigmoid()
        if kw.get("allow_neg_eigval") and kw.get("use_beta_sigmoid_in_kernel"):
            beta = beta * 2
    if g is not None and kw.get("use_gate_in_kernel"):
        if kw.get("safe_gate") or kw.get("lower_bound") is not None:
            raise NotImplementedError("the CPU oracle has no safe_gate / lower_bound decay")
        A = kw["A_log"].float().exp()
        raw = g.float()
        if kw.get("dt_bias") is not None:
            raw = raw + kw["dt_bias"].float().view(raw.shape[-2:] if per_key else raw.shape[-1:])
        g = -(A[:, None] if per_key else A) * F.softplus(raw)
    return q, k, beta, g


def _finish(o, S, like, kw):
    if S is not None and kw.get("state_v_first"):
        S = S.transpose(-1, -2)
    return o.to(like.dtype), S


def delta_rule(q, k, v, beta, scale=None, **kw):
    q, k, beta, _ = _prepare(q, k, beta, kw)
    o, S = recurrence(q, k, v, beta, scale=scale, output_final_state=kw.get("output_final_state", False))
    return _finish(o, S, v, kw)


def gated_delta_rule(q, k, v, g, beta, scale=None, **kw):
    q, k, beta, g = _prepare(q, k, beta, kw, g=g)
    o, S = recurrence(q, k, v, beta, g, scale=scale, output_final_state=kw.get("output_final_state", False))
    return _finish(o, S, v, kw)


def gated_delta_product(q, k, v, g, beta, scale=None, num_householder=1, **kw):
    q, k, beta, g = _prepare(q, k, beta, kw, g=g)
    o, S = recurrence(q, k, v, beta, g, scale=scale, steps=num_householder,
                      output_final_state=kw.get("output_final_state", False))
    return _finish(o, S, v, kw)


def kda(q, k, v, g, beta, scale=None, **kw):
    q, k, beta, gk = _prepare(q, k, beta, kw, g=g, per_key=True)
    o, S = recurrence(q, k, v, beta, gk=gk, scale=scale, output_final_state=kw.get("output_final_state", False))
    return _finish(o, S, v, kw)


def gla(q, k, v, g=None, scale=None, gk=None, **kw):
    _refuse_state(kw)
    o, S = recurrence(q, k, v, gk=g if g is not None else gk, scale=scale, delta=False,
                      output_final_state=kw.get("output_final_state", False))
    return _finish(o, S, v, kw)


def retention(q, k, v, scale=None, **kw):
    """RetNet's retention (``chunk_retention`` and the others): a fixed decay
    ``gamma_h = 1 - 2^(-5 - h)`` per head, no beta, no delta step."""
    _refuse_state(kw)
    B, T, H, _ = q.shape
    g = torch.log(1 - torch.pow(2.0, -5.0 - torch.arange(H, dtype=torch.float32))).expand(B, T, H)
    o, S = recurrence(q, k, v, g=g, scale=scale, delta=False, output_final_state=kw.get("output_final_state", False))
    return _finish(o, S, v, kw)


def linear_attn(q, k, v, scale=None, normalize=False, **kw):
    """Linear attention (``chunk_linear_attn`` and the others): ``S <- S + k v^T``, no decay, no
    beta; the normalised form (``normalize``, a running ``q . sum k`` divisor) is not covered."""
    _refuse_state(kw)
    if normalize:
        raise NotImplementedError("the CPU oracle has no normalised linear attention")
    o, S = recurrence(q, k, v, scale=scale, delta=False, output_final_state=kw.get("output_final_state", False))
    return _finish(o, S, v, kw)


def softmax_attention(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                      softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash-attn's ``flash_attn_func``: ``q: [B, Tq, H, D]``, ``k, v: [B, Tk, G, D]`` (``G``
    dividing ``H``: query head h reads key/value head ``h // (H / G)``) -> ``[B, Tq, H, D]``,
    ``softmax(q k^T * scale) v`` with ``scale = softmax_scale or 1/sqrt(D)``, in float32. Query i
    sits at key position ``i + Tk - Tq`` (flash-attn aligns the last query with the last key) and
    sees key j when ``p - left <= j <= p + right`` for ``window_size = (left, right)``, a negative
    side unbounded; ``causal`` sets ``right = 0``. fla passes ``causal=True`` and
    ``(-1, -1)`` or ``(window - 1, 0)``."""
    if dropout_p or softcap or alibi_slopes is not None or return_attn_probs:
        raise NotImplementedError("the CPU oracle's attention has no dropout, softcap, ALiBi or returned "
                                  "probabilities")
    B, Tq, H, D = q.shape
    Tk, G = k.shape[1], k.shape[2]
    if H % G:
        raise ValueError(f"query heads H={H} must be a multiple of key/value heads G={G}")
    scale = D ** -0.5 if softmax_scale is None else softmax_scale
    kf = k.float().repeat_interleave(H // G, dim=2)  # [B, Tk, H, D]: query head h reads kv head h // (H/G)
    vf = v.float().repeat_interleave(H // G, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q.float(), kf) * scale  # (B, H, Tq, Tk)
    left, right = window_size
    right = 0 if causal else right
    d = (torch.arange(Tq)[:, None] + Tk - Tq) - torch.arange(Tk)[None, :]  # query position - key position
    see = torch.ones(Tq, Tk, dtype=torch.bool)
    if left >= 0:
        see &= d <= left
    if right >= 0:
        see &= d >= -right
    p = s.masked_fill(~see, float("-inf")).softmax(-1)
    return torch.einsum("bhij,bjhd->bihd", p, vf).to(q.dtype)


def refuse_varlen_attention(*args, **kw):
    """``flash_attn_varlen_func`` (fla's Attention with a padding mask or ``cu_seqlens``): refused."""
    raise NotImplementedError("the CPU oracle runs unpacked attention without a padding mask: no "
                              "flash_attn_varlen_func")


def rotary_embedding(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                     chunk_indices=None):
    """``rotary_embedding``: ``x: [B, T, H, D]`` rotated with the rows ``offset .. offset + T`` of the
    ``cos``/``sin`` tables ``[S, R/2]`` (rotate-half, or interleaved pairs), the last ``D - R``
    features unchanged."""
    if cu_seqlens is not None or not isinstance(seqlen_offsets, int):
        raise NotImplementedError("the CPU oracle rotates unpacked sequences from one integer offset")
    T, R = x.shape[1], 2 * cos.shape[-1]
    c = cos[seqlen_offsets:seqlen_offsets + T].float()[None, :, None]
    s = sin[seqlen_offsets:seqlen_offsets + T].float()[None, :, None]
    xr = x[..., :R].float()
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rot = torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(-2)
    else:
        x1, x2 = xr.chunk(2, dim=-1)
        rot = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    return torch.cat([rot.to(x.dtype), x[..., R:]], dim=-1)


def elu_p1(x):
    return (F.elu(x.float()) + 1.0).to(x.dtype)


def short_conv_forward(self, x, residual=None, mask=None, cache=None, output_final_state=False,
                       cu_seqlens=None, **kw):
    """``ShortConvolution.forward``: depthwise causal conv over time (+ bias), then the activation."""
    _refuse_state({"initial_state": cache, "cu_seqlens": cu_seqlens})
    if mask is not None:
        x = x * mask.unsqueeze(-1)
    y, _ = causal_conv(x, self.weight[:, 0], self.bias, self.activation)
    return (y if residual is None else y + residual), None


def causal_conv(x, weight, bias=None, activation=None, **kw):
    """fla's ``causal_conv1d``: ``y_t = sum_j w[:, j] x_{t - W + 1 + j}`` (+ bias), SiLU if asked."""
    _refuse_state(kw)
    W = weight.shape[-1]
    y = F.conv1d(F.pad(x.float().transpose(1, 2), (W - 1, 0)), weight.float()[:, None], groups=weight.shape[0])
    if bias is not None:
        y = y + bias.float()[:, None]
    y = y.transpose(1, 2)
    if activation in ("silu", "swish"):
        y = F.silu(y)
    return y.to(x.dtype), None


def rms_norm_forward(self, x, residual=None, prenorm=False, residual_in_fp32=False):
    """fla's ``RMSNorm.forward``: with a residual, norm ``x + residual`` and (prenorm) return the sum."""
    if residual is not None:
        x = x + residual
    y = _rms(x, self.weight, self.eps)
    if getattr(self, "bias", None) is not None:
        y = y + self.bias
    return (y, x) if prenorm else y


def _rms(x, weight, eps):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float() if weight is not None else y).to(x.dtype)


def rms_norm_gated_forward(self, x, g, residual=None, prenorm=False, residual_in_fp32=False):
    """``FusedRMSNormGated.forward``: ``rmsnorm(x) * w * act(g)``, act SiLU or sigmoid."""
    if residual is not None:
        raise NotImplementedError("the CPU oracle has no residual in the gated norm")
    act = torch.sigmoid if self.activation == "sigmoid" else F.silu
    return _rms(x, self.weight, self.eps) * act(g.float()).to(x.dtype)


def swiglu_linear_forward(self, x, y, weight, bias):
    return F.linear(F.silu(x) * y, weight, bias)


#: (module, attribute) -> replacement, for the rule kernels each layer module imported by name.
RULE_KERNELS = {
    ("fla.layers.delta_net", "chunk_delta_rule"): delta_rule,
    ("fla.layers.delta_net", "fused_recurrent_delta_rule"): delta_rule,
    ("fla.layers.gated_deltanet", "chunk_gated_delta_rule"): gated_delta_rule,
    ("fla.layers.gated_deltanet", "fused_recurrent_gated_delta_rule"): gated_delta_rule,
    ("fla.layers.gated_deltanet", "causal_conv1d"): causal_conv,
    ("fla.layers.gated_deltaproduct", "chunk_gated_delta_product"): gated_delta_product,
    ("fla.layers.gated_deltaproduct", "fused_recurrent_gated_delta_rule"): gated_delta_rule,
    ("fla.layers.kda", "chunk_kda"): kda,
    ("fla.layers.kda", "fused_recurrent_kda"): kda,
    ("fla.layers.gla", "chunk_gla"): gla,
    ("fla.layers.gla", "fused_chunk_gla"): gla,
    ("fla.layers.gla", "fused_recurrent_gla"): gla,
    ("fla.layers.multiscale_retention", "chunk_retention"): retention,
    ("fla.layers.multiscale_retention", "fused_chunk_retention"): retention,
    ("fla.layers.multiscale_retention", "fused_recurrent_retention"): retention,
    ("fla.layers.multiscale_retention", "parallel_retention"): retention,
    ("fla.layers.linear_attn", "chunk_linear_attn"): linear_attn,
    ("fla.layers.linear_attn", "fused_chunk_linear_attn"): linear_attn,
    ("fla.layers.linear_attn", "fused_recurrent_linear_attn"): linear_attn,
    ("fla.layers.linear_attn", "elu_p1"): elu_p1,
    ("fla.modules.rotary.ops", "rotary_embedding"): rotary_embedding,
    # absent without flash-attn (fla sets flash_attn_func = None and leaves the other undefined)
    ("fla.layers.attn", "flash_attn_func"): softmax_attention,
    ("fla.layers.attn", "flash_attn_varlen_func"): refuse_varlen_attention,
}

_ABSENT = object()


@contextlib.contextmanager
def fla_on_cpu():
    """Within the block, fla's layers and models run on the CPU with the pure-PyTorch entry points."""
    import importlib

    from fla.modules import FusedRMSNormGated, RMSNorm, ShortConvolution
    from fla.modules.mlp import SwiGLULinear

    saved = []

    def swap(owner, name, new):
        saved.append((owner, name, getattr(owner, name, _ABSENT)))
        setattr(owner, name, new)

    try:
        for (mod, name), fn in RULE_KERNELS.items():
            swap(importlib.import_module(mod), name, fn)
        swap(ShortConvolution, "forward", short_conv_forward)
        swap(RMSNorm, "forward", rms_norm_forward)
        swap(FusedRMSNormGated, "forward", rms_norm_gated_forward)
        swap(SwiGLULinear, "forward", swiglu_linear_forward)
        yield
    finally:
        for owner, name, old in reversed(saved):
            if old is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, old)


def build(model_class, config):
    """``model_class(config)`` built inside `fla_on_cpu`: fla's ``Attention`` (a hybrid config's
    ``attn`` layers) refuses to be constructed without flash-attn's ``flash_attn_func``."""
    with fla_on_cpu():
        return model_class(config)


__all__ = ["fla_on_cpu", "build", "recurrence", "softmax_attention", "l2norm"]
