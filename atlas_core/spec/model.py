"""The resolved spec: what a TOML spec means once every name is checked and every default filled.

A `Spec` is produced by `atlas_core.spec.load_spec` / `resolve_spec`; building one by hand skips
validation. Its sections are plain, JSON-compatible mappings so that they can be written back as
TOML (`to_toml`), printed as JSON (`to_dict`) and hashed (`spec_hash`):

- ``model``: ``{"arch": "ns:name", **every arch param}``;
- ``memory``: ``{"use": preset (when one was named), "structure": {"use": ..., **params}, "bias":
  ..., "retention": ..., "algorithm": ..., "feature_map": ..., "read": ..., "parallel": {"use":
  ..., **params}}`` for a composed rule, or ``{"use": rule, **params, "parallel": ...}`` for a
  standalone rule;
- ``layer``: every `atlas_core.layer.LayerParams` field;
- ``train``: the trainer's params (None when the spec has no ``[train]`` table).

Treat the mappings as read-only: equality and `spec_hash` are computed from their content.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

SCHEMA = "atlas/1"
TOP_LEVEL_KEYS = ("schema", "name", "model", "memory", "layer", "train")


def _canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


class Spec(BaseModel):
    """A resolved spec (see the module docstring). Compare with ``==``; hash with `spec_hash`."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    schema_id: str = Field(SCHEMA, alias="schema", description="spec format version")
    name: str = Field(description="a name for runs and checkpoints")
    model: dict[str, Any] = Field(description="the architecture and its params")
    memory: dict[str, Any] = Field(description="the memory rule, fully resolved")
    layer: dict[str, Any] = Field(default_factory=dict, description="memory layer options")
    train: dict[str, Any] | None = Field(None, description="training options, if any")

    _source: str | None = PrivateAttr(None)
    #: what resolving ``[memory]`` built (`atlas_core.layer.MemoryPlan`), for the build; not content
    _memory_plan: Any = PrivateAttr(None)

    # -- identity -----------------------------------------------------------------------------
    @property
    def source(self) -> str | None:
        """Where the spec was read from (a file path), if anywhere. Not part of equality."""
        return self._source

    @property
    def memory_plan(self) -> Any:
        """The rule and checked strategy resolving ``[memory]`` built (`atlas_core.layer.MemoryPlan`),
        or None (a spec built by hand or unpickled). Not part of equality or `spec_hash`."""
        return self._memory_plan

    @property
    def arch(self) -> str:
        return self.model["arch"]

    def to_dict(self) -> dict[str, Any]:
        """A deep copy as plain data, in the order of the TOML file (``train`` only if set)."""
        out: dict[str, Any] = {
            "schema": self.schema_id,
            "name": self.name,
            "model": copy.deepcopy(self.model),
            "memory": copy.deepcopy(self.memory),
            "layer": copy.deepcopy(self.layer),
        }
        if self.train is not None:
            out["train"] = copy.deepcopy(self.train)
        return out

    def to_toml(self) -> str:
        """The resolved spec as TOML; ``load_spec(spec.to_toml()) == spec``."""
        from ..strategies.trust import parallel_note
        from .toml_io import dumps

        note = parallel_note(self.memory.get("parallel"))  # the strategy and its distribution
        head = f"# resolved spec, spec_hash = {self.spec_hash}\n" + (f"# {note}\n" if note else "")
        return head + dumps(self.to_dict())

    @property
    def spec_hash(self) -> str:
        """A stable 16-hex-digit digest of the resolved content (independent of key order)."""
        return hashlib.sha256(_canonical_json(self.to_dict()).encode()).hexdigest()[:16]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Spec):
            return NotImplemented
        return _canonical_json(self.to_dict()) == _canonical_json(other.to_dict())

    def __hash__(self) -> int:
        return hash(self.spec_hash)

    def __repr__(self) -> str:
        return f"Spec(name={self.name!r}, arch={self.model.get('arch')!r}, hash={self.spec_hash})"


def spec_hash(spec: Spec) -> str:
    """The `Spec.spec_hash` of a resolved spec."""
    return spec.spec_hash
