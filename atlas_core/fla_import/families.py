"""How each flash-linear-attention (fla 0.6.0) model family maps onto ``core:lm`` + a zoo preset.

`family_for(config)` returns a `Family`: the ``[memory]`` and ``[layer]`` tables of the atlas spec
and `Family.attn_weights`, which turns one fla layer's ``attn.*`` tensors into the memory layer's.
Every config option is either mapped, equal to the value the mapping assumes, or refused with an
`Issue` naming it (`check`). The equations behind the mapping are in docs/zoo.md ("Layer
options", "Mapping a published implementation onto the presets"): fla's state ``S`` is our
``M^T``, its ``beta`` our ``theta``, its log decays ``g``/``gk`` our ``log alpha``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..errors import Issue

#: theta held at 1 (a write of unit strength: fla without beta, GLA): ``sigmoid(30)`` is 1.0 in
#: float32, with a zero weight, so the gate gives exactly 1 and passes no gradient worth the name.
UNIT_THETA_BIAS = 30.0


@dataclass
class Family:
    memory: dict[str, Any]
    layer: dict[str, Any]
    attn_weights: Callable[[dict[str, torch.Tensor], "Family"], dict[str, torch.Tensor]]
    heads: int
    d_key: int
    d_value: int
    notes: list[str] = field(default_factory=list)
    #: fla's hybrid attention layers: (layer numbers, the [model.attention] table), or None
    attention: Any = None


def check(cfg: dict, issues: list[Issue], key: str, allowed: Any, why: str) -> None:
    """Refuse ``cfg[key]`` unless it is ``allowed`` (a value, or a tuple of accepted values)."""
    values = allowed if isinstance(allowed, tuple) else (allowed,)
    value = cfg.get(key, values[0])
    if value not in values:
        issues.append(Issue(f"config.{key}", f"not supported: {why}", value,
                            f"atlas imports {key} = {' or '.join(repr(v) for v in values)}"))


def _common_layer(cfg: dict, d_key: int, d_value: int, conv: bool) -> dict[str, Any]:
    """The layer options every fla layer here shares (docs/zoo.md, "Layer options")."""
    return {"d_key": d_key, "d_value": d_value, "conv_size": int(cfg.get("conv_size", 4)) if conv else 0,
            "conv_init": "normal", "qk_norm_eps": 1e-6, "q_scale": "rsqrt_d_key", "output_norm": True,
            "output_norm_eps": float(cfg.get("norm_eps", 1e-6)), "output_gate_bias": False,
            "theta_scale": 1.0}


def _qkv_conv(a: dict) -> dict[str, torch.Tensor]:
    out = {"q_proj.weight": a["q_proj.weight"], "k_proj.weight": a["k_proj.weight"],
           "v_proj.weight": a["v_proj.weight"], "o_proj.weight": a["o_proj.weight"]}
    for x in "qkv":
        if f"{x}_conv1d.weight" in a:
            out[f"{x}_conv.weight"] = a[f"{x}_conv1d.weight"]
    return out


def _low_rank(seq_prefix: str, a: dict) -> torch.Tensor:
    """``W_1 W_0`` of an ``nn.Sequential(Linear, Linear)`` projection (the same map, full rank)."""
    return a[f"{seq_prefix}.1.weight"].double().matmul(a[f"{seq_prefix}.0.weight"].double()).float()


def _out(a: dict, fam: Family, gate_weight: torch.Tensor | None = None, gate_bias=None) -> dict:
    # the per-head output norm: o_norm (GLA, RetNet: g_norm_swish_gate, fused with the gate, or
    # g_norm; linear attention: norm);
    # a norm without elementwise_affine has no weight (ones)
    names = [k for k in ("o_norm.weight", "g_norm_swish_gate.weight", "g_norm.weight", "norm.weight") if k in a]
    out = {"out_norm.weight": a[names[0]] if names else torch.ones(fam.d_value)}
    if gate_weight is not None:
        out["out_gate.weight"] = gate_weight
        if gate_bias is not None:
            out["out_gate.bias"] = gate_bias
    return out


def _unit_theta(rows: int, d_model: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(rows, d_model), torch.full((rows,), UNIT_THETA_BIAS)


# --- DeltaNet -----------------------------------------------------------------------------------

def delta_net(cfg: dict, issues: list[Issue]) -> Family:
    d, H = cfg["hidden_size"], cfg["num_heads"]
    check(cfg, issues, "qk_activation", "silu", "the memory layer applies SiLU to q, k and v")
    check(cfg, issues, "qk_norm", "l2", "the memory layer l2-normalises q and k")
    check(cfg, issues, "conv_bias", False, "the memory layer's short convolution has no bias")
    Dk, Dv = round(d * cfg.get("expand_k", 1.0)) // H, round(d * cfg.get("expand_v", 1.0)) // H
    layer = _common_layer(cfg, Dk, Dv, cfg.get("use_short_conv", True))
    layer.update(qkv_activation="silu", qk_norm=True, gate_form={"theta": "no_bias"},
                 output_gate="silu" if cfg.get("use_gate", False) else "none",
                 theta_scale=2.0 if cfg.get("allow_neg_eigval", False) else 1.0)

    if not cfg.get("use_beta", True):  # beta = 1 (2 with allow_neg_eigval: theta_scale 2)
        layer.update(gate_form={"theta": "declared"}, gate_bias={"theta": UNIT_THETA_BIAS})

    def weights(a: dict, fam: Family) -> dict:
        out = _qkv_conv(a)
        if cfg.get("use_beta", True):
            out["gate_proj.weight"], out["gate_proj.bias"] = a["b_proj.weight"], torch.zeros(H)
        else:
            out["gate_proj.weight"], out["gate_proj.bias"] = _unit_theta(H, d)
        out.update(_out(a, fam, a.get("g_proj.weight")))
        return out

    return Family({"use": "zoo:deltanet"}, layer, weights, H, Dk, Dv)


# --- Gated DeltaNet, Gated DeltaProduct, KDA -----------------------------------------------------

def _head_dims(cfg: dict, issues: list[Issue], grouped: bool = True) -> tuple[int, int, int, int]:
    """``(H, Hv, Dk, Dv)``: fla's q/k heads, value heads (``num_v_heads``, grouped value heads
    when above ``num_heads``: value head i reads q/k head ``i // (Hv / H)``, as ``[layer]
    value_heads``), key and value head sizes. ``grouped=False``: the model builds its layers
    without ``num_v_heads`` whatever the config says (``Hv = H``)."""
    H = cfg["num_heads"]
    Hv = cfg.get("num_v_heads") if grouped else None
    if Hv is None:
        Hv = H
    elif type(Hv) is not int or Hv < H or Hv % H:
        # fla builds num_v_heads below num_heads, but its kernels index value head i's q/k head as
        # i // (HV // H), a division by zero there
        issues.append(Issue("config.num_v_heads", f"not supported: grouped value heads must be a positive "
                            f"multiple of num_heads={H} (each q/k head serves num_v_heads / num_heads value "
                            "heads)", Hv, f"atlas imports num_v_heads = null or a multiple of {H}"))
        Hv = H
    Dk = int(cfg.get("head_dim", 256))
    return H, Hv, Dk, int(round(Dk * cfg.get("expand_v", 2.0)))


def _value_heads(layer: dict, H: int, Hv: int) -> None:
    """``[layer] value_heads`` for fla's ``num_v_heads``, set only when grouped (an ungrouped
    import's spec stays as it was)."""
    if Hv != H:
        layer["value_heads"] = Hv


