"""The model of an atlas export (remote code: the class is the installed ``atlas_core``'s
``AtlasForCausalLM``; ``pip install 'atlas-ttm[hf]'`` on the loading machine)."""

try:  # in a try block: transformers' import check would name the module, not the package
    from atlas_core.hf.modeling import AtlasForCausalLM as _AtlasForCausalLM
except ImportError as exc:  # pragma: no cover - the message is for a machine without atlas-ttm
    raise ImportError(
        "this model was exported by atlas (atlas-ttm): its model class comes from the installed "
        f"atlas_core, which is missing here ({exc}); pip install 'atlas-ttm[hf]' and the plugins "
        "its spec names") from exc

from .configuration_atlas import AtlasConfig


class AtlasForCausalLM(_AtlasForCausalLM):
    """`atlas_core.hf.modeling.AtlasForCausalLM` under the name ``config.json``'s ``auto_map``
    gives, with this export's config class."""

    config_class = AtlasConfig
