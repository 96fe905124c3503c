"""The remote code an exported directory carries, so that a Hugging Face client that never
imports ``atlas_core`` itself loads it with ``trust_remote_code=True`` (lm-evaluation-harness's
``lm_eval --model hf``, ``transformers.pipeline``, TRL, ...).

``atlas export-hf`` copies `FILES` into the export and names their classes in ``config.json``'s
``auto_map``. The modules hold no model code: they import the installed ``atlas_core`` (so the
loading machine needs ``atlas-ttm`` and the plugins the spec names, as without remote code) and
subclass its `AtlasConfig` and `AtlasForCausalLM` under the names ``auto_map`` gives, so that
transformers' dynamic-module machinery (which registers, and on ``save_pretrained`` copies, the
module a class is defined in) handles these two small files and never atlas_core's own modules.
Loading without ``trust_remote_code`` takes the classes ``import atlas_core`` registered, as
before.
"""

from __future__ import annotations

from importlib import resources

#: the module files copied into every export
FILES = ("configuration_atlas.py", "modeling_atlas.py")

#: ``config.json``'s ``auto_map``: the auto class -> ``module.Class`` in the export
AUTO_MAP = {
    "AutoConfig": "configuration_atlas.AtlasConfig",
    "AutoModelForCausalLM": "modeling_atlas.AtlasForCausalLM",
}


def sources() -> dict[str, str]:
    """``{file name: its text}`` of `FILES`."""
    here = resources.files(__name__)
    return {name: here.joinpath(name).read_text(encoding="utf-8") for name in FILES}