def gated_deltanet(cfg: dict, issues: list[Issue]) -> Family:
    H, Hv, Dk, Dv = _head_dims(cfg, issues)
    check(cfg, issues, "conv_bias", False, "the memory layer's short convolution has no bias")
    layer = _common_layer(cfg, Dk, Dv, cfg.get("use_short_conv", True))
    _value_heads(layer, H, Hv)
    act = cfg.get("output_gate_activation", "swish")
    layer.update(qkv_activation="silu", qk_norm=True, gate_form={"alpha": "mamba2", "theta": "no_bias"},
                 output_gate=("sigmoid" if act == "sigmoid" else "silu") if cfg.get("use_gate", True) else "none",
                 theta_scale=2.0 if cfg.get("allow_neg_eigval", False) else 1.0)

    def weights(a: dict, fam: Family) -> dict:
        out = _qkv_conv(a)  # gate rows: alpha (Hv), then theta (Hv)
        out["gate_proj.weight"] = torch.cat([a["a_proj.weight"], a["b_proj.weight"]])
        out["gate_proj.bias"] = torch.cat([a["dt_bias"], torch.zeros(Hv)])
        out["gate_A_log.alpha"] = a["A_log"]
        out.update(_out(a, fam, a.get("g_proj.weight")))
        return out

    return Family({"use": "zoo:gated_deltanet"}, layer, weights, H, Dk, Dv)


