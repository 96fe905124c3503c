"""atlas_core: test-time memory layers composed from the MIRAS knobs.

The public surface (docs/architecture.md)::

    import atlas_core as ac
    rule = ac.build_rule({"structure": "core:linear", "bias": "core:l2", ...})
    y, state = rule(q, k, v, gates={...}, state=None, strategy="core:sequential")
    model = ac.build_model("examples/titans_lmm.toml")
    run = ac.train("examples/mqar_default.toml", steps=200, **{"model.d_model": 32})
    model = ac.load(run.run_dir)          # the trained model, eval mode (atlas_core.api)

Attributes are imported on first use so that ``import atlas_core`` (and listing plugins) stays
cheap: torch is only imported when a rule or model is built.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .host.hookspecs import hookimpl  # noqa: E402  (cheap: pluggy only)
from .lazy import lazy_attributes  # noqa: E402  (standard library only)

_LAZY = {
    "build_rule": "atlas_core.rule:build_rule",
    "Rule": "atlas_core.rule:Rule",
    "ComposedRule": "atlas_core.rule:ComposedRule",
    "MemoryInputs": "atlas_core.rule:MemoryInputs",
    "build_model": "atlas_core.model:build_model",
    "load_spec": "atlas_core.spec:load_spec",
    "resolve_spec": "atlas_core.spec:resolve_spec",
    "Spec": "atlas_core.spec:Spec",
    "MemoryLayer": "atlas_core.layer:MemoryLayer",
    "Strategy": "atlas_core.strategies.base:Strategy",
    "resolve_strategy": "atlas_core.strategies.base:resolve_strategy",
    "Backend": "atlas_core.backends:Backend",
    "get_registry": "atlas_core.host.manager:get_registry",
    "get_host": "atlas_core.host.manager:get_host",
    "Params": "atlas_core.params:Params",
    "SpecError": "atlas_core.errors:SpecError",
    "AtlasError": "atlas_core.errors:AtlasError",
    # atlas_core.train is a package whose module object is callable as atlas_core.api.train
    "train": "atlas_core.train",
    "load": "atlas_core.api:load",
    "Run": "atlas_core.api:Run",
}

__all__ = ["__version__", "hookimpl", *_LAZY]


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals(), __all__)


# Hugging Face: AutoConfig / AutoModelForCausalLM learn the atlas classes when transformers'
# auto modules load; transformers itself is never imported here (atlas_core/hf/hook.py).
from .hf.hook import install as _install_hf  # noqa: E402  (standard library only)

_install_hf()
