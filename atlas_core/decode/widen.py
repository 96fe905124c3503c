"""Prefill of a half-precision model with each block's weights widened to float32 while it runs
(`widened_blocks`).

A CPU without bfloat16 arithmetic multiplies bfloat16 matrices several times slower than float32
ones, and a prefill is nothing but such products. So for the length of a prefill each block, when
its turn comes, gets float32 copies of its half-precision parameters and float32 input; after it
its parameters are the half-precision tensors again and its output is rounded back to the model's
dtype. One block's float32 copy exists at a time (a few percent of the weights); the state a block
returns is in float32 where it was computed so (the decoder's buffers take it in their own dtype).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

_HALF = (torch.bfloat16, torch.float16)


def _widen(block, args, kwargs):
    kept = []
    for p in block.parameters():
        if p.dtype in _HALF:
            kept.append((p, p.data))
            p.data = p.data.to(torch.float32)
    block.__dict__["_widen_kept"] = kept
    x = args[0]
    block.__dict__["_widen_dtype"] = x.dtype
    return (x.to(torch.float32), *args[1:]), kwargs


def _narrow(block, args, kwargs, out):
    for p, data in block.__dict__.pop("_widen_kept", []):
        p.data = data
    x, state = out
    return x.to(block.__dict__.pop("_widen_dtype")), state


@contextmanager
def widened_blocks(model) -> Iterator[None]:
    """Within: each of ``model.blocks`` runs in float32 (module docstring); a float32 model or one
    off the CPU is left as it is."""
    half = model.embed.weight.dtype in _HALF and model.embed.weight.device.type == "cpu"
    handles = []
    if half:
        for block in model.blocks:
            handles.append(block.register_forward_pre_hook(_widen, with_kwargs=True))
            handles.append(block.register_forward_hook(_narrow, with_kwargs=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for block in model.blocks:  # a block that raised keeps no float32 copy
            for p, data in block.__dict__.pop("_widen_kept", []):
                p.data = data
            block.__dict__.pop("_widen_dtype", None)


__all__ = ["widened_blocks"]
