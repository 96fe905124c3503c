"""Loading and resolving specs: every name checked, every default filled, every error collected.

``load_spec(source)`` accepts a path to a ``.toml`` file, TOML text, a mapping, or an already
resolved `Spec` (returned as is). ``resolve_spec(mapping)`` does the work, section by section:

========== ==================================================================================
schema     must be ``"atlas/1"`` (the default when absent)
name       a string (default: the file's stem, or ``"unnamed"``)
[model]    ``arch`` names a component of kind ``arch``; the other keys are validated by that
           component's params model
[memory]   see `atlas_core.spec.memory` (built with `build_rule`, strategy checked; the rule and
           strategy are kept with the `Spec` for its build: `Spec.memory_plan`)
[layer]    validated by `atlas_core.layer.LayerParams` (kept as written if that module is absent);
           the fields a preset may declare (``output_gate``, ``output_gate_bias``,
           ``conv_init``, ``q_scale``, ``gate_bias``, ``gate_form``) are resolved to the
           preset's value, else the core's (`atlas_core.layer.with_preset_defaults`); a
           ``gate_bias`` key other than the core gates' must be a gate the rule declares, a
           ``gate_form`` key one it declares (with a form its range allows)
[train]    validated by ``atlas_core.train.params:TrainParams`` when that module exists; until a
           trainer provides it, the table is kept exactly as written
========== ==================================================================================

Every problem becomes an `Issue` with its dotted path (``memory.algorithm.ns_steps``), the bad
value and, for unknown keys and names, a "did you mean"; they are raised together as one
`SpecError`. A component whose plugin is not installed names the distribution that provides it.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any, Mapping

from pydantic import ValidationError

from ..errors import Issue, SpecError, did_you_mean
from ..host.registry import Registry, validation_issues
from .bounds import explain_model_issues, model_size_issues, spec_value_issues
from .memory import plain, resolve_memory_plan
from .model import SCHEMA, TOP_LEVEL_KEYS, Spec
from .toml_io import SpecFileError, load_file, loads

TRAIN_PARAMS = ("atlas_core.train.params", "TrainParams")
LAYER_PARAMS = ("atlas_core.layer", "LayerParams")


def _optional(module: str, attr: str) -> Any:
    """``module.attr`` if the module exists, else None (a missing part of the package)."""
    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        found = None
    if found is None:
        return None
    return getattr(importlib.import_module(module), attr, None)


def _registry(registry: Registry | None) -> Registry:
    if registry is not None:
        return registry
    from ..host.manager import get_registry

    return get_registry()


def _validate_params(model: Any, table: Mapping[str, Any], path: str, issues: list[Issue]):
    try:
        return plain(model.model_validate(dict(table)))
    except ValidationError as exc:
        issues.extend(validation_issues(exc, path, model))
    except SpecError as exc:
        issues.extend(exc.prefixed(path).issues if path else exc.issues)
    return None


def _table(data: Mapping[str, Any], key: str, issues: list[Issue], required: bool) -> Any:
    if key not in data:
        if required:
            issues.append(Issue(key, f"missing [{key}] table", None, f"add a [{key}] section"))
        return None
    value = data[key]
    if not isinstance(value, Mapping):
        issues.append(Issue(key, f"must be a table (a [{key}] section)", value))
        return None
    return value


# -- sections -----------------------------------------------------------------------------------
def resolve_model(table: Mapping[str, Any], reg: Registry, issues: list[Issue]) -> dict | None:
    arch = table.get("arch")
    if arch is None:
        issues.append(Issue("model.arch", "missing: name the architecture", None,
                            'e.g. arch = "titans:lmm"; see `atlas components list arch`'))
        return None
    if not isinstance(arch, str):
        issues.append(Issue("model.arch", "must be an architecture name 'ns:name'", arch))
        return None
    try:
        comp = reg.get("arch", arch, "model.arch")
    except SpecError as exc:
        issues.extend(exc.issues)
        return None
    rest = {k: v for k, v in table.items() if k != "arch"}
    try:
        params = comp.validate(rest, "model")
    except SpecError as exc:
        issues.extend(explain_model_issues(exc.issues, rest))
        return None
    return {"arch": comp.name, **(plain(params) if params is not None else {})}


def resolve_layer(table: Mapping[str, Any] | None, issues: list[Issue]) -> dict | None:
    model = _optional(*LAYER_PARAMS)
    if model is None:  # the memory layer is not part of this installation
        return dict(table or {})
    return _validate_params(model, table or {}, "layer", issues)


def _gate_issues(layer: Mapping[str, Any], rule: Any) -> list[Issue]:
    """``[layer] gate_bias`` keys the rule declares no gate for (the core gates' names are always
    accepted, so specs written for them stay valid) and ``gate_form`` entries that name no gate of
    the rule or put a retain-factor form on another gate; ``rule`` is the one resolving
    ``[memory]`` built."""
    from ..layer import gate_bias_issues, gate_form_issues

    issues = []
    if isinstance(layer.get("gate_bias"), Mapping):
        issues += gate_bias_issues(layer["gate_bias"], tuple(rule.gates))
    if isinstance(layer.get("gate_form"), Mapping):
        issues += gate_form_issues(layer["gate_form"], tuple(rule.gates))
    return issues


def _preset_layer(memory: Mapping[str, Any], reg: Registry) -> dict:
    """The ``[layer]`` defaults the resolved ``[memory]``'s preset declares (``layer=`` in
    `add_preset`), or {}."""
    use = memory.get("use")
    if not use:
        return {}
    comp = reg.get("rule", use, "memory.use")
    return dict(comp.extra.get("layer", {})) if "preset" in comp.capabilities else {}


def _with_preset_layer(layer_r: dict | None, written: Any, memory_r: Mapping[str, Any] | None,
                       reg: Registry) -> dict | None:
    """``[layer]`` with the preset's declared defaults, else the core's, resolved into it
    (`atlas_core.layer.with_preset_defaults`; ``written``: the table as the spec writes it)."""
    fill = _optional("atlas_core.layer", "with_preset_defaults")
    if layer_r is None or memory_r is None or fill is None:
        return layer_r
    return fill(layer_r, _preset_layer(memory_r, reg), written)


def _value_head_issues(layer: Any, model: Any) -> list[Issue]:
    """``[layer] value_heads`` that is not a positive multiple of ``[model] heads``."""
    if not isinstance(layer, Mapping) or not isinstance(model, Mapping):
        return []
    value_heads, heads = layer.get("value_heads"), model.get("heads")
    if value_heads is None or isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        return []
    from ..layer import value_head_issues

    return value_head_issues(value_heads, heads)


def resolve_train(table: Mapping[str, Any], issues: list[Issue]) -> dict | None:
    model = _optional(*TRAIN_PARAMS)
    if model is None:  # no trainer yet: keep the table as written (documented)
        return plain(dict(table))
    return _validate_params(model, table, "train", issues)


# -- the whole spec -----------------------------------------------------------------------------
def resolve_spec(data: Any, *, source: str | None = None, registry: Registry | None = None) -> Spec:
    """Validate a spec mapping and fill every default (see the module docstring)."""
    if isinstance(data, Spec):
        return data
    if not isinstance(data, Mapping):
        raise SpecError([Issue("", "a spec must be a table of sections", type(data).__name__)], source)
    reg = _registry(registry)
    issues: list[Issue] = []
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            hint = did_you_mean(str(key), TOP_LEVEL_KEYS) or f"allowed keys: {', '.join(TOP_LEVEL_KEYS)}"
            issues.append(Issue(str(key), "unknown key", None, hint))

    schema = data.get("schema", SCHEMA)
    if schema != SCHEMA:
        issues.append(Issue("schema", f"unsupported spec schema; this version reads {SCHEMA!r}",
                            schema, f'write schema = "{SCHEMA}"'))
    default_name = Path(source).stem if source and not source.startswith("<") else "unnamed"
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name.strip():
        issues.append(Issue("name", "must be a non-empty string", name))

    model = _table(data, "model", issues, required=True)
    model_r = resolve_model(model, reg, issues) if model is not None else None
    memory_r, plan = None, None
    if "memory" not in data:
        issues.append(Issue("memory", "missing [memory] table", None,
                            'add a [memory] section, e.g. use = "titans:titans"'))
    else:
        memory_r, plan = resolve_memory_plan(data["memory"], reg, issues)
    layer = _table(data, "layer", issues, required=False)
    layer_r = resolve_layer(layer, issues) if layer is not None or "layer" not in data else None
    layer_r = _with_preset_layer(layer_r, layer, memory_r, reg)
    if plan is not None:  # keys, even when a value is bad: the written ones and the preset's
        issues.extend(_gate_issues({**(layer or {}), **(layer_r or {})}, plan.rule))
    issues.extend(_value_head_issues(layer_r, model_r))
    train = _table(data, "train", issues, required=False)
    train_r = resolve_train(train, issues) if train is not None else None

    for section, resolved in (("model", model_r), ("memory", memory_r), ("layer", layer_r),
                              ("train", train_r)):
        issues.extend(spec_value_issues(resolved, section))
    issues.extend(model_size_issues(model_r, layer_r))
    if issues:
        raise SpecError(issues, source)
    spec = Spec(schema=schema, name=name, model=model_r, memory=memory_r, layer=layer_r,
                train=train_r)
    spec._source = source
    spec._memory_plan = plan
    return spec


def with_train(spec: Spec, table: Mapping[str, Any] | None) -> Spec:
    """``spec`` with its ``[train]`` table replaced by ``table``, validated as `resolve_spec`
    validates it; the other sections are resolved already and are not resolved again."""
    issues: list[Issue] = []
    train_r = resolve_train(table or {}, issues)
    issues.extend(spec_value_issues(train_r, "train"))
    if issues:
        raise SpecError(issues)
    out = spec.model_copy(update={"train": train_r})
    out._source = spec.source
    return out


def looks_like_toml(text: str) -> bool:
    if "\n" in text:
        return True
    if text.strip().endswith(".toml"):
        return False  # a path, even one with "=" in a folder name
    return "=" in text or text.lstrip().startswith("[")


def load_spec(source: Any, *, registry: Registry | None = None) -> Spec:
    """A resolved `Spec` from a ``.toml`` path, TOML text, a mapping or a `Spec`."""
    if isinstance(source, Spec):
        return source
    if isinstance(source, Mapping):
        return resolve_spec(source, registry=registry)
    if isinstance(source, Path) or (isinstance(source, str) and not looks_like_toml(source)):
        path = str(source)
        return resolve_spec(load_file(path), source=path, registry=registry)
    if isinstance(source, str):
        return resolve_spec(loads(source, "<string>"), source="<string>", registry=registry)
    raise TypeError(
        f"load_spec takes a path, TOML text, a dict or a Spec, not {type(source).__name__}"
    )


__all__ = ["SpecFileError", "load_spec", "validation_issues", "resolve_spec", "resolve_model", "resolve_layer",
           "resolve_train", "with_train"]
