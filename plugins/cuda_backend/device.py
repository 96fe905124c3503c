"""The device a Triton launch runs on (imported by the launchers and the probe kernel)."""

from __future__ import annotations


def device_guard(tensor):
    """A context that makes ``tensor``'s CUDA device the current one for a launch (Triton launches
    on the current device: without it, tensors on ``cuda:1`` would run on ``cuda:0``); a no-op for
    CPU tensors under the interpreter."""
    import contextlib

    import torch

    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()
