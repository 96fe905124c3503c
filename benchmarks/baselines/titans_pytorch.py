"""Baseline: ``titans_pytorch.NeuralMemory`` (PyPI ``titans-pytorch``) on a matched deep memory.

Matched configuration, for ``x: [B, T, H * D]``:

| | this project (`MemoryLayer`, ``titans:titans_deep``) | titans-pytorch ``NeuralMemory`` |
|---|---|---|
| memory | per-head MLP, depth 2, hidden 4 D, SiLU, residual | per-head ``MemoryMLP(D, depth=2, expansion_factor=4)`` (GELU), LayerNorm + residual |
| heads, head size | H, D | ``heads=H, dim_head=D`` |
| chunk | ``core:chunkwise``, C = 64 | ``chunk_size=64`` |
| optimiser | momentum, decay, per-token theta | momentum, decay, per-token lr (defaults) |
| around it | q/k/v projections, q/k l2 norm, gates, output gate, output projection (no short conv, no output norm: `cases.LAYER_PARAMS`) | pre-RMSNorm, q/k/v projections, gates, per-head output gate, head merge and combine |

Both train the same way (fwd+bwd of ``<y, dy>`` into the input and every parameter). The algorithms
differ, so there is no equivalence check between them: titans-pytorch takes every per-token
gradient at the memory weights of the *call's* start (one anchor per call) and applies one summed
update per chunk (momentum and decay scanned over chunks); this project's ``core:chunkwise``
anchors each chunk at the memory after the previous chunk and updates per token (chunk size 1 is
the exact sequential rule). When the package is missing, `subjects` raises ImportError and the
benchmark lists the reason instead of the baseline.
"""

from __future__ import annotations

import torch

from atlas_core.bench import Check, Subject
from atlas_core.bench.cases import Case, Inputs


class TitansPytorchSubject(Subject):
    group = "baseline"

    def __init__(self, chunk_size: int = 64) -> None:
        self.chunk_size = chunk_size
        self.name = f"titans-pytorch NeuralMemory(chunk={chunk_size})"

    def supports(self, case: Case) -> tuple[bool, str]:
        return (True, "") if case.name == "titans_deep_layer" else (False, "the deep-memory layer case")

    def setup(self, case: Case, sizes: dict[str, int], dtype: torch.dtype):
        from titans_pytorch import MemoryMLP, NeuralMemory

        H, D = sizes["H"], sizes["Dk"]
        with torch.random.fork_rng():
            torch.manual_seed(0)
            mem = NeuralMemory(
                dim=H * D, heads=H, dim_head=D, chunk_size=self.chunk_size,
                model=MemoryMLP(D, depth=2, expansion_factor=4.0), momentum=True,
            )
        return mem.to(dtype)

    def forward(self, mem, inp: Inputs) -> torch.Tensor:
        retrieved, _state = mem(inp.x)
        return retrieved

    def check(self, case: Case) -> Check:
        return Check("external", "a different algorithm (one anchor per call, one update per "
                     "chunk): timed side by side, not compared")


def subjects(config=None) -> list[Subject]:
    import titans_pytorch  # noqa: F401 - ImportError: the benchmark reports it

    chunk = getattr(config, "chunk", 64) if config is not None else 64
    return [TitansPytorchSubject(chunk)]