def gated_deltaproduct(cfg: dict, issues: list[Issue]) -> Family:
    # fla 0.6.0's GatedDeltaProduct layer takes num_v_heads, but its config class has no such option
    # and its model builds every layer without it: a num_v_heads in config.json (kept as an extra
    # attribute) changes nothing in the model, so here neither (value_heads is not set). Were a
    # later fla to pass it on, the grouped weights would not fit this mapping's shapes and the
    # import would stop at its shape check, not run a different function.
    H, _, Dk, Dv = _head_dims(cfg, issues, grouped=False)
    n = int(cfg.get("num_householder", 1))
    forget = cfg.get("use_forget_gate", False)
    layer = _common_layer(cfg, Dk, Dv, cfg.get("use_short_conv", True))
    layer.update(qkv_activation="silu", qk_norm=True,
                 gate_form={"alpha": "mamba2", "theta": "no_bias"} if forget else {"theta": "no_bias"},
                 output_gate="silu" if cfg.get("use_output_gate", True) else "none",
                 theta_scale=2.0 if cfg.get("allow_neg_eigval", False) else 1.0)
    memory = {"use": "zoo:gated_delta_product", "steps_per_token": n}
    if not forget:
        memory["retention"] = "core:none"

    def weights(a: dict, fam: Family) -> dict:
        out = _qkv_conv(a)  # gate rows: alpha (H) when forgetting, then theta (n H, sub-step major)
        if forget:
            out["gate_proj.weight"] = torch.cat([a["a_proj.weight"], a["b_proj.weight"]])
            out["gate_proj.bias"] = torch.cat([a["dt_bias"], torch.zeros(n * H)])
            out["gate_A_log.alpha"] = a["A_log"]
        else:
            out["gate_proj.weight"], out["gate_proj.bias"] = a["b_proj.weight"], torch.zeros(n * H)
        out.update(_out(a, fam, a.get("g_proj.weight")))
        return out

    return Family(memory, layer, weights, H, Dk, Dv)


def kda(cfg: dict, issues: list[Issue]) -> Family:
    H, Hv, Dk, Dv = _head_dims(cfg, issues)
    check(cfg, issues, "safe_gate", False, "the memory layer makes KDA's decay with Mamba-2's gate only")
    check(cfg, issues, "lower_bound", None, "the memory layer makes KDA's decay with Mamba-2's gate only")
    check(cfg, issues, "allow_neg_eigval", False, "KDA's beta is sigmoid(W_b x) here")
    layer = _common_layer(cfg, Dk, Dv, cfg.get("use_short_conv", True))
    layer.update(qkv_activation="silu", qk_norm=True, gate_form={"alpha": "mamba2", "theta": "no_bias"},
                 output_gate="sigmoid", output_gate_bias=True)
    _value_heads(layer, H, Hv)

    def weights(a: dict, fam: Family) -> dict:
        out = _qkv_conv(a)  # gate rows: alpha (Hv Dk, per key), then theta (Hv)
        out["gate_proj.weight"] = torch.cat([_low_rank("f_proj", a), a["b_proj.weight"]])
        out["gate_proj.bias"] = torch.cat([a["dt_bias"], torch.zeros(Hv)])
        out["gate_A_log.alpha"] = a["A_log"]
        out.update(_out(a, fam, _low_rank("g_proj", a), a["g_proj.1.bias"]))
        return out

    return Family({"use": "zoo:kda"}, layer, weights, H, Dk, Dv)


