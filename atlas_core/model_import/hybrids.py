"""How transformers' hybrid causal LMs map onto ``core:lm``: Gated DeltaNet memory layers with
grouped value heads, softmax-attention blocks, SwiGLU or routed-expert MLPs.

Families (``config.json``'s ``model_type``): ``qwen3_5_text`` (``Qwen3_5ForCausalLM``),
``qwen3_5`` (``Qwen3_5ForConditionalGeneration``: its text model; the vision tower is dropped),
``olmo_hybrid`` (``OlmoHybridForCausalLM``) and ``qwen3_next`` (``Qwen3NextForCausalLM``).
`hybrid_mapping(cfg, weights)` gives an `Imported`: the atlas spec (a mapping), the state dict
under the atlas model's names (float32) and notes. Every config option is mapped, equal to the
value the mapping assumes, or refused by name (one `SpecError` listing each).

What maps to what (transformers -> atlas; docs/import.md has the table):

- ``layer_types``: ``linear_attention`` -> a ``"memory"`` block, ``full_attention`` ->
  ``"attention"``; the memory rule is ``zoo:gated_deltanet`` (``S <- exp(g) S``, then the delta
  step with ``beta``; read after), the key heads ``linear_num_key_heads`` (``[model] heads``),
  ``[layer] value_heads = linear_num_value_heads``; q and k l2-normalised (eps 1e-6), q scaled by
  ``1/sqrt(linear_key_head_dim)``; ``beta = sigmoid(b)`` (``theta``, form ``no_bias``; doubled
  with OLMo's ``linear_allow_neg_eigval``); ``g = -exp(A_log) softplus(a + dt_bias)`` (``alpha``,
  form ``mamba2``); the short convolution of q, k, v (SiLU after); the gated RMSNorm
  ``RMSNorm(o) * silu(z)`` (``output_norm`` + ``output_gate = "silu"``);
- Qwen's zero-centred RMSNorm ``x_hat * (1 + w)`` becomes an RMSNorm with weight ``1 + w`` (the
  blocks' norms, the final norm, attention's q/k norms); the gated norm's weight is plain;
- attention: q, k, v (and Qwen's output gate, the second half of each head's ``q_proj`` rows) in
  one ``qkv`` matrix; q/k norm per head (Qwen) or over all heads (OLMo); rotary on the first
  ``partial_rotary_factor`` of each head (Qwen3.5 text positions: the three mRoPE sections share
  one position, so mRoPE is plain RoPE); OLMo's attention blocks are post-norm, its released
  checkpoints without ``rope_theta`` use no positions;
- Qwen3-Next's fused ``in_proj_qkvz`` / ``in_proj_ba`` (grouped per key head) are split into q,
  k, v, z and b, a; its sparse blocks (``decoder_sparse_step``, ``mlp_only_layers``) become
  ``[model.moe]`` blocks (router, experts stacked, shared expert and its gate).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..errors import Issue, SpecError


@dataclass
class Imported:
    """One import: the spec (a mapping), the state dict, the source tensors used, notes."""

    spec: dict[str, Any]
    state: dict[str, torch.Tensor]
    used: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    family: str = ""


class Weights:
    """The source tensors by name, recording which were read; a name may have aliases (a
    checkpoint in transformers' released layout or in its in-memory one)."""

    def __init__(self, tensors: dict[str, torch.Tensor], prefix: str = "model.") -> None:
        self.tensors, self.prefix, self.used = tensors, prefix, set()

    def has(self, *names: str) -> bool:
        return any(n in self.tensors for n in names)

    def get(self, *names: str) -> torch.Tensor:
        for n in names:
            if n in self.tensors:
                self.used.add(n)
                return self.tensors[n].to(torch.float32)
        raise SpecError([Issue("weights", "a tensor the config implies is missing", " or ".join(names),
                               "the checkpoint does not match its config.json")])


def _num(cfg: dict, key: str, issues: list[Issue], default: Any = None) -> Any:
    value = cfg.get(key, default)
    if type(value) is not int or value < 1:
        issues.append(Issue(f"config.{key}", "must be a positive integer", value if value is not None else "<missing>"))
        return 1
    return value


def _expect(cfg: dict, issues: list[Issue], key: str, allowed: tuple, why: str, default: Any = None) -> None:
    value = cfg.get(key, default)
    if value not in allowed:
        issues.append(Issue(f"config.{key}", f"not supported: {why}", value,
                            f"atlas imports {key} = {' or '.join(repr(a) for a in allowed)}"))


def _rope(cfg: dict, issues: list[Issue]) -> tuple[bool, float, float]:
    """(rotary?, theta, fraction) from ``rope_parameters`` (or the older top-level keys)."""
    rp = cfg.get("rope_parameters") or {}
    if not isinstance(rp, dict):
        issues.append(Issue("config.rope_parameters", "must be a table", rp))
        return False, 10000.0, 1.0
    theta = rp.get("rope_theta", cfg.get("rope_theta"))
    if theta is None:
        return False, 10000.0, 1.0
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind != "default":
        issues.append(Issue("config.rope_parameters.rope_type", "not supported: scaled rotary embeddings "
                            "(the attention blocks rotate by plain RoPE)", kind, "atlas imports rope_type = 'default'"))
    fraction = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    return True, float(theta), float(fraction)


def _layer_kinds(cfg: dict, issues: list[Issue], depth: int) -> list[str]:
    types = cfg.get("layer_types")
    kinds = {"linear_attention": "memory", "full_attention": "attention"}
    if not isinstance(types, list) or len(types) != depth or any(t not in kinds for t in types):
        issues.append(Issue("config.layer_types", f"must list {depth} entries, each 'linear_attention' or "
                            "'full_attention'", types))
        return ["memory"] * depth
    return [kinds[t] for t in types]


def _base(cfg: dict, issues: list[Issue], name: str) -> tuple[dict, dict, dict]:
    """The ``[model]``, ``[memory]`` and ``[layer]`` tables every family shares."""
    d, depth = _num(cfg, "hidden_size", issues), _num(cfg, "num_hidden_layers", issues)
    Hk, Hv = _num(cfg, "linear_num_key_heads", issues), _num(cfg, "linear_num_value_heads", issues)
    Dk, Dv = _num(cfg, "linear_key_head_dim", issues), _num(cfg, "linear_value_head_dim", issues)
    if Hv % Hk:
        issues.append(Issue("config.linear_num_value_heads", f"must be a multiple of linear_num_key_heads={Hk}", Hv))
    _expect(cfg, issues, "hidden_act", ("silu",), "the MLP and the short convolution use SiLU", "silu")
    eps = float(cfg.get("rms_norm_eps", 1e-6))
    model = {"arch": "core:lm", "vocab_size": _num(cfg, "vocab_size", issues), "d_model": d, "depth": depth,
             "heads": Hk, "mlp": "swiglu", "mlp_hidden": _num(cfg, "intermediate_size", issues),
             "tie_embeddings": bool(cfg.get("tie_word_embeddings", False)), "norm_eps": eps,
             "init_std": float(cfg.get("initializer_range", 0.02)), "layers": _layer_kinds(cfg, issues, depth)}
    rotary, theta, fraction = _rope(cfg, issues)
    H = _num(cfg, "num_attention_heads", issues)
    model["attention"] = {"heads": H, "kv_heads": int(cfg.get("num_key_value_heads") or H),
                          "head_dim": int(cfg.get("head_dim") or d // H),
                          "bias": bool(cfg.get("attention_bias", False)),
                          "out_bias": bool(cfg.get("attention_bias", False)), "qk_norm": "head",
                          "rotary": rotary, "rotary_base": theta, "rotary_fraction": fraction}
    layer = {"d_key": Dk, "d_value": Dv, "value_heads": Hv, "conv_size": _num(cfg, "linear_conv_kernel_dim", issues, 4),
             "conv_init": "normal", "qkv_activation": "silu", "qk_norm": True, "qk_norm_eps": 1e-6,
             "q_scale": "rsqrt_d_key", "output_norm": True, "output_norm_eps": eps, "output_gate": "silu",
             "output_gate_bias": False, "gate_form": {"alpha": "mamba2", "theta": "no_bias"}, "theta_scale": 1.0}
    memory = {"use": "zoo:gated_deltanet", "parallel": "auto"}
    return {"schema": "atlas/1", "name": name, "model": model, "memory": memory, "layer": layer}, model, layer


def _split_rows(w: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    return list(w.split(sizes, dim=0))


def _memory_layer(W: Weights, pre: str, to: str, cfg: dict, out: dict, *, fused: str) -> None:
    """One Gated DeltaNet layer's tensors. ``fused``: ``"qkv"`` (Qwen3.5: ``in_proj_qkv``, ``z``,
    ``a``, ``b``), ``"qkvz"`` (Qwen3-Next: grouped ``in_proj_qkvz``, ``in_proj_ba``) or
    ``"separate"`` (OLMo: ``q_proj`` .. ``g_proj``)."""
    Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    Dk, Dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    G = Hv // Hk
    a = pre + "linear_attn."
    if fused == "qkv":
        q, k, v = _split_rows(W.get(a + "in_proj_qkv.weight"), [Hk * Dk, Hk * Dk, Hv * Dv])
        z, wa, wb = W.get(a + "in_proj_z.weight"), W.get(a + "in_proj_a.weight"), W.get(a + "in_proj_b.weight")
        o, norm = W.get(a + "out_proj.weight"), W.get(a + "norm.weight")
    elif fused == "qkvz":  # per key head: q (Dk), k (Dk), v (G Dv), z (G Dv); then b (G), a (G)
        w = W.get(a + "in_proj_qkvz.weight").view(Hk, 2 * Dk + 2 * G * Dv, -1)
        q, k, v, z = (t.reshape(-1, w.shape[-1]) for t in w.split([Dk, Dk, G * Dv, G * Dv], dim=1))
        ba = W.get(a + "in_proj_ba.weight").view(Hk, 2 * G, -1)
        wb, wa = (t.reshape(-1, ba.shape[-1]) for t in ba.split([G, G], dim=1))
        o, norm = W.get(a + "out_proj.weight"), W.get(a + "norm.weight")
    else:
        q, k, v = W.get(a + "q_proj.weight"), W.get(a + "k_proj.weight"), W.get(a + "v_proj.weight")
        z, wa, wb = W.get(a + "g_proj.weight"), W.get(a + "a_proj.weight"), W.get(a + "b_proj.weight")
        o, norm = W.get(a + "o_proj.weight"), W.get(a + "o_norm.weight")
    if W.has(a + "conv1d.weight"):
        conv = W.get(a + "conv1d.weight")
    else:  # OLMo's released layout: one convolution each. transformers' save_pretrained splits its
        # concatenated convolution into three equal parts whatever the q, k, v sizes: joined again
        # and split by size, both layouts read right
        conv = torch.cat([W.get(a + f"{x}_conv1d.weight") for x in "qkv"])
    cq, ck, cv = _split_rows(conv, [Hk * Dk, Hk * Dk, Hv * Dv])
    m = to + "memory."
    out.update({m + "q_proj.weight": q, m + "k_proj.weight": k, m + "v_proj.weight": v,
                m + "q_conv.weight": cq, m + "k_conv.weight": ck, m + "v_conv.weight": cv,
                m + "gate_proj.weight": torch.cat([wa, wb]),  # gate rows: alpha (Hv), then theta (Hv)
                m + "gate_proj.bias": torch.cat([W.get(a + "dt_bias"), torch.zeros(Hv)]),
                m + "gate_A_log.alpha": W.get(a + "A_log"), m + "out_norm.weight": norm,
                m + "out_gate.weight": z, m + "o_proj.weight": o})


def _attention(W: Weights, pre: str, to: str, att: dict, out: dict, *, centred: bool, gated: bool) -> None:
    """One attention layer: q (and gate), k, v into ``qkv``; o; q/k norms (``1 + w`` when centred)."""
    a = pre + "self_attn."
    H, D = att["heads"], att["head_dim"]
    shift = 1.0 if centred else 0.0
    rows = {}
    for part in ("weight", "bias") if att["bias"] else ("weight",):
        q = W.get(a + f"q_proj.{part}")
        if gated:  # per head: D query rows, then D gate rows
            q = q.view(H, 2 * D, *q.shape[1:])
            q, g = q[:, :D].reshape(H * D, *q.shape[2:]), q[:, D:].reshape(H * D, *q.shape[2:])
        parts = [q, W.get(a + f"k_proj.{part}"), W.get(a + f"v_proj.{part}")] + ([g] if gated else [])
        rows[part] = torch.cat(parts)
    t = to + "attn."
    out[t + "qkv.weight"] = rows["weight"]
    if "bias" in rows:
        out[t + "qkv.bias"] = rows["bias"]
    out[t + "out.weight"] = W.get(a + "o_proj.weight")
    if att["out_bias"]:
        out[t + "out.bias"] = W.get(a + "o_proj.bias")
    out[t + "q_norm.weight"] = W.get(a + "q_norm.weight") + shift
    out[t + "k_norm.weight"] = W.get(a + "k_norm.weight") + shift


def _mlp(W: Weights, pre: str, to: str, out: dict) -> None:
    for a, b in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
        out[f"{to}mlp.{b}.weight"] = W.get(f"{pre}mlp.{a}.weight")


def _moe(W: Weights, pre: str, to: str, E: int, out: dict) -> None:
    """A sparse block: the router, the experts stacked (``gate_up`` = gate rows then up rows), the
    shared expert and its gate (released layout: one tensor per expert; in-memory: stacked)."""
    m = pre + "mlp."
    out[to + "mlp.router"] = W.get(m + "gate.weight")
    if W.has(m + "experts.gate_up_proj"):
        out[to + "mlp.gate_up"], out[to + "mlp.down"] = W.get(m + "experts.gate_up_proj"), W.get(m + "experts.down_proj")
    else:
        e = m + "experts."
        out[to + "mlp.gate_up"] = torch.stack([torch.cat([W.get(f"{e}{i}.gate_proj.weight"),
                                                          W.get(f"{e}{i}.up_proj.weight")]) for i in range(E)])
        out[to + "mlp.down"] = torch.stack([W.get(f"{e}{i}.down_proj.weight") for i in range(E)])
    for a, b in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
        if W.has(f"{m}shared_expert.{a}.weight"):
            out[f"{to}mlp.shared.{b}.weight"] = W.get(f"{m}shared_expert.{a}.weight")
    if W.has(m + "shared_expert_gate.weight"):
        out[to + "mlp.shared_gate.weight"] = W.get(m + "shared_expert_gate.weight")


def _ends(W: Weights, cfg: dict, out: dict, *, centred: bool) -> None:
    p = W.prefix
    out["embed.weight"] = W.get(p + "embed_tokens.weight")
    out["norm.weight"] = W.get(p + "norm.weight") + (1.0 if centred else 0.0)
    tied = cfg.get("tie_word_embeddings", False)  # the head is the embedding (one tensor, two names)
    out["head.weight"] = out["embed.weight"] if tied else W.get("lm_head.weight")
    if tied and W.has("lm_head.weight"):
        W.get("lm_head.weight")  # a copy saved anyway: read, not placed


def _qwen(cfg: dict, tensors: dict, name: str, *, prefix: str, fused: str, moe: bool) -> Imported:
    issues: list[Issue] = []
    spec, model, layer = _base(cfg, issues, name)
    att = model["attention"]
    att.update(output_gate="sigmoid", qk_norm="head")
    sparse: list[int] = []
    if moe:
        E = _num(cfg, "num_experts", issues, 0) if cfg.get("num_experts") else 0
        step = int(cfg.get("decoder_sparse_step", 1) or 1)
        only = set(cfg.get("mlp_only_layers") or [])
        sparse = [i for i in range(model["depth"]) if E and i not in only and (i + 1) % step == 0]
        if sparse:
            model["moe"] = {"experts": E, "top_k": _num(cfg, "num_experts_per_tok", issues),
                            "hidden": _num(cfg, "moe_intermediate_size", issues),
                            "shared_hidden": int(cfg.get("shared_expert_intermediate_size") or 0),
                            "shared_gate": True, "norm_topk": bool(cfg.get("norm_topk_prob", True)),
                            "blocks": [i + 1 for i in sparse]}
            if cfg.get("output_router_logits") and cfg.get("router_aux_loss_coef"):
                # transformers adds the load-balancing loss only where the model outputs router logits
                model["moe"]["aux_loss"] = float(cfg["router_aux_loss_coef"])
    if issues:
        raise SpecError(issues)
    W, out = Weights(tensors, prefix), {}
    for i, kind in enumerate(model["layers"]):
        pre, to = f"{prefix}layers.{i}.", f"blocks.{i}."
        norm_in = "norm_mem" if kind == "memory" else "norm_attn"
        out[f"{to}{norm_in}.weight"] = W.get(pre + "input_layernorm.weight") + 1.0
        out[f"{to}norm_mlp.weight"] = W.get(pre + "post_attention_layernorm.weight") + 1.0
        if kind == "memory":
            _memory_layer(W, pre, to, cfg, out, fused=fused)
        else:
            _attention(W, pre, to, att, out, centred=True, gated=True)
        if i in sparse:
            _moe(W, pre, to, model["moe"]["experts"], out)
        else:
            _mlp(W, pre, to, out)
    _ends(W, cfg, out, centred=True)
    imp = Imported(spec, out, W.used)
    mtp = {k for k in tensors if k.startswith("mtp.")}
    if mtp:  # transformers ignores them as well
        imp.notes.append(f"the multi-token-prediction head ({len(mtp)} tensors, mtp.*) is not imported")
        imp.used |= mtp
    return imp


def qwen3_5_text(cfg: dict, tensors: dict, name: str) -> Imported:
    return _qwen(cfg, tensors, name, prefix="model.", fused="qkv", moe=False)


def qwen3_5(cfg: dict, tensors: dict, name: str) -> Imported:
    """The composite checkpoint: its ``text_config`` and ``model.language_model.*`` tensors."""
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise SpecError([Issue("config.text_config", "must be a table (the text model's config)", text)])
    text = {"tie_word_embeddings": cfg.get("tie_word_embeddings", False), **text}
    imp = _qwen(text, tensors, name, prefix="model.language_model.", fused="qkv", moe=False)
    visual = {k for k in tensors if k.startswith("model.visual.")}
    if visual:
        imp.notes.append(f"the vision tower ({len(visual)} tensors, model.visual.*) is not imported: "
                         "atlas runs the text model")
        imp.used |= visual
    return imp


def qwen3_next(cfg: dict, tensors: dict, name: str) -> Imported:
    return _qwen(cfg, tensors, name, prefix="model.", fused="qkvz", moe=True)


def olmo_hybrid(cfg: dict, tensors: dict, name: str) -> Imported:
    issues: list[Issue] = []
    spec, model, layer = _base(cfg, issues, name)
    model["attention"].update(qk_norm="all", output_gate="none", block_norm="post")
    layer["output_norm_eps"] = 1e-5  # OLMo's gated norm: fla's FusedRMSNormGated default
    layer["theta_scale"] = 2.0 if cfg.get("linear_allow_neg_eigval", True) else 1.0
    if issues:
        raise SpecError(issues)
    W, out = Weights(tensors), {}
    for i, kind in enumerate(model["layers"]):
        pre, to = f"model.layers.{i}.", f"blocks.{i}."
        if kind == "memory":
            out[to + "norm_mem.weight"] = W.get(pre + "attention_layer_norm.weight", pre + "input_layernorm.weight")
            out[to + "norm_mlp.weight"] = W.get(pre + "feedforward_layer_norm.weight",
                                                pre + "post_attention_layernorm.weight")
            _memory_layer(W, pre, to, cfg, out, fused="separate")
        else:  # post-norm: the norm after attention, the norm after the MLP
            out[to + "norm_attn.weight"] = W.get(pre + "feedforward_layer_norm.weight",
                                                 pre + "post_attention_layernorm.weight")
            out[to + "norm_mlp.weight"] = W.get(pre + "post_feedforward_layernorm.weight")
            _attention(W, pre, to, model["attention"], out, centred=False, gated=False)
        _mlp(W, pre, to, out)
    _ends(W, cfg, out, centred=False)
    return Imported(spec, out, W.used)


#: transformers ``model_type`` -> the family's mapping
HYBRIDS: dict[str, Callable[[dict, dict, str], Imported]] = {
    "qwen3_5_text": qwen3_5_text,
    "qwen3_5": qwen3_5,
    "olmo_hybrid": olmo_hybrid,
    "qwen3_next": qwen3_next,
}

#: transformers families refused by name, and why
REFUSED = {
    "kimi_linear": "Kimi Linear's attention layers are multi-head latent attention (low-rank compressed "
                   "keys and values with a decoupled rotary part), which the attention blocks do not "
                   "express; its KDA layers and experts alone would not give its logits",
    "qwen3_5_moe": "Qwen3.5's routed-expert variant is not mapped yet (its dense text model, qwen3_5_text, is)",
    "qwen3_5_moe_text": "Qwen3.5's routed-expert variant is not mapped yet (its dense text model, qwen3_5_text, is)",
}
