"""Hugging Face ``transformers`` integration (optional: ``pip install 'atlas-ttm[hf]'``).

- `AtlasConfig` (``model_type = "atlas_memory"``): the resolved spec and the text codec;
- `AtlasForCausalLM`: any architecture built from the spec, a ``PreTrainedModel`` with
  ``generate``, whose cache is an `AtlasMemoryCache` (the model's carried memory state);
- `export_checkpoint`: a training checkpoint -> a directory that
  ``AutoModelForCausalLM.from_pretrained`` opens (``atlas export-hf``).

``import atlas_core`` registers both classes with ``AutoConfig`` / ``AutoModelForCausalLM`` without
importing ``transformers`` (`atlas_core.hf.hook`). This package's ``__init__`` imports nothing
heavy; the attributes load on first use. See docs/huggingface.md.
"""

from __future__ import annotations

from ..lazy import lazy_attributes

_LAZY = {
    "AtlasConfig": "atlas_core.hf.config:AtlasConfig",
    "MODEL_TYPE": "atlas_core.hf.config:MODEL_TYPE",
    "AtlasForCausalLM": "atlas_core.hf.modeling:AtlasForCausalLM",
    "AtlasMemoryCache": "atlas_core.hf.cache:AtlasMemoryCache",
    "export_checkpoint": "atlas_core.hf.export:export_checkpoint",
    "register": "atlas_core.hf.register:register",
}

__all__ = list(_LAZY)


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals(), __all__)
