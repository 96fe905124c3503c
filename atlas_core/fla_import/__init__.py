"""Import a flash-linear-attention checkpoint (``save_pretrained``'s directory) as an atlas checkpoint.

    from atlas_core.fla_import import import_fla
    import_fla("fla-model/", "runs/imported")      # then atlas_core.load("runs/imported")

(``atlas import`` / `atlas_core.model_import.import_checkpoint` read these and transformers'
hybrids; `import_fla` is that import restricted to fla's families.)

``SRC`` holds ``config.json`` and the weights (``model.safetensors``, or shards listed in
``model.safetensors.index.json``) of one of fla 0.6.0's causal LMs: DeltaNet, Gated DeltaNet,
Gated DeltaProduct, KDA, GLA, RetNet or linear attention (``config.json``'s ``model_type``; the
mapping of each is in `atlas_core.fla_import.families` and docs/zoo.md, "Importing fla
checkpoints"). The model becomes
``core:lm`` with the family's zoo preset and every layer option set to fla's layer
(`atlas_core.layer.LayerParams`), with fla's weights, so its logits equal fla's model on the same
ids (float32). fla's hybrid configs (``attn = {layers = [...], num_heads, ...}``: softmax attention
in place of the memory layer of the listed layers) become ``core:lm`` attention blocks
(``[model] layers``, ``[model.attention]``: `attention_for`); grouped value heads (``num_v_heads``,
a multiple of ``num_heads``) become ``[layer] value_heads``. ``OUT`` is a run directory with one checkpoint (step 0) that ``atlas generate``,
``atlas eval --task ...``, ``atlas export-hf`` and `atlas_core.load` accept, decoding with O(1)
state per token and running under every strategy that accepts the rule.

An fla option the mapping cannot express is refused before anything is written: one `SpecError`
that names each option (``config.<key>``), its value and what is accepted. No code from ``SRC``
runs (the config is JSON, the weights safetensors).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..model_import.files import read_config, read_weights
from .mapping import family_for, fla_mapping, spec_for, state_dict_for

FORMAT = "fla-import/1"


def import_fla(src: str | Path, out: str | Path, *, overwrite: bool = False) -> dict[str, Any]:
    """Write ``out`` (a run directory with one checkpoint) from the fla checkpoint ``src``; returns
    a summary (``out``, ``checkpoint``, ``family``, ``preset``, ``parameters``)."""
    from ..model_import import import_checkpoint

    src = Path(src)
    family_for(read_config(src), str(src / "config.json"))  # an fla family, or one clear error
    return import_checkpoint(src, out, overwrite=overwrite)


__all__ = ["import_fla", "family_for", "fla_mapping", "spec_for", "state_dict_for", "read_config", "read_weights",
           "FORMAT"]
