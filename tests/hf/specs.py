"""Tiny specs of every architecture for the Hugging Face tests, and checkpoints made from them.

Windows, segments and anchors are a few tokens, so a 5-token prompt and 32 generated tokens cross
every boundary the carried state has to handle (attention window, MAC segment, anchor block)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

VOCAB = 32

_MEMORY = {"use": "titans:titans", "anchor": 4, "parallel": {"use": "core:chunkwise", "chunk_size": 4}}
_LAYER = {"conv_size": 4, "qk_norm": True}


def _spec(name: str, model: dict[str, Any], memory: dict[str, Any] = _MEMORY,
          layer: dict[str, Any] = _LAYER) -> dict[str, Any]:
    return {"schema": "atlas/1", "name": name,
            "model": {"vocab_size": VOCAB, "d_model": 16, "depth": 2, "heads": 2, "mlp_ratio": 2.0, **model},
            "memory": dict(memory), "layer": dict(layer)}


SPECS: dict[str, dict[str, Any]] = {
    "core_lm": _spec("hf-core-lm", {"arch": "core:lm"}),
    "mag": _spec("hf-mag", {"arch": "titans:mag", "window": 4, "persistent_tokens": 2},
                 memory={"use": "titans:titans_deep", "structure": {"use": "titans:mlp", "depth": 2,
                                                                     "expansion": 2.0},
                         "anchor": 4, "parallel": {"use": "core:chunkwise", "chunk_size": 4}}),
    # an untied head: stored and loaded as a weight of its own
    "mal": _spec("hf-mal", {"arch": "titans:mal", "window": 4, "persistent_tokens": 2,
                            "tie_embeddings": False}),
    # block 2 is a sliding-window attention block (no memory)
    "mac": _spec("hf-mac", {"arch": "titans:mac", "segment_size": 8, "persistent_tokens": 2,
                            "window": 4, "memory_layers": [1]}),
    "mru": _spec("hf-mru", {"arch": "mru:mru_lm", "heads": 4, "init_scale": 0.5},
                 memory={"use": "mru:mru", "parallel": "mru:brent_kung"}, layer={}),
}


def make_checkpoint(root: Path, spec: dict[str, Any], *, seed: int = 0,
                    text: dict[str, Any] | None = None) -> Path:
    """A checkpoint as ``atlas train`` writes one (random weights: nothing is trained)."""
    import torch

    from atlas_core.model import build_model
    from atlas_core.spec import load_spec
    from atlas_core.train.checkpoint import save_checkpoint
    from atlas_core.train.checkpoint_meta import CheckpointMeta

    resolved = load_spec(spec)
    torch.manual_seed(seed)
    model = build_model(resolved)
    with torch.no_grad():  # larger weights than the init, so that the logits differ clearly
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    task = {"use": "mqar", "params": {}} if text is None else {"use": "text", "params": {}, "text": text}
    return save_checkpoint(root / "run", 1, model=model, spec=resolved, optimizer_state=({}, {}),
                           rng={}, meta=CheckpointMeta(task=task))