# --- GLA ----------------------------------------------------------------------------------------

def gla(cfg: dict, issues: list[Issue]) -> Family:
    d, H = cfg["hidden_size"], cfg["num_heads"]
    check(cfg, issues, "num_kv_heads", (None, H), "grouped key heads; the memory layer has one key per head")
    check(cfg, issues, "feature_map", None, "a feature map on q and k")
    check(cfg, issues, "clamp_min", None, "a floor on the log decay")
    check(cfg, issues, "hidden_act", "swish", "the output gate is SiLU (swish)")
    check(cfg, issues, "gate_logit_normalizer", 16, "the 'gla' gate form divides the log decay by 16")
    conv = cfg.get("use_short_conv", False)
    check(cfg, issues, "conv_bias", False, "the memory layer's short convolution has no bias")
    Dk, Dv = round(d * cfg.get("expand_k", 0.5)) // H, round(d * cfg.get("expand_v", 1.0)) // H
    layer = _common_layer(cfg, Dk, Dv, conv)
    layer.update(qkv_activation="silu" if conv else "none", qk_norm=False, gate_form={"alpha": "gla"},
                 output_gate="silu" if cfg.get("use_output_gate", True) else "none")

    def weights(a: dict, fam: Family) -> dict:
        out = _qkv_conv(a)  # gate rows: alpha (H Dk, per key), then theta (H) held at 1
        w1, b1 = _unit_theta(H, d)
        out["gate_proj.weight"] = torch.cat([_low_rank("gk_proj", a), w1])
        out["gate_proj.bias"] = torch.cat([a["gk_proj.1.bias"], b1])
        out.update(_out(a, fam, a.get("g_proj.weight")))
        return out

    layer["gate_bias"] = {"theta": UNIT_THETA_BIAS}
    return Family({"use": "zoo:gla"}, layer, weights, H, Dk, Dv)


# --- RetNet, linear attention ------------------------------------------------------------------

def _no_kv_groups(cfg: dict, issues: list[Issue]) -> None:
    check(cfg, issues, "num_kv_heads", (None, cfg["num_heads"]),
          "grouped key/value heads; the memory layer has one key and value per head")


def retnet(cfg: dict, issues: list[Issue]) -> Family:
    """fla's ``MultiScaleRetention``: no short convolution (``RetNetBlock`` does not pass
    ``use_short_conv``), no activation or norm on q and k, rotary embeddings on q and k, the
    fixed decay, ``RMSNorm(o) * silu(W_g x)`` (or ``RMSNorm(o)`` without the output gate)."""
    d, H = cfg["hidden_size"], cfg["num_heads"]
    _no_kv_groups(cfg, issues)
    check(cfg, issues, "feature_map", None, "a feature map on q and k before the rotary embedding")
    Dk, Dv = round(d * cfg.get("expand_k", 1.0)) // H, round(d * cfg.get("expand_v", 2.0)) // H
    layer = _common_layer(cfg, Dk, Dv, conv=False)
    layer.update(qkv_activation="none", qk_norm=False, rotary=True,
                 output_gate="silu" if cfg.get("use_output_gate", True) else "none",
                 gate_bias={"theta": UNIT_THETA_BIAS})

    def weights(a: dict, fam: Family) -> dict:
        out = _qkv_conv(a)
        out["gate_proj.weight"], out["gate_proj.bias"] = _unit_theta(H, d)
        out.update(_out(a, fam, a.get("g_proj.weight")))
        return out

    return Family({"use": "zoo:retnet"}, layer, weights, H, Dk, Dv)


