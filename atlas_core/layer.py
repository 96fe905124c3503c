"""The memory layer: learned projections around a memory rule.

``MemoryLayer`` owns every learned parameter (the rule owns none but its feature map's and a deep
memory's initial weights, which the layer registers by holding the rule). For an input
``x: [B, T, d_model]``:

1. ``q, k, v = W_q x, W_k x, W_v x`` -> ``[B, T, H * D]``;
2. a short causal depthwise convolution (kernel ``conv_size``) on each of q, k, v, then SiLU
   (Titans Sec 4.4; Atlas spec seed);
3. split into heads ``[B, T, H, D]``; l2-normalise q and k (``qk_norm``);
4. gates from x: one linear map per gate the rule declares (``rule.gates``, each an
   `atlas_core.knobs.Gate`), ``gate = scale * activation(w x + b)``, ``[B, T, H]`` for a gate of
   shape ``"head"`` and ``[B, T, H, Dk]`` for one of shape ``"key"`` (with ``n =
   rule.steps_per_token > 1``: ``k_proj``, ``v_proj`` and each gate in ``rule.step_gates`` make n
   per token, ``k, v: [B, T, n, H, D]``, step gates ``[B, T, n, H]``, the n rows of a token
   sub-step-major); ``b`` starts at
   ``[layer] gate_bias.<name>``, else at the declared ``bias``. The core's declarations:
   ``alpha = sigmoid(w_a x + b_a)`` (retain factor, b_a = 3.0 -> ~0.95),
   ``eta = sigmoid(w_e x + b_e)`` (momentum decay, b_e = 2.0 -> ~0.88),
   ``theta = theta_scale * sigmoid(w_t x + b_t)`` (inner learning rate, b_t = -4.6 -> ~0.01;
   ``theta_scale`` multiplies theta's declared scale),
   ``gamma = sigmoid(w_g x + b_g)`` (Omega window weight, b_g = 3.0);
   only the gates the rule declares are produced, the core's four first in that order (the rows
   of ``gate_proj``: gate, then head, then key dimension);
5. the rule: ``y, state = rule(q, k, v, gates, state, strategy=runner)``, where ``runner`` is the
   strategy resolved once when the layer is built (no registry lookup or ``supports()`` check
   per call);
6. per-head RMS norm of y (``output_norm``), a sigmoid output gate ``y * sigmoid(W_o x)``
   (``output_gate``), merge heads, output projection.

``forward(x, state=None) -> (y, state)``: the state is a flat dict of tensors — ``"conv.q"``,
``"conv.k"``, ``"conv.v"`` (the last conv_size - 1 pre-convolution inputs, so the convolution
continues exactly across calls) and ``"rule.<key>"`` for the rule's state. Any split of a
sequence into calls with the carried state equals one call, for every strategy (docs/math.md,
"The strategy contract"); a one-token call runs the rule's sequential step.

``forward(x, state=None, cu_seqlens=cu)`` with ``x: [1, T, d_model]`` runs packed documents
(`atlas_core.varlen`): the convolution and the rule restart at every boundary, and every state
entry holds one row per document.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from pydantic import Field
from .spec.bounds import size_field
from torch import nn

from .errors import Issue, SpecError, did_you_mean
from .host.registry import Params
from .knobs.gates import CORE_GATE_NAMES, CORE_GATES

#: The core gates' default initial biases (their declarations' ``bias``).
DEFAULT_GATE_BIAS = {g.name: g.bias for g in CORE_GATES}


def gate_bias_issues(gate_bias, gates, path: str = "layer.gate_bias") -> list[Issue]:
    """Keys of ``[layer] gate_bias`` that name no gate of the rule. The core's four names
    (alpha, eta, theta, gamma) are always accepted (a spec may set them for any rule; a rule
    that does not declare one ignores it), any other key must be declared by the rule."""
    declared = [g.name for g in gates]
    issues = []
    for key in gate_bias or {}:
        if key in declared or key in CORE_GATE_NAMES:
            continue
        hint = did_you_mean(str(key), list(dict.fromkeys(declared + list(CORE_GATE_NAMES))))
        issues.append(Issue(
            f"{path}.{key}", f"the rule declares no gate {key!r} (its gates: "
            f"{', '.join(declared) or 'none'})", gate_bias[key],
            hint or "gate_bias keys are the names of the gates the rule's knobs declare"))
    return issues


class LayerParams(Params):
    d_key: int | None = size_field(None, "width", ge=1, description="per-head key size (default d_model / heads)")
    d_value: int | None = size_field(None, "width", ge=1, description="per-head value size (default d_key)")
    conv_size: int = size_field(4, "kernel", ge=0, description="short causal depthwise conv kernel; 0 or 1 disables")
    qkv_activation: Literal["silu", "none"] = "silu"
    qk_norm: bool = Field(True, description="l2-normalise q and k per head")
    output_norm: bool = Field(True, description="RMS-normalise each head's output")
    output_gate: bool = Field(True, description="sigmoid output gate before the output projection")
    gate_bias: dict[str, float] = Field(
        default_factory=dict, description="initial bias of each gate's projection, by gate name "
        "(default: the gate's declared bias; alpha 3.0, eta 2.0, theta -4.6, gamma 3.0)")
    theta_scale: float = Field(1.0, gt=0, description="theta = theta_scale * sigmoid(...)")


class ShortConv(nn.Module):
    """Causal depthwise conv over time, ``[B, T, C] -> [B, T, C]``, with a carried cache."""

    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.kernel = kernel
        self.weight = nn.Parameter(torch.zeros(channels, 1, kernel))
        with torch.no_grad():  # start as the identity (last tap 1) plus a little noise
            self.weight[:, 0, -1] = 1.0
            self.weight.add_(0.02 * torch.randn_like(self.weight))

    def forward(self, x: torch.Tensor, cache: torch.Tensor | None, cu: list[int] | None = None):
        if cu is not None:  # packed documents: no output reads another document's input
            from .varlen import packed_short_conv

            return packed_short_conv(self, x, cache, cu)
        B, T, C = x.shape
        if cache is None:
            cache = x.new_zeros(B, self.kernel - 1, C)
        ext = torch.cat([cache.to(x.dtype), x], dim=1)  # (B, K-1+T, C)
        # y_t = sum_j w_j ext_{t+j} (what conv1d computes), as K shifted multiply-adds: on a CPU
        # about twice as fast as a depthwise conv1d, forward and backward
        w = self.weight[:, 0].to(x.dtype)  # (C, K)
        y = ext[:, :T] * w[:, 0]
        for j in range(1, self.kernel):
            y = torch.addcmul(y, ext[:, j : j + T], w[:, j])
        return y, ext[:, ext.shape[1] - (self.kernel - 1) :]


class MemoryLayer(nn.Module):
    def __init__(
        self,
        d_model: int,
        heads: int,
        rule: nn.Module,
        params: LayerParams | None = None,
        strategy: Any = None,
        registry: Any = None,
    ) -> None:
        super().__init__()
        p = params or LayerParams()
        if d_model % heads and p.d_key is None:
            raise ValueError(f"d_model={d_model} is not divisible by heads={heads}; set layer.d_key")
        self.params = p
        self.d_model, self.heads = d_model, heads
        self.d_key = p.d_key or d_model // heads
        self.d_value = p.d_value or self.d_key
        self.rule = rule
        rule.bind(heads, self.d_key, self.d_value)
        # the strategy is resolved and checked once, here; the layer owns the bound runner
        self.runner = rule.runner(strategy, registry)
        self.strategy = self.runner
        H, Dk, Dv = heads, self.d_key, self.d_value
        # sub-steps per token (the rule declares them): n keys, values and per-step gates a token
        self.steps = n = rule.steps_per_token
        self.q_proj = nn.Linear(d_model, H * Dk, bias=False)
        self.k_proj = nn.Linear(d_model, n * H * Dk, bias=False)
        self.v_proj = nn.Linear(d_model, n * H * Dv, bias=False)
        self.use_conv = p.conv_size > 1
        if self.use_conv:
            self.q_conv = ShortConv(H * Dk, p.conv_size)
            self.k_conv = ShortConv(n * H * Dk, p.conv_size)
            self.v_conv = ShortConv(n * H * Dv, p.conv_size)
        # the gates the rule's knobs declare (a standalone rule declares none)
        self.gate_decls = tuple(rule.gates)
        self.gate_names = tuple(g.name for g in self.gate_decls)
        self.step_gates = frozenset(rule.step_gates)
        bad = gate_bias_issues(p.gate_bias, self.gate_decls)
        if bad:
            raise SpecError(bad)
        self.gate_sizes = tuple(H * (Dk if g.shape == "key" else 1) * (n if g.name in self.step_gates else 1)
                                for g in self.gate_decls)
        self.gate_scales = tuple(
            g.scale * (p.theta_scale if g.name == "theta" else 1.0) for g in self.gate_decls)
        if self.gate_names:
            self.gate_proj = nn.Linear(d_model, sum(self.gate_sizes))
            with torch.no_grad():
                self.gate_proj.weight.normal_(0.0, 0.02)
                bias = [float(p.gate_bias.get(g.name, g.bias)) for g in self.gate_decls]
                rows = [b for b, n in zip(bias, self.gate_sizes) for _ in range(n)]
                self.gate_proj.bias.copy_(torch.tensor(rows))
        if p.output_norm:
            self.out_norm = nn.RMSNorm(Dv, eps=1e-6)
        if p.output_gate:
            self.out_gate = nn.Linear(d_model, H * Dv, bias=True)
        self.o_proj = nn.Linear(H * Dv, d_model, bias=False)

    @classmethod
    def from_spec(cls, spec, *, d_model: int, heads: int, registry=None) -> "MemoryLayer":
        """Build from a resolved spec's ``[memory]`` and ``[layer]`` tables."""
        from .rule import build_rule

        memory = dict(spec.memory if hasattr(spec, "memory") else spec["memory"])
        layer = spec.layer if hasattr(spec, "layer") else spec.get("layer", {})
        params = layer if isinstance(layer, LayerParams) else LayerParams.model_validate(layer or {})
        strategy = memory.get("parallel", "auto")
        rule = build_rule(memory, registry=registry, path="memory")
        return cls(d_model, heads, rule, params, strategy=strategy, registry=registry)

    def gates(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every declared gate from ``x: [B, T, d_model]``: ``[B, T, H]`` per head, ``[B, T, H, Dk]``
        per key."""
        if not self.gate_names:
            return {}
        raw = self.gate_proj(x).split(self.gate_sizes, dim=-1)
        out = {}
        for gate, r, scale in zip(self.gate_decls, raw, self.gate_scales):
            n = self.steps if gate.name in self.step_gates else 1
            if gate.shape == "key":
                r = rearrange(r, "b t (n h d) -> b t n h d", n=n, h=self.heads)
            else:
                r = rearrange(r, "b t (n h) -> b t n h", n=n, h=self.heads)
            if n == 1:
                r = r.squeeze(2)
            out[gate.name] = gate.activate(r, scale)
        return out

    def forward(self, x: torch.Tensor, state: dict | None = None, cu_seqlens: torch.Tensor | None = None):
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be [B, T, d_model={self.d_model}], got {tuple(x.shape)}")
        # packed documents (atlas_core/varlen.py): the state holds a row per document; the extra
        # arguments are passed only then (the calls stay as they were for everything else)
        packed, conv_cu = {}, ()
        if cu_seqlens is not None:
            from .varlen import check_cu_seqlens

            packed = {"cu_seqlens": cu_seqlens}
            conv_cu = (check_cu_seqlens(cu_seqlens, x.shape[1], x.shape[0]),)
        state = dict(state or {})
        new_state: dict[str, torch.Tensor] = {}
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.use_conv:
            q, new_state["conv.q"] = self.q_conv(q, state.get("conv.q"), *conv_cu)
            k, new_state["conv.k"] = self.k_conv(k, state.get("conv.k"), *conv_cu)
            v, new_state["conv.v"] = self.v_conv(v, state.get("conv.v"), *conv_cu)
        if self.params.qkv_activation == "silu":
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
        q = rearrange(q, "b t (h d) -> b t h d", h=self.heads)
        if self.steps > 1:  # [B, T, n, H, D]: n keys and values a token
            k = rearrange(k, "b t (n h d) -> b t n h d", n=self.steps, h=self.heads)
            v = rearrange(v, "b t (n h d) -> b t n h d", n=self.steps, h=self.heads)
        else:
            k = rearrange(k, "b t (h d) -> b t h d", h=self.heads)
            v = rearrange(v, "b t (h d) -> b t h d", h=self.heads)
        if self.params.qk_norm:
            q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        rule_state = {key[5:]: t for key, t in state.items() if key.startswith("rule.")} or None
        y, rs = self.rule(q, k, v, gates=self.gates(x), state=rule_state, strategy=self.runner,
                          **packed)
        new_state.update({f"rule.{key}": t for key, t in rs.items()})
        if self.params.output_norm:
            y = self.out_norm(y)
        y = rearrange(y, "b t h d -> b t (h d)")
        if self.params.output_gate:
            y = y * torch.sigmoid(self.out_gate(x))
        return self.o_proj(y), new_state

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, heads={self.heads}, d_key={self.d_key}, d_value={self.d_value}"
