"""The ``cuda:chunk_linear`` kernel on memory layers with grouped value heads (``[layer]
value_heads = 2 heads``: q and k repeated per value head before the rule call, one memory per
value head): a whole model on the kernel equals the PyTorch path (logits, every parameter
gradient, decoding). The layer itself is tested in tests/core/test_grouped_heads.py; this one
lives here because the kernels must be defined under this folder's interpreter setting."""

from __future__ import annotations

import pytest
import torch
import triton  # noqa: F401 - without Triton this module must fail, not skip

from atlas_core.layer import MemoryLayer
from atlas_plugins.cuda_backend.backend_chunk import ChunkLinearBackend

from .oracle import check_model_on_kernel

pytestmark = pytest.mark.triton

SPEC = {
    "schema": "atlas/1", "name": "tiny-titans-grouped",
    "model": {"arch": "titans:lmm", "vocab_size": 32, "d_model": 32, "depth": 1, "heads": 2},
    "memory": {"use": "titans:titans", "anchor": 8, "parallel": {"use": "core:chunkwise", "chunk_size": 8}},
    "layer": {"value_heads": 4},
}
IDS = torch.randint(0, 32, (1, 16), generator=torch.Generator().manual_seed(1))  # two anchor blocks


def test_grouped_model_on_the_kernel_matches_pytorch(monkeypatch):
    heads = []  # the heads of every call the kernel ran
    real_run = ChunkLinearBackend.run

    def run(self, strategy, rule, p):
        heads.append(p.shape[1])
        return real_run(self, strategy, rule, p)

    monkeypatch.setattr(ChunkLinearBackend, "run", run)
    model = check_model_on_kernel(SPEC, IDS, monkeypatch)
    (layer,) = [m for m in model.modules() if isinstance(m, MemoryLayer)]
    assert (layer.heads, layer.value_heads) == (2, 4)
    assert heads and set(heads) == {4}, "the kernel did not run the 4 value heads"
