"""The config of an atlas model exported by ``atlas export-hf`` (remote code: the class is the
installed ``atlas_core``'s; ``pip install 'atlas-ttm[hf]'`` on the loading machine)."""

try:  # in a try block: transformers' import check would name the module, not the package
    from atlas_core.hf.config import AtlasConfig as _AtlasConfig
except ImportError as exc:  # pragma: no cover - the message is for a machine without atlas-ttm
    raise ImportError(
        "this model was exported by atlas (atlas-ttm): its config and model classes come from the "
        f"installed atlas_core, which is missing here ({exc}); pip install 'atlas-ttm[hf]' and "
        "the plugins its spec names") from exc


class AtlasConfig(_AtlasConfig):
    """`atlas_core.hf.config.AtlasConfig` under the name ``config.json``'s ``auto_map`` gives."""
