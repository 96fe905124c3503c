"""Shared fixtures of the training tests: a tiny delta-rule spec that trains in milliseconds."""

from __future__ import annotations

import copy

import pytest

TINY = {
    "schema": "atlas/1",
    "name": "tiny",
    "model": {"arch": "titans:lmm", "vocab_size": 16, "d_model": 16, "depth": 1, "heads": 2,
              "mlp_ratio": 2.0},
    "memory": {
        "structure": "core:linear", "bias": "core:l2", "retention": "core:none",
        "algorithm": "core:gd", "feature_map": "core:identity", "read": "after",
        # gradients of each 8-token block at the block's start: the rule core:chunkwise runs at C = 8
        "anchor": 8, "parallel": {"use": "core:chunkwise", "chunk_size": 8},
    },
    "layer": {"gate_bias": {"theta": 0.0}},
    "train": {
        "task": {"use": "mqar", "num_pairs": 2, "seq_len": 16},
        "steps": 6, "batch_size": 4, "lr": 3e-3, "warmup_steps": 2, "min_lr": 1e-4,
        "eval_every": 3, "eval_batches": 2, "log_every": 1, "seed": 0, "device": "cpu",
        "threads": 1,  # tiny tensors: one thread is fastest, and the choice is not measured
    },
}


@pytest.fixture
def tiny_spec():
    """A fresh copy of the tiny spec (a dict; tests change it freely)."""
    return copy.deepcopy(TINY)
