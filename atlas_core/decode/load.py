"""`load_for_inference(path, dtype)`: a checkpoint's model for decoding, in ``dtype``."""

from __future__ import annotations

from pathlib import Path

import torch


def load_for_inference(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """The model of a run or checkpoint directory in eval mode, its weights in ``dtype``."""
    from ..api import load

    model = load(path, device=device)
    return model.to(dtype) if dtype != torch.float32 else model


__all__ = ["load_for_inference"]
