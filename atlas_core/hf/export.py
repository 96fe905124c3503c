"""Export a training checkpoint to a Hugging Face directory (``atlas export-hf``).

The directory holds what ``save_pretrained`` writes: ``config.json`` (an `AtlasConfig`: the
checkpoint's resolved spec and text codec, and an ``auto_map`` naming the remote code),
``model.safetensors`` (the native weights under ``model.``, a tied tensor stored once),
``generation_config.json`` and the remote code (``configuration_atlas.py``, ``modeling_atlas.py``:
`atlas_core.hf.remote_code`, so clients that never import ``atlas_core`` load it with
``trust_remote_code=True``); for a text model also its tokenizer (``tokenizer.json``,
``tokenizer_config.json``: ``AutoTokenizer`` opens it; byte, char or BPE, `atlas_core.hf.tokenizer`).
When a text model's vocabulary (characters, or BPE tokens) is smaller than ``vocab_size``, the
ids past it are listed in ``suppress_tokens``, as ``atlas generate`` never samples them.

The directory is written under a temporary name next to ``out_dir`` and renamed into place, so an
interrupted export leaves no half-written directory; an existing non-empty ``out_dir`` is only
replaced with ``overwrite=True``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ..errors import AtlasError


class HFUnavailableError(AtlasError, ImportError):
    """transformers is missing or too old for the integration."""


def usable_ids(codec: Any, vocab_size: int) -> int:
    """How many ids, from 0, mean something: a char vocabulary or a BPE tokenizer may have fewer
    than the model's ``vocab_size`` (``atlas generate`` samples only among these)."""
    if codec is not None and codec.vocab is not None:
        return min(vocab_size, len(codec.vocab))
    if codec is not None and codec.mode == "bpe":
        return min(vocab_size, codec.tokenizer.get_vocab_size())
    return vocab_size


def _save_tokenizer(codec: Any, out: Path) -> None:
    """The text codec as a Hugging Face fast tokenizer (``AutoTokenizer.from_pretrained``):
    byte, char or the BPE tokenizer (`atlas_core.hf.tokenizer`)."""
    from .tokenizer import hf_tokenizer

    hf_tokenizer(codec).save_pretrained(out)


def _normal_modes(folder: Path) -> None:
    """Every file of ``folder`` readable as a new file is (0o666 less the umask): safetensors
    writes the weights through a private temporary file (mode 0600), the other files are made
    with the umask's mode."""
    mask = os.umask(0)
    os.umask(mask)
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~mask)


#: the weight dtypes an export is written in (config.json's ``dtype``: what ``from_pretrained``
#: loads by default)
EXPORT_DTYPES = ("float32", "bfloat16")


def export_checkpoint(checkpoint: str | os.PathLike, out_dir: str | os.PathLike, *,
                      overwrite: bool = False, dtype: str = "float32") -> dict[str, Any]:
    """Write ``checkpoint`` (a checkpoint or run directory) to ``out_dir``; returns a summary.
    ``dtype``: the weights' dtype in the export (``"bfloat16"``: half the bytes; the memory of a
    parameter-free rule still runs in float32 when the model runs)."""
    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one an export is written in; use one of "
                         f"{', '.join(EXPORT_DTYPES)}")
    try:
        from .register import check_version

        check_version()
        from .config import AtlasConfig
        from .modeling import AtlasForCausalLM
    except ImportError as exc:
        raise HFUnavailableError(
            f"exporting to Hugging Face needs transformers>=5 ({exc}); pip install "
            "'atlas-ttm[hf]' (or pip install 'transformers>=5')") from None
    from ..train.inference import open_checkpoint

    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise ValueError(f"OUT_DIR {str(out)!r} is a file; give a directory path (it is created)")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"OUT_DIR {str(out)!r} exists and is not empty; choose a new directory or "
                         "pass --overwrite to replace it")
    ckpt, model, _ = open_checkpoint(str(checkpoint), "cpu")
    codec = ckpt.meta.codec()
    config = AtlasConfig.from_spec(ckpt.spec, text_codec=codec)
    hf = AtlasForCausalLM(config, native=model).eval()
    if dtype != "float32":
        import torch

        hf = hf.to(getattr(torch, dtype))
    usable = usable_ids(codec, model.vocab_size)
    if usable < model.vocab_size:
        hf.generation_config.suppress_tokens = list(range(usable, model.vocab_size))

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # the command prints its own summary
    try:
        hf.save_pretrained(tmp)
        if codec is not None:
            _save_tokenizer(codec, tmp)
        _normal_modes(tmp)
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return {
        "checkpoint": str(ckpt.path), "step": ckpt.step, "name": ckpt.spec.name,
        "arch": ckpt.spec.arch, "out_dir": str(out), "files": sorted(p.name for p in out.iterdir()),
        "text": codec.mode if codec is not None else None, "dtype": dtype,
    }
