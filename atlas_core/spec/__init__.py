"""TOML specs: pydantic models, loading, and resolution with every error collected.

    from atlas_core.spec import load_spec
    spec = load_spec("examples/titans_lmm.toml")   # or TOML text, a dict, or a Spec
    spec.memory["algorithm"]                        # {"use": "core:momentum", ...}
    print(spec.to_toml())                           # the resolved spec; loads back equal
    spec.spec_hash                                  # stable digest of the resolved content

See `resolve` for what each section means and `memory` for how the rule is resolved.
"""

from .model import SCHEMA, TOP_LEVEL_KEYS, Spec, spec_hash
from .resolve import load_spec, resolve_spec
from .toml_io import SpecFileError, dumps as dump_toml, loads as parse_toml

__all__ = [
    "SCHEMA",
    "TOP_LEVEL_KEYS",
    "Spec",
    "SpecFileError",
    "dump_toml",
    "load_spec",
    "parse_toml",
    "resolve_spec",
    "spec_hash",
]
