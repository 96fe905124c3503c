"""`load_for_inference(path, dtype)`: a checkpoint's model for decoding, built in ``dtype`` and
filled from the checkpoint in one pass (`atlas_core.train.weights_io`): the process holds the
model once, in the dtype asked for (a float32 checkpoint read as bfloat16 is converted piece by
piece, never held in float32 whole). The weights a decode step reads together are placed in one
matrix each before they are read (`atlas_core.decode.blocks.fuse_weights`), so the decoder
fuses nothing later."""

from __future__ import annotations

from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}


def dtype_of(value: str | torch.dtype) -> torch.dtype:
    """A dtype from its name (``float32``, ``bfloat16``, ``float16``, ``float64``) or itself."""
    if isinstance(value, torch.dtype):
        return value
    if value not in DTYPES:
        raise ValueError(f"dtype {value!r}: choose one of {', '.join(DTYPES)}")
    return DTYPES[value]


def load_for_inference(path: str | Path, dtype: str | torch.dtype = torch.float32, device: str = "cpu"):
    """The model of a run or checkpoint directory in eval mode, its weights in ``dtype``, with
    ``spec``, ``codec``, ``tokenizer``, ``checkpoint``, ``trained_steps`` and ``task`` attached as
    `atlas_core.load` attaches them."""
    return open_for_inference(path, dtype, device)[1]


def open_for_inference(path: str | Path, dtype: str | torch.dtype = torch.float32, device: str = "cpu"):
    """``(checkpoint, model)``: `load_for_inference` with the verified checkpoint it read."""
    from ..model import build_model
    from ..train.checkpoint_preflight import check_weights_fit, checked_load_checkpoint
    from ..train.setup import resolve_device

    dtype = dtype_of(dtype)
    ckpt = checked_load_checkpoint(str(path))
    check_weights_fit(ckpt)  # before anything is allocated
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = build_model(ckpt.spec)
    finally:
        torch.set_default_dtype(previous)
    from .blocks import fuse_weights
    from .engine import supports

    if supports(model)[0]:
        fuse_weights(model)  # the decoder's fused matrices, in place before the weights are read
    ckpt.load_model(model)
    from ..allocator import release_free

    release_free()  # the initial weights the checkpoint replaced (glibc keeps tensors < 32 MiB)
    model = model.to(resolve_device(device)).eval()
    model.spec, model.codec = ckpt.spec, ckpt.meta.codec()
    bpe = model.codec is not None and getattr(model.codec, "mode", None) == "bpe"
    model.tokenizer = model.codec.tokenizer if bpe else None
    model.checkpoint, model.trained_steps = ckpt.path, ckpt.step
    model.task = ckpt.meta.task or None
    return ckpt, model


__all__ = ["load_for_inference", "open_for_inference", "dtype_of", "DTYPES"]
