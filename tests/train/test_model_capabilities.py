"""What training needs to know about a model is declared on its class (`MemoryLM`): whether it
runs packed documents in one pass, whether context parallelism can split it, and the blocks FSDP
shards one by one. Built on the meta device from the bundled examples."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from atlas_core.model import MemoryLM, build_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: example -> (packs_in_one_pass, context_parallel)
DECLARED = {
    "mqar_default.toml": (True, True),     # core:lm
    "titans_lmm.toml": (True, True),
    "titans_mag.toml": (True, False),      # sliding-window attention mixes tokens
    "titans_mal.toml": (True, False),
    "titans_mac.toml": (False, False),     # segments count from each document's start
    "mru_lm.toml": (True, False),          # the MRU layer is not a memory layer
}


@pytest.mark.parametrize("example", sorted(DECLARED))
def test_each_model_class_declares_what_training_reads(example):
    with torch.device("meta"):
        model = build_model(EXAMPLES / example)
    assert isinstance(model, MemoryLM)
    assert (type(model).packs_in_one_pass, type(model).context_parallel) == DECLARED[example]
    units = model.fsdp_units()
    blocks = getattr(model, "blocks", None) or getattr(model, "layers")
    assert units == list(blocks) and len(units) == model.spec.model["depth"]


def test_the_base_class_declares_the_safe_defaults():
    assert not MemoryLM.packs_in_one_pass and not MemoryLM.context_parallel
    assert MemoryLM().fsdp_units() == []
