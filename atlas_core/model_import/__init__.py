"""``atlas import SRC OUT``: a checkpoint directory of a known model family as an atlas run.

    from atlas_core.model_import import import_checkpoint
    import_checkpoint("qwen3.5-0.8b/", "runs/qwen")                 # then atlas_core.load("runs/qwen")
    import_checkpoint("qwen3.5-0.8b/", "runs/qwen-titans", overrides=["memory.use=titans:titans"])

``SRC`` is what ``save_pretrained`` wrote: ``config.json``, the safetensors weights (one file or
shards), optionally a tokenizer (``tokenizer.json``). The family is read from ``config.json``'s
``model_type``:

- flash-linear-attention's causal LMs (`atlas_core.fla_import.families`: DeltaNet, Gated DeltaNet,
  Gated DeltaProduct, KDA, GLA, RetNet, linear attention), with fla's hybrid ``attn`` layers;
- transformers' hybrids (`atlas_core.model_import.hybrids`): ``qwen3_5_text``, ``qwen3_5`` (the
  text model of the composite checkpoint), ``olmo_hybrid``, ``qwen3_next``.

The model becomes ``core:lm`` with the family's weights, so its logits equal the source model's
(float32). ``OUT`` is a run directory with one checkpoint (step 0) that ``atlas generate``,
``atlas eval``, ``atlas train --resume``, ``atlas export-hf`` and `atlas_core.load` accept; a
tokenizer in ``SRC`` is copied to ``OUT/tokenizer`` and recorded in the checkpoint, so text
prompts and text evaluation work.

``overrides`` (``KEY.PATH=VALUE``, as ``atlas train`` takes them) change the imported spec before
the model is built: e.g. ``memory.use=titans:titans`` swaps the memory rule of every memory layer.
Every weight the changed model can use is kept (same name and shape; a gate projection's rows gate
by gate), the rest starts from the model's initialisation, and the summary lists both
(`atlas_core.model_import.swap`).

An option the mapping cannot express is refused before anything is written: one `SpecError`
naming each (``config.<key>``), its value and what is accepted. No code from ``SRC`` runs.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Iterable

import torch

from ..errors import Issue, SpecError
from .files import copy_tokenizer, read_config, read_weights, tokenizer_files
from .hybrids import HYBRIDS, REFUSED, Imported

FORMAT = "atlas-import/1"


def known_types() -> list[str]:
    """Every ``model_type`` `import_checkpoint` maps."""
    from ..fla_import.families import FAMILIES

    return sorted(set(FAMILIES) | set(HYBRIDS))


def mapping_for(cfg: dict[str, Any], tensors: dict[str, torch.Tensor], name: str, source: str) -> Imported:
    """The `Imported` of a config and its tensors (one `SpecError` for what cannot be mapped)."""
    from ..fla_import.mapping import fla_mapping
    from ..fla_import.families import FAMILIES, UNSUPPORTED

    kind = cfg.get("model_type")
    if kind in HYBRIDS:
        try:
            imp = HYBRIDS[kind](cfg, tensors, name)
        except SpecError as exc:
            raise SpecError(exc.issues, source) from None
    elif kind in FAMILIES or kind in UNSUPPORTED:
        imp = fla_mapping(cfg, tensors, name, source)
    else:
        why = REFUSED.get(kind)
        raise SpecError([Issue("config.model_type", f"not supported: {why}" if why else
                               "not a model family atlas imports", kind,
                               f"atlas imports {', '.join(known_types())}")], source)
    imp.family = str(kind)
    leftover = sorted(set(tensors) - imp.used)
    if leftover:
        raise SpecError([Issue("weights", f"{len(leftover)} tensors the mapping does not place",
                               ", ".join(leftover[:6]), "the checkpoint does not match its config.json")],
                        source)
    return imp


def _fit(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load ``state`` strictly, or one `SpecError` naming what does not fit."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    bad = [f"{k} {tuple(state[k].shape)} != {tuple(expected[k].shape)}" for k in state
           if k in expected and state[k].shape != expected[k].shape]
    if missing or unexpected or bad:
        detail = "; ".join(f"{what}: {', '.join(keys[:6])}" for what, keys in
                           (("missing", missing), ("unexpected", unexpected), ("wrong shape", bad)) if keys)
        raise SpecError([Issue("weights", f"the tensors do not fit the mapped model ({detail})", None,
                               "the checkpoint does not match its config.json")], source)
    model.load_state_dict(state, strict=True)


def _text_meta(tok_dir: Path | None, notes: list[str]) -> dict[str, Any]:
    """A checkpoint's ``task`` record for a model with a subword tokenizer (text prompts, text
    eval), as training on the text task writes it."""
    if tok_dir is None:
        return {}
    from ..train.tokenizer import TokenizerError, load_tokenizer

    try:
        text = load_tokenizer(str(tok_dir / "tokenizer.json")).to_str()
    except TokenizerError as exc:  # e.g. the data extra is missing: the files are copied all the same
        notes.append(f"the tokenizer was copied, and cannot be used for text prompts: {exc}")
        return {}
    return {"task": {"use": "core:text", "params": {"mode": "bpe", "tokenizer": str(tok_dir)},
                     "text": {"mode": "bpe", "tokenizer": text}}}


def import_checkpoint(src: str | Path, out: str | Path, *, overrides: Iterable[str] = (),
                      overwrite: bool = False) -> dict[str, Any]:
    """Write ``out`` (a run directory with one checkpoint) from the checkpoint directory ``src``;
    returns a summary (``out``, ``checkpoint``, ``family``, ``preset``, ``parameters``, ``notes``,
    with overrides ``kept`` / ``initialised`` / ``dropped``)."""
    from ..model import build_model
    from ..spec import load_spec
    from ..train.checkpoint import save_checkpoint
    from ..train.checkpoint_meta import CheckpointMeta

    src, out = Path(src), Path(out)
    if not src.is_dir():
        raise SpecError([Issue("SRC", "is not a directory", str(src), "name the directory save_pretrained wrote")])
    cfg = read_config(src)
    source = str(src / "config.json")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise SpecError([Issue("OUT", f"{out} exists and is not empty", str(out),
                               "name a new directory, or pass --overwrite")])
    name = f"{cfg.get('model_type')}-{src.resolve().name or 'model'}"
    imp = mapping_for(cfg, read_weights(src), name, source)
    spec = load_spec(imp.spec)
    model = build_model(spec)
    _fit(model, {k: v.detach().to(torch.float32).contiguous() for k, v in imp.state.items()}, source)
    summary: dict[str, Any] = {}
    overrides = list(overrides)
    if overrides:
        from .swap import swap

        spec, model, summary = swap(imp.spec, model, overrides)
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        tok_dir = copy_tokenizer(tokenizer_files(src), out)
        meta = CheckpointMeta(extra={"imported": {"format": FORMAT, "from": str(src), "model_type": cfg.get("model_type"),
                                                  "overrides": overrides, "notes": imp.notes}}, **_text_meta(tok_dir, imp.notes))
        ckpt = save_checkpoint(out, 0, model=model, spec=spec, optimizer_state=({}, {}), rng={}, meta=meta)
    except BaseException:
        if created:  # nothing half-written is left behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    return {"out": str(out), "checkpoint": str(ckpt), "family": imp.family,
            "preset": spec.memory.get("use"), "parameters": sum(p.numel() for p in model.parameters()),
            "layers": list(spec.model.get("layers") or []), "tokenizer": str(tok_dir) if tok_dir else None,
            "notes": imp.notes, **summary}


def describe(summary: dict[str, Any]) -> str:
    """The human summary of an import."""
    kinds = summary.get("layers") or []
    mix = (f" ({kinds.count('memory')} memory + {kinds.count('attention')} attention blocks)"
           if "attention" in kinds else "")
    lines = [f"imported {summary['family']} as core:lm + {summary['preset']}{mix}, "
             f"{summary['parameters']:,} parameters, into {summary['out']}",
             f"checkpoint: {summary['checkpoint']}"]
    if summary.get("tokenizer"):
        lines.append(f"tokenizer: {summary['tokenizer']}")
    lines += [f"note: {n}" for n in summary.get("notes", [])]
    if "kept_count" in summary:
        lines.append(f"kept {summary['kept_count']:,} tensors from the source; initialised "
                     f"{len(summary['initialised'])} groups:")
        lines += [f"  new: {n}" for n in summary["initialised"]]
        lines += [f"  dropped: {n}" for n in summary.get("dropped", [])]
    return "\n".join(lines)


__all__ = ["import_checkpoint", "mapping_for", "known_types", "describe", "read_config", "read_weights",
           "FORMAT"]
