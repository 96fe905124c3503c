"""What an import reads from a checkpoint directory: ``config.json``, the safetensors weights
(one file or shards listed in ``model.safetensors.index.json``, any dtype) and the tokenizer files.
Nothing in the directory is executed: the config is JSON, the weights safetensors, the tokenizer
JSON copied as text."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from ..errors import Issue, SpecError

#: the files of a Hugging Face tokenizer directory copied into an imported run (when present)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "added_tokens.json", "chat_template.jinja", "generation_config.json")


def read_config(src: Path) -> dict[str, Any]:
    path = src / "config.json"
    if not path.is_file():
        raise SpecError([Issue("config.json", f"{src} has no config.json; SRC is the directory a model's "
                               "save_pretrained wrote")])
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SpecError([Issue("config.json", f"cannot be read as JSON: {exc}")], str(path)) from None
    if not isinstance(cfg, dict):
        raise SpecError([Issue("config.json", "is not a JSON object")], str(path))
    return cfg


def weight_files(src: Path) -> list[Path]:
    """The safetensors files of ``src``: the shards its index lists, or ``model.safetensors``."""
    index = src / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = json.loads(index.read_text())["weight_map"].values()
        except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
            raise SpecError([Issue("model.safetensors.index.json", f"cannot be read: {exc!r}")], str(index)) from None
        files = [src / name for name in sorted(set(shards))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise SpecError([Issue("model.safetensors.index.json", "lists shards that are not in the "
                                   "directory", ", ".join(missing[:4]), "copy every shard beside the index")],
                            str(index))
        return files
    if (src / "model.safetensors").is_file():
        return [src / "model.safetensors"]
    raise SpecError([Issue("model.safetensors", f"{src} has no model.safetensors (nor an index of shards); "
                           "save the model with save_pretrained (safetensors)")])


def read_weights(src: Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``src``'s safetensors files, by name (in the dtype stored)."""
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for path in weight_files(src):
        out.update(load_file(str(path)))
    return out


def tokenizer_files(src: Path) -> list[Path]:
    """The tokenizer files of ``src`` (empty without a ``tokenizer.json``: a slow tokenizer's files
    alone are not read)."""
    if not (src / "tokenizer.json").is_file():
        return []
    return [src / name for name in TOKENIZER_FILES if (src / name).is_file()]


def copy_tokenizer(files: list[Path], out: Path) -> Path | None:
    """Copy the tokenizer ``files`` into ``out/tokenizer``; returns that directory (None: none)."""
    if not files:
        return None
    to = out / "tokenizer"
    to.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(f, to / f.name)
    return to


__all__ = ["read_config", "read_weights", "weight_files", "tokenizer_files", "copy_tokenizer", "TOKENIZER_FILES"]
