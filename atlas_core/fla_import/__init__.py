"""Import a flash-linear-attention checkpoint (``save_pretrained``'s directory) as an atlas checkpoint.

    from atlas_core.fla_import import import_fla
    import_fla("fla-model/", "runs/imported")      # then atlas_core.load("runs/imported")

``SRC`` holds ``config.json`` and the weights (``model.safetensors``, or shards listed in
``model.safetensors.index.json``) of one of fla 0.6.0's causal LMs: DeltaNet, Gated DeltaNet,
Gated DeltaProduct, KDA, GLA, RetNet or linear attention (``config.json``'s ``model_type``; the
mapping of each is in `atlas_core.fla_import.families` and docs/zoo.md, "Importing fla
checkpoints"). The model becomes
``core:lm`` with the family's zoo preset and every layer option set to fla's layer
(`atlas_core.layer.LayerParams`), with fla's weights, so its logits equal fla's model on the same
ids (float32); ``OUT`` is a run directory with one checkpoint (step 0) that ``atlas generate``,
``atlas eval --task ...``, ``atlas export-hf`` and `atlas_core.load` accept, decoding with O(1)
state per token and running under every strategy that accepts the rule.

An fla option the mapping cannot express is refused before anything is written: one `SpecError`
that names each option (``config.<key>``), its value and what is accepted. No code from ``SRC``
runs (the config is JSON, the weights safetensors).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ..errors import Issue, SpecError
from .families import FAMILIES, UNSUPPORTED, Family, check

FORMAT = "fla-import/1"


def read_config(src: Path) -> dict[str, Any]:
    path = src / "config.json"
    if not path.is_file():
        raise SpecError([Issue("config.json", f"{src} has no config.json; SRC is the directory an fla "
                               "model's save_pretrained wrote")])
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecError([Issue("config.json", f"cannot be read as JSON: {exc}")], str(path)) from None
    if not isinstance(cfg, dict):
        raise SpecError([Issue("config.json", "is not a JSON object")], str(path))
    return cfg


def read_weights(src: Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``src``'s safetensors files, by name."""
    from safetensors.torch import load_file

    index = src / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (src / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise SpecError([Issue("model.safetensors", f"{src} has no model.safetensors (nor an index of "
                               "shards); save the fla model with save_pretrained (safetensors)")])
    out: dict[str, torch.Tensor] = {}
    for name in files:
        out.update(load_file(str(src / name)))
    return out


#: the config's sizes every family reads
SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_heads")


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
    check(cfg, issues, "attn", None, "hybrid models with softmax-attention layers")
    check(cfg, issues, "attnres_block_size", None, "attention residuals between blocks")
    check(cfg, issues, "hidden_act", "swish", "the MLP is SwiGLU")
    fam = FAMILIES[kind](cfg, issues)
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
    memory = {**fam.memory, "parallel": "core:sequential"}
    return {"schema": "atlas/1", "name": name, "model": model, "memory": memory, "layer": fam.layer}


def state_dict_for(cfg: dict, fam: Family, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """fla's tensors under the names of the atlas model's ``state_dict`` (float32)."""
    out = {"embed.weight": tensors["model.embeddings.weight"], "norm.weight": tensors["model.norm.weight"]}
    out["head.weight"] = tensors.get("lm_head.weight", out["embed.weight"])
    for i in range(int(cfg["num_hidden_layers"])):
        pre, to = f"model.layers.{i}.", f"blocks.{i}."
        out[to + "norm_mem.weight"] = tensors[pre + "attn_norm.weight"]
        out[to + "norm_mlp.weight"] = tensors[pre + "mlp_norm.weight"]
        for a, b in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
            out[f"{to}mlp.{b}.weight"] = tensors[f"{pre}mlp.{a}.weight"]
        attn = {k[len(pre) + 5:]: v for k, v in tensors.items() if k.startswith(pre + "attn.")}
        for k, v in fam.attn_weights(attn, fam).items():
            out[f"{to}memory.{k}"] = v
    return {k: v.detach().to(torch.float32).contiguous() for k, v in out.items()}


def import_fla(src: str | Path, out: str | Path, *, overwrite: bool = False) -> dict[str, Any]:
    """Write ``out`` (a run directory with one checkpoint) from the fla checkpoint ``src``; returns
    a summary (``out``, ``checkpoint``, ``family``, ``preset``, ``parameters``)."""
    from ..model import build_model
    from ..spec import load_spec
    from ..train.checkpoint import save_checkpoint

    src, out = Path(src), Path(out)
    cfg = read_config(src)
    fam = family_for(cfg, str(src / "config.json"))
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise SpecError([Issue("OUT", f"{out} exists and is not empty", str(out),
                               "name a new directory, or pass --overwrite")])
    tensors = read_weights(src)
    spec = load_spec(spec_for(cfg, fam, name=f"fla-{cfg['model_type']}-{src.name or 'model'}"))
    model = build_model(spec)
    state = state_dict_for(cfg, fam, tensors)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    bad = [k for k in state if k in expected and state[k].shape != expected[k].shape]
    if missing or unexpected or bad:
        detail = "; ".join(f"{what}: {', '.join(keys[:6])}" for what, keys in
                           (("missing", missing), ("unexpected", unexpected), ("wrong shape", bad)) if keys)
        raise SpecError([Issue("weights", f"the fla tensors do not fit the mapped model ({detail})",
                               None, "the checkpoint does not match its config.json")], str(src))
    model.load_state_dict(state, strict=True)
    used = {f"model.layers.{i}." for i in range(int(cfg["num_hidden_layers"]))}
    leftover = sorted(k for k in tensors if not (k.startswith(tuple(used)) or k in
                      ("model.embeddings.weight", "model.norm.weight", "lm_head.weight")))
    if leftover:
        raise SpecError([Issue("weights", "tensors the mapping does not place", ", ".join(leftover[:6]))], str(src))
    out.mkdir(parents=True, exist_ok=True)
    meta = {"imported": {"format": FORMAT, "from": str(src), "model_type": cfg["model_type"]}}
    ckpt = save_checkpoint(out, 0, model=model, spec=spec, optimizer_state=({}, {}), rng={}, meta=meta)
    return {"out": str(out), "checkpoint": str(ckpt), "family": cfg["model_type"],
            "preset": fam.memory["use"], "parameters": sum(p.numel() for p in model.parameters())}


__all__ = ["import_fla", "family_for", "spec_for", "state_dict_for", "read_config", "read_weights"]
