"""The base of every component's params and the bounds on the sizes they may declare.

This module imports nothing of atlas_core but `errors`, so the knobs, strategies, layers and
models can declare their params without loading the spec package (`atlas_core.spec` sits on top
of them: it reads specs and resolves them into these params).

- `Params`: unknown keys are errors, values are immutable, floats are finite.
- `plain(params)`: params as plain TOML/JSON-friendly data (what a resolved spec writes).
- `size_field(default, kind)`: a pydantic field bounded by ``LIMITS[kind]``; a spec anyone can
  write then cannot ask for a depth of ``10**9`` (one clear error naming the limit instead of a
  builder that hangs). `atlas_core.spec.bounds` documents each limit and adds the checks of a
  whole resolved spec (non-finite values, integers past ``2**53``, the parameter-count preflight).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

LIMITS: dict[str, int] = {
    "depth": 1024,
    "mem_depth": 64,
    "width": 65536,
    "heads": 4096,
    "ratio": 256,
    "vocab": 1 << 24,
    "seq_len": 1 << 20,
    "chunk": 65536,
    "window": 4096,
    "steps": 10**9,
    "batch": 1 << 20,
    "iterations": 1000,
    "kernel": 1024,
}
#: No size or count in a spec may exceed this (a float could not hold it exactly).
MAX_INT = 1 << 53


class Params(BaseModel):
    """Base class of component params: unknown keys are errors, values are immutable, floats are
    finite (``inf`` and ``nan`` are refused; sizes are bounded through `size_field`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def limit(kind: str) -> int:
    """The upper bound of a size of ``kind`` (see `LIMITS`)."""
    return LIMITS[kind]


def size_field(default: Any, kind: str, *, ge: int | float | None = 1, **kwargs: Any) -> Any:
    """A pydantic ``Field`` for a size of ``kind``: at least ``ge`` and at most ``limit(kind)``.

    ``size_field(2, "depth", description="number of blocks")`` is
    ``Field(2, ge=1, le=1024, description=...)``. A float kind (``ratio``) takes ``gt`` instead
    of ``ge`` through ``kwargs``."""
    if "gt" in kwargs:
        ge = None
    return Field(default, ge=ge, le=LIMITS[kind], **kwargs)


def plain(value: Any) -> Any:
    """Params as plain TOML/JSON-friendly data (tuples -> lists, enums -> values, ...)."""
    if isinstance(value, BaseModel):
        return plain(value.model_dump())
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(plain(v) for v in value)
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if isinstance(value, PurePath):
        return str(value)
    return value
