"""The memory layer: learned projections around a memory rule.

``MemoryLayer`` owns every learned parameter (the rule owns none but its feature map's and a deep
memory's initial weights, which the layer registers by holding the rule). For an input
``x: [B, T, d_model]``:

1. ``q, k, v = W_q x, W_k x, W_v x`` -> ``[B, T, H * D]`` (v: ``[B, T, Hv * Dv]`` with grouped
   value heads, below; so are the gates, the rule and the output from step 4 on);
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
   ``theta_scale`` multiplies the declared scale of the gate whose role is the step size),
   ``gamma = sigmoid(w_g x + b_g)`` (Omega window weight, b_g = 3.0);
   only the gates the rule declares are produced, the core's four first in that order (the rows
   of ``gate_proj``: gate, then head, then key dimension);
5. the rule: ``y, state = rule(q, k, v, gates, state, strategy=runner)``, where ``runner`` is the
   strategy resolved once when the layer is built (no registry lookup or ``supports()`` check
   per call); with half-precision weights outside autocast (bfloat16 inference), a rule without
   parameters of its own runs in float32 and its state stays float32;
6. per-head RMS norm of y (``output_norm``, weight and ``output_norm_eps``), the output gate
   ``y * act(W_o x [+ b_o])`` (``output_gate``: ``"sigmoid"``, ``"silu"`` or ``"none"``; with the
   norm, ``"silu"`` without bias is fla's gated RMSNorm ``RMSNorm(y) * silu(W_g x)``), merge
   heads, output projection.

Layer options that published layers differ in (docs/zoo.md, "Layer options"): ``q_scale``
(q multiplied after its norm, e.g. ``"rsqrt_d_key"`` = 1/sqrt(Dk) as fla's kernels do),
``qk_norm_eps`` (fla's ``x / sqrt(|x|^2 + eps)``), ``conv_init`` (``"identity"`` or fla's
``"normal"`` N(0, 0.02)), ``gate_form`` (per gate: ``"declared"``, ``"no_bias"``, ``"mamba2"``
``alpha = exp(-exp(A_log_h) softplus(w x + dt_bias))``, ``"gla"`` ``alpha = sigmoid(w x + b)^(1/16)``),
``qk_feature_map`` (a feature map on q and k after their norm, learned or not; the rule's key
size is its output's) and ``rotary`` (RoPE on q and k after the feature map, the position
carried in the state as ``"pos"``), both in `atlas_core.layer_qk`; ``q_scale`` comes after them.
A preset may declare defaults for them (``layer`` in its registration, like a knob declares its
gates): resolving a spec writes them into its ``[layer]`` (`with_preset_defaults`: a field left at
None takes the preset's value, else the core's), and the layer reads its params only (a field
still None, in params built by hand: the core's value).

Building from a spec: `MemoryRecipe` is the one reader of the resolved ``[memory]`` and ``[layer]``
tables (`MemoryLayer.from_spec` and every model's blocks use it). It takes the rule and the
strategy the spec's resolution built and checked (`MemoryPlan`), or builds and checks them once
itself, and gives each layer a copy of that rule: the strategy decision is made once per memory
spec and building a layer makes no registry look-up and no ``supports()`` call.

Grouped value heads (``value_heads = Hv``, a positive multiple of ``heads = H``; None: ``Hv = H``,
today's layer, the same parameters and outputs): as Qwen3.5's ``linear_num_value_heads`` over
``linear_num_key_heads`` and fla's ``num_v_heads`` over ``num_heads``, q and k stay per key head
(``q_proj``, ``k_proj``, their convolutions, norms, feature map and rotary: ``[B, T, H, Dk]``)
while v, its convolution, every gate row (and a mamba2 gate's ``A_log``), the rule's state (one
memory per value head: the rule is bound to ``Hv`` heads), the output norm, the output gate and
``o_proj``'s input are per value head. Key head i serves the ``G = Hv / H`` consecutive value
heads ``i G .. i G + G - 1`` (transformers' ``repeat_interleave(G)``, fla's ``(h g)``): q and k are
repeated to ``[B, T, Hv, Dk]`` just before the rule call. That is a copy, G times their size (as
large as v): one head axis of ``Hv`` cannot be a view of ``H`` heads (a stride-0 group axis does not
merge with the head axis), and the rule's call takes ``[B, T, heads, D]``. The rule and every
strategy and kernel then see ``Hv`` ordinary heads and run a grouped layer unchanged. What
grouping could save is compute, not the copy: ``core:exact_chunk`` forms the Gram products
``k k^T`` and ``q k^T`` of each chunk per value head, though they depend on the key head only
(about half its ``C d`` work a token; the solve, the decay matrices and the ``d^2`` state products
are per value head); that sharing is not done.

``forward(x, state=None) -> (y, state)``: the state is a flat dict of tensors — ``"conv.q"``,
``"conv.k"``, ``"conv.v"`` (the last conv_size - 1 pre-convolution inputs, so the convolution
continues exactly across calls), ``"pos"`` with ``rotary`` (``[B]``, the tokens seen) and
``"rule.<key>"`` for the rule's state. Any split of a
sequence into calls with the carried state equals one call, for every strategy (docs/math.md,
"The strategy contract"); a one-token call runs the rule's sequential step.

``forward(x, state=None, cu_seqlens=cu)`` with ``x: [1, T, d_model]`` runs packed documents
(`atlas_core.varlen`): the convolution and the rule restart at every boundary, and every state
entry holds one row per document.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from pydantic import Field
from .params import size_field
from torch import nn

from .errors import Issue, SpecError, did_you_mean
from .host.registry import Params
from .knobs.gates import CORE_GATE_NAMES
from .layer_qk import LEARNED_MAPS, QKFeatureMap, QKFeatureMapKind, feature_dim, positions, rotary


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


GateForm = Literal["declared", "no_bias", "mamba2", "gla"]
OutputGate = Literal["none", "sigmoid", "silu"]

#: The core's values of the options a preset may declare (`LayerParams`' defaults; a spec that
#: leaves one unset, or None, takes the preset's value: `with_preset_defaults`).
CORE_LAYER_DEFAULTS = {"output_gate": "sigmoid", "output_gate_bias": True, "conv_init": "identity",
                       "q_scale": 1.0}
#: Mamba-2's initialisation of the decay (Gated DeltaNet, KDA): A ~ U(0, 16), dt ~ logU(1e-3, 0.1).
MAMBA2_A_RANGE, MAMBA2_DT_RANGE, MAMBA2_DT_FLOOR = (0.0, 16.0), (1e-3, 0.1), 1e-4
#: GLA's gate normaliser: alpha = exp(logsigmoid(z) / 16).
GLA_GATE_NORMALIZER = 16.0


class LayerParams(Params):
    d_key: int | None = size_field(None, "width", ge=1, description="per-head key size (default d_model / heads)")
    d_value: int | None = size_field(None, "width", ge=1, description="per-head value size (default d_key)")
    conv_size: int = size_field(4, "kernel", ge=0, description="short causal depthwise conv kernel; 0 or 1 disables")
    conv_init: Literal["identity", "normal"] | None = Field(
        "identity", description="short-conv initial weights: 'identity' (last tap 1, plus N(0, 0.02) noise) or "
        "'normal' (N(0, 0.02), fla's); unset: the preset's, else 'identity'")
    qkv_activation: Literal["silu", "none"] = "silu"
    qk_norm: bool = Field(True, description="l2-normalise q and k per head")
    qk_norm_eps: float = Field(0.0, ge=0, description="0: q / max(|q|, 1e-12); > 0: q / sqrt(|q|^2 + eps) "
                               "(fla's l2norm, eps 1e-6)")
    q_scale: float | Literal["rsqrt_d_key"] | None = Field(
        1.0, description="multiply q (after its norm) by this; 'rsqrt_d_key' = 1/sqrt(d_key) (fla's "
        "kernels' default scale); unset: the preset's, else 1")
    output_norm: bool = Field(True, description="RMS-normalise each head's output")
    output_norm_eps: float = Field(1e-6, gt=0, description="epsilon of the output RMS norm")
    output_gate: bool | OutputGate | None = Field(
        "sigmoid", description="output gate y * act(W_o x + b_o): 'sigmoid' (true), 'silu' (with "
        "output_norm: fla's gated RMSNorm), 'none' (false); unset: the preset's, else 'sigmoid'")
    output_gate_bias: bool | None = Field(True, description="the output gate's projection has a bias "
                                          "(unset: the preset's, else true)")
    gate_bias: dict[str, float] = Field(
        default_factory=dict, description="initial bias of each gate's projection, by gate name "
        "(default: the preset's, else the gate's declared bias; alpha 3.0, eta 2.0, theta -4.6, gamma 3.0)")
    gate_form: dict[str, GateForm] = Field(
        default_factory=dict, description="how a gate is made from its projection, by gate name: "
        "'declared' (scale * activation(w x + b)), 'no_bias' (the same with b fixed at 0), 'mamba2' "
        "(exp(-exp(A_log) softplus(w x + dt_bias)), a retain factor), 'gla' (sigmoid(w x + b)^(1/16)); "
        "default: the preset's, else 'declared'")
    theta_scale: float = Field(1.0, gt=0, description="the step-size gate (theta): theta = theta_scale * sigmoid(...)")
    qk_feature_map: QKFeatureMapKind = Field(
        "none", description="a feature map on each head's q and k after their norm (atlas_core/layer_qk.py): "
        "'none', 'relu', 'elu_p1', 'hadamard' (fla's elementwise_product), 'hedgehog' (2 d_key features), "
        "'t2r'; the rule sees its output")
    qk_feature_map_tied: bool = Field(False, description="q and k share one learned feature map")
    rotary: bool = Field(False, description="rotate q and k by their position (RoPE, rotate-half, the "
                         "whole key; fla's RotaryEmbedding); the state carries the position")
    rotary_base: float = Field(10000.0, gt=0, description="RoPE's base (frequencies base^(-2i/d))")
    value_heads: int | None = size_field(
        None, "heads", ge=1, description="value heads (grouped value heads: a positive multiple of "
        "the model's heads; each q/k head serves value_heads / heads consecutive value heads, and v, "
        "the gates, the memory, the output norm and gate are per value head; Qwen3.5's "
        "linear_num_value_heads, fla's num_v_heads); None: one value head per q/k head")


def value_head_issues(value_heads: int | None, heads: int, path: str = "layer.value_heads") -> list[Issue]:
    """``[layer] value_heads`` that is not a positive multiple of the model's ``heads`` (each
    q/k head serves ``value_heads / heads`` consecutive value heads)."""
    if value_heads is None or (value_heads >= 1 and value_heads % heads == 0):
        return []
    lo = max(heads, value_heads // heads * heads)
    near = sorted({lo, lo + heads} - {value_heads})
    return [Issue(path, f"must be a positive multiple of the model's heads = {heads}: each query/key "
                  f"head serves value_heads / heads consecutive value heads", value_heads,
                  f"use {' or '.join(map(str, near))}, or leave layer.value_heads unset (one value "
                  "head per query/key head)")]


#: The `LayerParams` fields a preset may declare a default for (``layer=`` in `add_preset`).
PRESET_LAYER_FIELDS = (*CORE_LAYER_DEFAULTS, "gate_bias", "gate_form")


def with_preset_defaults(layer: dict, declared: dict, written: Any = None) -> dict:
    """A validated ``[layer]`` table with the preset's declared defaults resolved into it (what
    `atlas_core.spec.resolve_spec` writes): a field the table as ``written`` leaves unset (or
    None) takes the preset's value, else the core's; ``gate_bias`` and ``gate_form`` merge key by
    key (the table's over the preset's). A stated value is kept as written (``output_gate = true``
    stays true)."""
    out, written = dict(layer), written or {}
    for key, core in CORE_LAYER_DEFAULTS.items():
        if written.get(key) is None:
            out[key] = declared.get(key, core)
    for key in ("gate_bias", "gate_form"):
        out[key] = {**declared.get(key, {}), **(out.get(key) or {})}
    return out


def effective_options(p: LayerParams) -> dict:
    """The options the layer runs with: the params' value, else the core's (a resolved spec's
    ``[layer]`` holds the preset's already: `with_preset_defaults`); ``output_gate`` as a kind
    (true: "sigmoid", false: "none")."""
    out = {key: getattr(p, key) if getattr(p, key) is not None else core
           for key, core in CORE_LAYER_DEFAULTS.items()}
    gate = out["output_gate"]
    out["output_gate"] = {True: "sigmoid", False: "none"}.get(gate, gate) if isinstance(gate, bool) else gate
    out["gate_bias"], out["gate_form"] = dict(p.gate_bias), dict(p.gate_form)
    return out


def gate_form_issues(forms, gates, path: str = "layer.gate_form") -> list[Issue]:
    """``[layer] gate_form`` entries that name no gate of the rule, or put a retain-factor form
    (mamba2, gla) on a gate that is not a retain factor in [0, 1]."""
    by_name = {g.name: g for g in gates}
    issues = []
    for key, form in (forms or {}).items():
        gate = by_name.get(key)
        if gate is None:
            hint = did_you_mean(str(key), list(by_name)) or "gate_form keys are the names of the rule's gates"
            issues.append(Issue(f"{path}.{key}", f"the rule declares no gate {key!r} (its gates: "
                                f"{', '.join(by_name) or 'none'})", form, hint))
        elif form in ("mamba2", "gla") and tuple(gate.range or ()) != (0.0, 1.0):
            issues.append(Issue(f"{path}.{key}", f"form {form!r} makes a retain factor in (0, 1), and "
                                f"gate {key!r} is not one (its range: {gate.range_text()})", form,
                                "use 'declared' or 'no_bias' for this gate"))
    return issues


def l2_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / max(|x|, 1e-12)`` over the last axis (eps 0), else ``x / sqrt(|x|^2 + eps)`` (fla's)."""
    if eps == 0:
        return F.normalize(x, dim=-1)
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


class ShortConv(nn.Module):
    """Causal depthwise conv over time, ``[B, T, C] -> [B, T, C]``, with a carried cache."""

    def __init__(self, channels: int, kernel: int, init: str = "identity") -> None:
        super().__init__()
        self.kernel = kernel
        self.weight = nn.Parameter(torch.zeros(channels, 1, kernel))
        with torch.no_grad():  # "identity": the last tap 1 plus a little noise; "normal": N(0, 0.02)
            if init == "identity":
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
        bad = value_head_issues(p.value_heads, heads)
        if bad:
            raise SpecError(bad)
        # grouped value heads: each q/k head serves G consecutive value heads (one memory each)
        self.value_heads = Hv = p.value_heads or heads
        self.groups = Hv // heads
        self.d_key = p.d_key or d_model // heads
        self.d_value = p.d_value or self.d_key
        # the key size the rule sees: after the feature map on q and k (hedgehog doubles it)
        self.d_rule_key = feature_dim(p.qk_feature_map, self.d_key)
        if p.rotary and self.d_rule_key % 2:
            raise SpecError([Issue("layer.rotary", f"rotates pairs of key features, and the key has "
                                   f"{self.d_rule_key} (odd)", True, "make layer.d_key even")])
        self.rule = rule
        rule.bind(Hv, self.d_rule_key, self.d_value)  # one memory per value head
        # a rule without parameters of its own (a memory that starts at zero) runs in float32 when
        # the layer's weights are half precision (bf16 inference): its state stays float32
        self._state_in_float32 = not any(True for _ in rule.parameters())
        # the strategy is resolved and checked once, here; the layer owns the bound runner
        self.runner = rule.runner(strategy, registry)
        self.strategy = self.runner
        H, Dk, Dv = heads, self.d_rule_key, self.d_value
        # sub-steps per token (the rule declares them): n keys, values and per-step gates a token
        self.steps = n = rule.steps_per_token
        if p.rotary and n > 1:
            raise SpecError([Issue("layer.rotary", f"rotates one key per token, and the rule takes {n} "
                                   "(steps_per_token)", True, "set layer.rotary = false")])
        self.q_proj = nn.Linear(d_model, H * self.d_key, bias=False)
        self.k_proj = nn.Linear(d_model, n * H * self.d_key, bias=False)
        if p.qk_feature_map in LEARNED_MAPS:  # one map shared by the heads (k's is q's when tied)
            self.q_map = QKFeatureMap(p.qk_feature_map, self.d_key)
            if not p.qk_feature_map_tied:
                self.k_map = QKFeatureMap(p.qk_feature_map, self.d_key)
        elif p.qk_feature_map != "none":
            self.q_map = QKFeatureMap(p.qk_feature_map, self.d_key)
        self.v_proj = nn.Linear(d_model, n * Hv * Dv, bias=False)
        self.options = opts = effective_options(p)
        q_scale = opts["q_scale"]
        self.q_scale = float(Dk) ** -0.5 if q_scale == "rsqrt_d_key" else float(q_scale)
        self.use_conv = p.conv_size > 1
        if self.use_conv:
            init = opts["conv_init"]
            self.q_conv = ShortConv(H * self.d_key, p.conv_size, init)
            self.k_conv = ShortConv(n * H * self.d_key, p.conv_size, init)
            self.v_conv = ShortConv(n * Hv * Dv, p.conv_size, init)
        # the gates the rule's knobs declare (a standalone rule declares none)
        self.gate_decls = tuple(rule.gates)
        self.gate_names = tuple(g.name for g in self.gate_decls)
        self.step_gates = frozenset(rule.step_gates)
        bad = gate_bias_issues(opts["gate_bias"], self.gate_decls) + gate_form_issues(
            opts["gate_form"], self.gate_decls)
        if bad:
            raise SpecError(bad)
        self.gate_forms = tuple(opts["gate_form"].get(g.name, "declared") for g in self.gate_decls)
        self.gate_sizes = tuple(Hv * (Dk if g.shape == "key" else 1) * (n if g.name in self.step_gates else 1)
                                for g in self.gate_decls)
        self.gate_scales = tuple(
            g.scale * (p.theta_scale if g.role == "step_size" else 1.0) for g in self.gate_decls)
        if self.gate_names:
            self.gate_proj = nn.Linear(d_model, sum(self.gate_sizes))
            self.gate_A_log = nn.ParameterDict()  # per head, for each gate of form "mamba2"
            with torch.no_grad():
                self.gate_proj.weight.normal_(0.0, 0.02)
                rows = []
                for g, size, form in zip(self.gate_decls, self.gate_sizes, self.gate_forms):
                    rows.append(self._initial_bias(g, size, form, opts["gate_bias"]))
                    if form == "mamba2":
                        lo, hi = MAMBA2_A_RANGE
                        self.gate_A_log[g.name] = nn.Parameter(torch.empty(Hv).uniform_(lo, hi).log())
                self.gate_proj.bias.copy_(torch.cat(rows))
            # the rows of gates of form "no_bias" keep bias 0 (a mask, not a parameter: same keys)
            mask = torch.cat([torch.full((n,), 0.0 if f == "no_bias" else 1.0)
                              for n, f in zip(self.gate_sizes, self.gate_forms)])
            self.register_buffer("gate_bias_mask", mask, persistent=False)
        if p.output_norm:
            self.out_norm = nn.RMSNorm(Dv, eps=p.output_norm_eps)
        self.output_gate = opts["output_gate"]
        if self.output_gate != "none":
            self.out_gate = nn.Linear(d_model, Hv * Dv, bias=bool(opts["output_gate_bias"]))
        self.o_proj = nn.Linear(Hv * Dv, d_model, bias=False)

    @staticmethod
    def _initial_bias(gate, size: int, form: str, gate_bias: dict) -> torch.Tensor:
        """A gate's initial bias rows: 0 for "no_bias"; Mamba-2's ``dt_bias = softplus^-1(dt)``,
        ``dt ~ logU(1e-3, 0.1)`` for "mamba2" unless ``gate_bias`` sets it; else the spec's or the
        declared bias."""
        if form == "no_bias":
            return torch.zeros(size)
        if form == "mamba2" and gate.name not in gate_bias:
            lo, hi = MAMBA2_DT_RANGE
            dt = torch.exp(torch.rand(size) * (math.log(hi) - math.log(lo)) + math.log(lo))
            dt = dt.clamp(min=MAMBA2_DT_FLOOR)
            return dt + torch.log(-torch.expm1(-dt))
        return torch.full((size,), float(gate_bias.get(gate.name, gate.bias)))

    def gate_from_raw(self, gate, raw: torch.Tensor, form: str, scale: float) -> torch.Tensor:
        """A gate from its pre-activation ``raw`` (``[B, T, H]`` or ``[B, T, H, Dk]``)."""
        if form == "mamba2":  # in float32 at least (bf16 upcast; float64 kept, not rounded)
            work = torch.promote_types(raw.dtype, torch.float32)
            A = self.gate_A_log[gate.name].to(work).exp()
            A = A.unsqueeze(-1) if gate.shape == "key" else A
            return torch.exp(-A * F.softplus(raw.to(work))).to(raw.dtype)
        if form == "gla":
            return torch.exp(F.logsigmoid(raw) / GLA_GATE_NORMALIZER)
        return gate.activate(raw, scale)

    @classmethod
    def from_spec(cls, spec, *, d_model: int, heads: int, registry=None) -> "MemoryLayer":
        """Build from a resolved spec's ``[memory]`` and ``[layer]`` tables (`MemoryRecipe`)."""
        return MemoryRecipe(spec, registry).layer(d_model, heads)

    def gates(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every declared gate from ``x: [B, T, d_model]``: ``[B, T, Hv]`` per head, ``[B, T, Hv, Dk]``
        per key (``Hv``: the value heads)."""
        if not self.gate_names:
            return {}
        bias = self.gate_proj.bias * self.gate_bias_mask.to(self.gate_proj.bias.dtype)
        raw = F.linear(x, self.gate_proj.weight, bias).split(self.gate_sizes, dim=-1)
        out = {}
        for gate, r, scale, form in zip(self.gate_decls, raw, self.gate_scales, self.gate_forms):
            n = self.steps if gate.name in self.step_gates else 1
            if gate.shape == "key":
                r = rearrange(r, "b t (n h d) -> b t n h d", n=n, h=self.value_heads)
            else:
                r = rearrange(r, "b t (n h) -> b t n h", n=n, h=self.value_heads)
            if n == 1:
                r = r.squeeze(2)
            out[gate.name] = self.gate_from_raw(gate, r, form, scale)
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
        if self.steps > 1:  # [B, T, n, H, D]: n keys and values a token (v: [B, T, n, Hv, Dv])
            k = rearrange(k, "b t (n h d) -> b t n h d", n=self.steps, h=self.heads)
            v = rearrange(v, "b t (n h d) -> b t n h d", n=self.steps, h=self.value_heads)
        else:
            k = rearrange(k, "b t (h d) -> b t h d", h=self.heads)
            v = rearrange(v, "b t (h d) -> b t h d", h=self.value_heads)
        if self.params.qk_norm:
            q, k = l2_normalize(q, self.params.qk_norm_eps), l2_normalize(k, self.params.qk_norm_eps)
        if self.params.qk_feature_map != "none":
            q, k = self.q_map(q), getattr(self, "k_map", self.q_map)(k)
        if self.params.rotary:  # positions continue from the state's
            start = state.get("pos")
            if start is None:
                start = torch.zeros(x.shape[0] if not conv_cu else len(conv_cu[0]) - 1, dtype=torch.long,
                                    device=x.device)
            pos = positions(start, x.shape[1], *conv_cu)
            q, k = rotary(q, pos, self.params.rotary_base), rotary(k, pos, self.params.rotary_base)
            new_state["pos"] = start + (x.shape[1] if not conv_cu else
                                        torch.tensor(conv_cu[0], device=x.device).diff())
        if self.q_scale != 1.0:
            q = q * self.q_scale
        if self.groups > 1:  # key head i serves value heads i G .. i G + G - 1: [.., H, D] -> [.., Hv, D]
            q, k = q.repeat_interleave(self.groups, dim=-2), k.repeat_interleave(self.groups, dim=-2)
        rule_state = {key[5:]: t for key, t in state.items() if key.startswith("rule.")} or None
        gates = self.gates(x)
        low = x.dtype in (torch.bfloat16, torch.float16) and not torch.is_autocast_enabled(x.device.type)
        if low and self._state_in_float32:  # half-precision weights (inference): the memory in float32
            q, k, v = q.float(), k.float(), v.float()
            gates = {name: g.float() for name, g in gates.items()}
        y, rs = self.rule(q, k, v, gates=gates, state=rule_state, strategy=self.runner, **packed)
        y = y.to(x.dtype)
        new_state.update({f"rule.{key}": t for key, t in rs.items()})
        if self.params.output_norm:
            y = self.out_norm(y)
        y = rearrange(y, "b t h d -> b t (h d)")
        if self.output_gate == "sigmoid":
            y = y * torch.sigmoid(self.out_gate(x))
        elif self.output_gate == "silu":
            y = y * F.silu(self.out_gate(x))
        return self.o_proj(y), new_state

    def extra_repr(self) -> str:
        grouped = f", value_heads={self.value_heads}" if self.groups > 1 else ""
        return f"d_model={self.d_model}, heads={self.heads}{grouped}, d_key={self.d_key}, d_value={self.d_value}"


class MemoryPlan:
    """What resolving ``[memory]`` built, kept with the resolved spec for its build: the rule
    (unbound, its strategy resolved and checked once: ``rule.runner(value)`` is cached) and that
    strategy object, for the registry they were looked up in. Not part of the spec's content: a
    copied spec shares it, a pickled one drops it (the build then makes it again from the
    tables)."""

    def __init__(self, rule: nn.Module, strategy: Any, registry: Any) -> None:
        self.rule, self.strategy, self.registry = rule, strategy, registry
        # a rule that makes tensors when built (a learned feature map's coefficients) made them
        # on this device and in this dtype: a build under others (the meta device) builds anew
        self.holds_tensors = any(True for _ in rule.parameters()) or any(True for _ in rule.buffers())
        self.made_on = (torch.empty(()).device, torch.get_default_dtype())

    def __deepcopy__(self, memo):  # read only: a copy of the spec shares it
        return self

    def __reduce__(self):  # the rule and the bound strategy stay in this process
        return (_no_plan, ())

    def serves(self, registry: Any) -> bool:
        """Whether this plan was made with ``registry`` (None: the process-wide registry) and,
        for a rule holding tensors, on the default device and in the default dtype of now."""
        if registry is None:
            from .host.manager import get_registry

            registry = get_registry()
        here = (torch.empty(()).device, torch.get_default_dtype())
        return registry is self.registry and (not self.holds_tensors or here == self.made_on)

    def rule_copy(self) -> nn.Module:
        """A fresh copy of the rule for one layer, sharing the checked strategy object (its
        runner cache then answers the layer's ``rule.runner(strategy)`` without a check)."""
        return copy.deepcopy(self.rule, {id(self.strategy): self.strategy})


def _no_plan():
    return None


def memory_plan(memory: dict, registry: Any) -> MemoryPlan:
    """Build the rule of a ``[memory]`` table and resolve its ``parallel`` value (absent:
    ``"auto"``) once: the strategy checked (``supports()``) and bound. Raises `SpecError` or
    `atlas_core.errors.StrategyError` with the reason."""
    from .host.manager import get_registry
    from .rule import build_rule

    reg = registry if registry is not None else get_registry()
    rule = build_rule(memory, registry=reg, path="memory")
    strategy = rule.runner(memory.get("parallel", "auto"), reg)
    return MemoryPlan(rule, strategy, reg)


class MemoryRecipe:
    """What every memory layer of one model is built from, read from the resolved spec once per
    model: the validated ``[layer]`` params and the `MemoryPlan` of ``[memory]`` (the resolution's,
    when the spec carries one that serves this build; else made once, here). Each layer gets its own
    copy of the plan's rule, bound to its sizes, and the shared strategy object."""

    def __init__(self, spec: Any, registry: Any = None) -> None:
        self.spec, self.registry = spec, registry
        self.params: LayerParams | None = None  # read when the first layer is built
        self.plan: MemoryPlan | None = None

    @property
    def strategy(self) -> Any:
        return self.plan.strategy if self.plan is not None else None

    def _read(self) -> None:
        spec = self.spec
        layer = spec.layer if hasattr(spec, "layer") else spec.get("layer", {})
        self.params = layer if isinstance(layer, LayerParams) else LayerParams.model_validate(layer or {})
        plan = getattr(spec, "memory_plan", None)
        if plan is None or not plan.serves(self.registry):
            memory = dict(spec.memory if hasattr(spec, "memory") else spec["memory"])
            plan = memory_plan(memory, self.registry)
        self.plan = plan

    def layer(self, d_model: int, heads: int) -> "MemoryLayer":
        """One `MemoryLayer`: its own rule (bound to its sizes), the shared strategy object."""
        if self.plan is None:
            self._read()
        plan = self.plan
        return MemoryLayer(d_model, heads, plan.rule_copy(), self.params, strategy=plan.strategy,
                           registry=plan.registry)
