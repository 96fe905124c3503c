"""Register `AtlasConfig` with ``AutoConfig`` and `AtlasForCausalLM` with
``AutoModelForCausalLM`` (both idempotent). `atlas_core.hf.hook` calls these when ``transformers``'
auto modules load; calling them by hand is never needed after ``import atlas_core``."""

from __future__ import annotations

MIN_TRANSFORMERS = (5, 0)


def check_version() -> None:
    """Raise ImportError naming the installed version when it is older than `MIN_TRANSFORMERS`."""
    import transformers

    version = getattr(transformers, "__version__", "0")
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    if tuple(parts) < MIN_TRANSFORMERS:
        want = ".".join(map(str, MIN_TRANSFORMERS))
        raise ImportError(f"transformers {version} is installed; the integration needs >= {want} "
                          f"(pip install 'transformers>={want}')")


def register_config() -> None:
    check_version()
    from transformers.models.auto.configuration_auto import AutoConfig

    from .config import MODEL_TYPE, AtlasConfig

    AutoConfig.register(MODEL_TYPE, AtlasConfig, exist_ok=True)


def register_model() -> None:
    check_version()
    from transformers.models.auto.modeling_auto import AutoModelForCausalLM

    from .config import AtlasConfig
    from .modeling import AtlasForCausalLM

    AutoModelForCausalLM.register(AtlasConfig, AtlasForCausalLM, exist_ok=True)


def register() -> None:
    """Both registrations, now (imports transformers)."""
    register_config()
    register_model()
