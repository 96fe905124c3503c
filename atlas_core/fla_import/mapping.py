"""An fla checkpoint's config and tensors as an atlas spec and state dict (`fla_mapping`, which
`atlas_core.model_import` reads): the family (`family_for`), its hybrid attention layers
(`attention_for`), the spec (`spec_for`) and the weights under the atlas model's names
(`state_dict_for`)."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import Issue, SpecError
from ..model_import.hybrids import Imported
from .families import FAMILIES, UNSUPPORTED, Family, check

#: the config's sizes every family reads
SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_heads")
#: the keys of one fla attention spec (fla.models.configuration_utils.AttentionSpec)
ATTN_KEYS = ("layers", "num_heads", "num_kv_heads", "qkv_bias", "window_size", "rope_theta")


def attention_for(cfg: dict[str, Any], issues: list[Issue]) -> tuple[list[int], dict[str, Any]] | None:
    """fla's ``attn`` (one spec, or a list of specs that differ only in their layers) as the
    attention layers (0-based) and the ``[model.attention]`` table; None without ``attn``."""
    attn = cfg.get("attn")
    if attn is None:
        return None
    specs = [attn] if isinstance(attn, dict) else attn
    if not isinstance(specs, list) or not specs or not all(isinstance(a, dict) for a in specs):
        issues.append(Issue("config.attn", "must be a table or a list of tables (fla's AttentionSpec)", attn))
        return None
    for i, a in enumerate(specs):
        extra = sorted(set(a) - set(ATTN_KEYS))
        if extra:
            issues.append(Issue(f"config.attn.{extra[0]}", "not an attention option atlas maps", a[extra[0]],
                                f"fla's attention options are {', '.join(ATTN_KEYS)}"))
    shared = [{k: v for k, v in a.items() if k != "layers"} for a in specs]
    if any(x != shared[0] for x in shared):
        issues.append(Issue("config.attn", "not supported: attention layers with different settings; the "
                            "attention blocks of a model share one [model.attention]", attn))
    a, d = specs[0], cfg["hidden_size"]
    H = a.get("num_heads")
    if type(H) is not int or H < 1 or d % H:
        issues.append(Issue("config.attn.num_heads", f"must be a positive integer dividing hidden_size={d}", H))
        return None
    layers = sorted(i for spec in specs for i in spec.get("layers", []))
    bad = [i for i in layers if type(i) is not int or not 0 <= i < cfg["num_hidden_layers"]]
    if bad or len(set(layers)) != len(layers):
        issues.append(Issue("config.attn.layers", f"must be distinct layer numbers in 0..{cfg['num_hidden_layers'] - 1}",
                            layers))
        return None
    bias = bool(a.get("qkv_bias", False))
    table = {"heads": H, "kv_heads": int(a.get("num_kv_heads") or H), "head_dim": d // H, "bias": bias,
             "out_bias": False, "qk_norm": "none", "rotary": True, "rotary_fraction": 1.0,
             "rotary_base": float(a.get("rope_theta", 10000.0)), "output_gate": "none",
             "window": a.get("window_size"), "block_norm": "pre"}
    return layers, table


def family_for(cfg: dict[str, Any], source: str = "config.json") -> Family:
    """The family mapping of ``cfg``, or one `SpecError` naming every option it cannot express."""
    kind = cfg.get("model_type")
    if kind in UNSUPPORTED:
        raise SpecError([Issue("config.model_type", f"not supported: {UNSUPPORTED[kind]}", kind,
                               f"atlas imports {', '.join(sorted(FAMILIES))}")], source)
    if kind not in FAMILIES:
        raise SpecError([Issue("config.model_type", "not an fla model family atlas imports", kind,
                               f"atlas imports {', '.join(sorted(FAMILIES))}")], source)
    sizes = [Issue(f"config.{key}", "must be a positive integer", cfg.get(key, "<missing>"),
                   "SRC's config.json as fla's save_pretrained writes it has it")
             for key in SIZES if type(cfg.get(key)) is not int or cfg[key] < 1]
    if sizes:
        raise SpecError(sizes, source)
    issues: list[Issue] = []
    check(cfg, issues, "attnres_block_size", None, "attention residuals between blocks")
    check(cfg, issues, "hidden_act", "swish", "the MLP is SwiGLU")
    fam = FAMILIES[kind](cfg, issues)
    fam.attention = attention_for(cfg, issues)
    if issues:
        raise SpecError(issues, source)
    return fam


def spec_for(cfg: dict[str, Any], fam: Family, name: str) -> dict[str, Any]:
    """The atlas spec (a mapping) of an fla config."""
    from ..lm import swiglu_hidden

    d = int(cfg["hidden_size"])
    hidden = cfg.get("intermediate_size") or swiglu_hidden(d, cfg.get("hidden_ratio") or 4)
    model = {"arch": "core:lm", "vocab_size": int(cfg["vocab_size"]), "d_model": d,
             "depth": int(cfg["num_hidden_layers"]), "heads": fam.heads, "mlp": "swiglu",
             "mlp_hidden": int(hidden), "tie_embeddings": bool(cfg.get("tie_word_embeddings", False)),
             "norm_eps": float(cfg.get("norm_eps", 1e-6)),
             "init_std": float(cfg.get("initializer_range", 0.02))}
    if fam.attention is not None:
        attn_layers, table = fam.attention
        model["layers"] = ["attention" if i in attn_layers else "memory" for i in range(model["depth"])]
        model["attention"] = table
    memory = {**fam.memory, "parallel": "core:sequential"}
    return {"schema": "atlas/1", "name": name, "model": model, "memory": memory, "layer": fam.layer}


def _attention_weights(a: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """fla's ``Attention`` (q, k, v, o projections, q/k bias with qkv_bias) as the core attention's."""
    out = {"attn.qkv.weight": torch.cat([a["q_proj.weight"], a["k_proj.weight"], a["v_proj.weight"]]),
           "attn.out.weight": a["o_proj.weight"]}
    if "q_proj.bias" in a:
        out["attn.qkv.bias"] = torch.cat([a["q_proj.bias"], a["k_proj.bias"], a["v_proj.bias"]])
    return out


def state_dict_for(cfg: dict, fam: Family, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """fla's tensors under the names of the atlas model's ``state_dict`` (float32)."""
    out = {"embed.weight": tensors["model.embeddings.weight"], "norm.weight": tensors["model.norm.weight"]}
    out["head.weight"] = tensors.get("lm_head.weight", out["embed.weight"])
    attn_layers = fam.attention[0] if fam.attention is not None else []
    for i in range(int(cfg["num_hidden_layers"])):
        pre, to = f"model.layers.{i}.", f"blocks.{i}."
        attn = {k[len(pre) + 5:]: v for k, v in tensors.items() if k.startswith(pre + "attn.")}
        if i in attn_layers:
            out[to + "norm_attn.weight"] = tensors[pre + "attn_norm.weight"]
            out.update({to + k: v for k, v in _attention_weights(attn).items()})
        else:
            out[to + "norm_mem.weight"] = tensors[pre + "attn_norm.weight"]
            for k, v in fam.attn_weights(attn, fam).items():
                out[f"{to}memory.{k}"] = v
        out[to + "norm_mlp.weight"] = tensors[pre + "mlp_norm.weight"]
        for a, b in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
            out[f"{to}mlp.{b}.weight"] = tensors[f"{pre}mlp.{a}.weight"]
    return {k: v.detach().to(torch.float32).contiguous() for k, v in out.items()}


def fla_mapping(cfg: dict[str, Any], tensors: dict[str, torch.Tensor], name: str, source: str) -> Imported:
    """An fla checkpoint as an `Imported` (`atlas_core.model_import`)."""
    fam = family_for(cfg, source)
    try:
        state = state_dict_for(cfg, fam, tensors)
    except KeyError as exc:
        raise SpecError([Issue("weights", "a tensor the config implies is missing", exc.args[0],
                               "the checkpoint does not match its config.json")], source) from None
    used = {k for k in tensors if k.startswith(tuple(f"model.layers.{i}." for i in range(cfg["num_hidden_layers"])))}
    used |= {"model.embeddings.weight", "model.norm.weight", "lm_head.weight"} & set(tensors)
    return Imported(spec_for(cfg, fam, name), state, used, family=str(cfg["model_type"]))
