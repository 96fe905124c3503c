"""A spec written by an earlier version, read by this one.

A resolved spec lists every field of its components. A later version may add fields (each with a
default that keeps the earlier meaning: ``[layer] value_heads`` unset, ``[train] grad_accum = 1``),
so resolving an earlier spec fills them in and its `spec_hash` changes. What must not change is
what the earlier spec stated: `stated_changes` lists every value the stored spec states that the
resolved one does not keep (a value changed, or a key gone). A None states no value: it is what
an earlier resolution left for "the default" (``[layer] output_gate`` before the preset's default
was resolved into the spec), and a stored TOML file, which cannot write None, leaves it out. An earlier spec whose stated values
all survive is the same model and run, read by a version that knows more fields.

`content_hash` is the digest of a spec's tables as stored (the spec as a file or a config holds
it, defaults not filled again): it tells an unedited stored spec from an edited one whatever the
reading version's defaults are.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping


def content_hash(data: Mapping[str, Any]) -> str:
    """A 16-hex-digit digest of ``data`` (independent of key order), as `Spec.spec_hash` is
    computed from a resolved spec's tables."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stated_changes(stored: Any, resolved: Any, path: str = "") -> list[str]:
    """The dotted paths of the values ``stored`` states that ``resolved`` does not keep (keys only
    in ``resolved`` are fields the reading version added: not changes)."""
    if isinstance(stored, Mapping) and isinstance(resolved, Mapping):
        out: list[str] = []
        for key, value in stored.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in resolved:
                if value is not None:  # a field this version no longer has
                    out.append(where)
                continue
            if value is not None:  # None: the default, resolved here to a value
                out += stated_changes(value, resolved[key], where)
        return out
    if isinstance(stored, float) or isinstance(resolved, float):
        same = isinstance(stored, (int, float)) and isinstance(resolved, (int, float)) and float(stored) == float(resolved)
        return [] if same else [path]
    return [] if stored == resolved else [path]


__all__ = ["content_hash", "stated_changes"]
