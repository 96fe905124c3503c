"""Change an imported model's spec (``KEY.PATH=VALUE`` overrides) and keep every weight the changed
model can use: test-time memory put into an existing model (e.g. ``memory.use=titans:titans`` on
an imported Qwen3.5 swaps the rule of every Gated DeltaNet layer for Titans').

`swap(spec, model, overrides)` resolves the overridden spec, builds its model (the spec's own
initialisation) and copies from the imported model:

- every tensor with the same name and shape (embeddings, norms, MLPs or experts, attention
  blocks, the memory layers' projections, convolutions and output norm/gate);
- a memory layer's gate projection gate by gate: the rows (and bias) of a gate the new rule
  declares under the same name, shape and form are kept (e.g. Gated DeltaNet's ``alpha`` and
  ``theta`` under Titans, whose ``eta`` rows start at their declared initialisation), with the
  gate's own parameters (``gate_A_log.<name>``).

Everything else keeps the new model's initialisation. The summary names what was initialised and
what was dropped, grouped over blocks (``blocks.*.memory.gate_proj[eta]``).
"""

from __future__ import annotations

import re
from typing import Any, Iterable

import torch


def _gate_rows(layer) -> dict[str, tuple[slice, str]]:
    """``{gate: (rows of gate_proj, form)}`` of a memory layer."""
    rows, start = {}, 0
    for gate, size, form in zip(layer.gate_decls, layer.gate_sizes, layer.gate_forms):
        rows[gate.name] = (slice(start, start + size), form)
        start += size
    return rows


def _group(names: Iterable[str]) -> list[str]:
    """Names with block numbers folded: ``blocks.3.memory.x`` and ``blocks.7.memory.x`` ->
    ``blocks.*.memory.x (2 blocks)``."""
    groups: dict[str, int] = {}
    for n in names:
        key = re.sub(r"^blocks\.\d+\.", "blocks.*.", n)
        groups[key] = groups.get(key, 0) + 1
    return [f"{k} ({c} blocks)" if k.startswith("blocks.*") else k for k, c in sorted(groups.items())]


def transfer(old: torch.nn.Module, new: torch.nn.Module) -> tuple[int, list[str], list[str]]:
    """Copy from ``old`` into ``new`` what fits (module docstring); returns (tensors kept,
    names initialised, names dropped), the gate rows as ``name[gate]``."""
    from ..layer import MemoryLayer

    src, dst = old.state_dict(), new.state_dict()
    kept, fresh, used = 0, [], set()
    gate_parts: dict[str, dict] = {}  # gate_proj tensors handled row by row
    old_layers = {n: m for n, m in old.named_modules() if isinstance(m, MemoryLayer)}
    for name, layer in new.named_modules():
        if isinstance(layer, MemoryLayer) and name in old_layers and layer.gate_names:
            gate_parts[name] = (_gate_rows(old_layers[name]) if old_layers[name].gate_names else {},
                                _gate_rows(layer))
    with torch.no_grad():
        for key, target in dst.items():
            owner, _, leaf = key.rpartition(".")
            if owner.endswith(".gate_proj") and owner[: -len(".gate_proj")] in gate_parts:
                before, after = gate_parts[owner[: -len(".gate_proj")]]
                for gate, (rows, form) in after.items():
                    prev = before.get(gate)
                    if (key in src and prev is not None and prev[1] == form
                            and prev[0].stop - prev[0].start == rows.stop - rows.start
                            and src[key].shape[1:] == target.shape[1:]):
                        target[rows] = src[key][prev[0]]
                        used.add(f"{key}[{gate}]")
                    else:
                        fresh.append(f"{key}[{gate}]")
                kept += 1 if key in src else 0
                used.add(key)
                continue
            if key in src and src[key].shape == target.shape:
                target.copy_(src[key])
                used.add(key)
                kept += 1
            else:
                fresh.append(key)
    new.load_state_dict(dst, strict=True)
    dropped = []
    for key in src:
        owner = key.rpartition(".")[0]
        if owner.endswith(".gate_proj") and owner[: -len(".gate_proj")] in gate_parts:
            before = gate_parts[owner[: -len(".gate_proj")]][0]
            dropped += [f"{key}[{g}]" for g in before if f"{key}[{g}]" not in used]
        elif key not in used:
            dropped.append(key)
    return kept, fresh, dropped


def swap(raw: dict[str, Any], model: torch.nn.Module, overrides: list[str]):
    """The spec ``raw`` (the import's tables as written, before defaults: a preset named by
    ``use`` is replaced whole) with ``overrides`` applied, resolved; its model holding every weight
    of ``model`` it can use; and the summary entries (``overrides``, ``kept_count``,
    ``initialised``, ``dropped``)."""
    from ..model import build_model
    from ..spec.overrides import annotate, apply_overrides, parse_overrides
    from ..spec import resolve_spec
    from ..errors import SpecError

    parsed = parse_overrides(overrides)
    raw = apply_overrides(raw, parsed)
    try:
        new_spec = resolve_spec(raw)
        new = build_model(new_spec)
    except SpecError as exc:
        raise annotate(exc, parsed, "the imported spec") from None
    kept, fresh, dropped = transfer(model, new)
    return new_spec, new, {"overrides": overrides, "kept_count": kept,
                           "initialised": _group(fresh), "dropped": _group(dropped)}


__all__ = ["swap", "transfer"]