#: fla's linear-attention feature maps -> ``[layer] qk_feature_map``
LINEAR_ATTN_MAPS = {"elementwise_product": "hadamard", "hedgehog": "hedgehog", "t2r": "t2r",
                    "identity": "none", "relu": "relu", "elu": "elu_p1"}


def _feature_map(a: dict, names: tuple[str, ...], to: str) -> dict:
    """One learned feature map's tensors (fla: ``layer1``, ``layer2`` for elementwise_product,
    ``layer`` for hedgehog and t2r) under ``to``; a map tied between q and k is saved once,
    under either name, so the first of ``names`` that holds tensors is read."""
    rename = {"layer1": "a", "layer2": "b", "layer": "a"}
    src = next((n for n in names if any(k.startswith(n + ".") for k in a)), None)
    out = {}
    for key, value in a.items():
        mod, sub, param = (key.split(".") + ["", ""])[:3]
        if mod == src:
            out[f"{to}.{rename[sub]}.{param}"] = value
    return out


def linear_attn(cfg: dict, issues: list[Issue]) -> Family:
    """fla's ``LinearAttention``: a feature map on each head's q and k, ``S <- S + k v^T``, the
    read scaled by ``1/sqrt(feature size)``, a per-head RMSNorm, no gate and no convolution."""
    d, H = cfg["hidden_size"], cfg["num_heads"]
    _no_kv_groups(cfg, issues)
    fmap = cfg.get("feature_map", "elementwise_product")
    if fmap not in LINEAR_ATTN_MAPS:
        issues.append(Issue("config.feature_map", "not supported: the memory layer's feature maps are "
                            f"{', '.join(LINEAR_ATTN_MAPS)} (fla's names)", fmap,
                            f"atlas imports feature_map = {' or '.join(repr(m) for m in LINEAR_ATTN_MAPS)}"))
    check(cfg, issues, "norm_q", False, "q divided by the sum of its features")
    check(cfg, issues, "norm_k", False, "k divided by the sum of its features")
    check(cfg, issues, "norm_feature_map", False, "the normalised form (o divided by q . sum of the keys)")
    Dk, Dv = round(d * cfg.get("expand_k", 1.0)) // H, round(d * cfg.get("expand_v", 1.0)) // H
    layer = _common_layer(cfg, Dk, Dv, conv=False)
    tied = bool(cfg.get("tie_feature_map_qk", False))
    layer.update(qkv_activation="none", qk_norm=False, qk_feature_map=LINEAR_ATTN_MAPS.get(fmap, "none"),
                 qk_feature_map_tied=tied, output_gate="none", gate_bias={"theta": UNIT_THETA_BIAS})

    def weights(a: dict, fam: Family) -> dict:
        out = _qkv_conv(a)
        out["gate_proj.weight"], out["gate_proj.bias"] = _unit_theta(H, d)
        out.update(_feature_map(a, ("feature_map_q", "feature_map_k"), "q_map"))
        if not tied:
            out.update(_feature_map(a, ("feature_map_k", "feature_map_q"), "k_map"))
        out.update(_out(a, fam))
        return out

    return Family({"use": "zoo:linear_attention"}, layer, weights, H, Dk, Dv)


#: fla ``model_type`` -> the family's mapping.
FAMILIES: dict[str, Callable[[dict, list[Issue]], Family]] = {
    "delta_net": delta_net,
    "gated_deltanet": gated_deltanet,
    "gated_deltaproduct": gated_deltaproduct,
    "kda": kda,
    "gla": gla,
    "retnet": retnet,
    "linear_attn": linear_attn,
}

#: fla families whose layer the memory layer cannot express, and why.
UNSUPPORTED = {
    "rwkv7": "fla's RWKV-7 layer (token shift, LoRA gates, value residual, group norm) is not a memory "
             "layer around zoo:rwkv7's rule",
}
