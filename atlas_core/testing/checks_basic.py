"""Checks that need no tensors: resolution, params, TOML round trip, import cost, capabilities.

Each function is registered in the catalogue with the contract clause docs/plugins.md states.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from typing import Any

from .results import ALL_KINDS, Failure, Skip, register

# Modules an entry module must not pull in at import (docs/plugins.md#check_entry_module_light).
HEAVY_MODULES = ("torch", "triton", "jax", "tensorflow", "cupy", "numba")

BASE_CLASSES = {
    "structure": "atlas_core.knobs:Structure",
    "bias": "atlas_core.knobs:Bias",
    "retention": "atlas_core.knobs:Retention",
    "algorithm": "atlas_core.knobs:Algorithm",
    "feature_map": "atlas_core.knobs:FeatureMap",
    "strategy": "atlas_core.strategies.base:Strategy",
    "backend": "atlas_core.backends:Backend",
    "rule": "atlas_core.rule:Rule",
}


def _load(ref: str) -> Any:
    import importlib

    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def build_component(subject) -> Any:
    """Build the component itself with the case's params (a rule through `build_rule`)."""
    if subject.kind == "rule":
        return subject.build_rule()
    return subject.registry.build(subject.kind, {"use": subject.name, **subject.params}, path=subject.id)


@register(
    "check_resolves_by_name",
    "a component is found by its full name 'namespace:name' (and by its short name when that is "
    "unambiguous), its plugin loaded without error, its factory and params model import, and it "
    "builds with the case's params into an object of its kind's base class.",
    ALL_KINDS,
)
def check_resolves_by_name(subject) -> None:
    subject.require()
    comp, reg = subject.component, subject.registry
    if reg.get(comp.kind, comp.name) is not comp:
        raise Failure(f"registry.get({comp.kind!r}, {comp.name!r}) returned another component")
    short = comp.name.split(":", 1)[1]
    same_short = [n for n in reg.names(comp.kind) if n.split(":", 1)[1] == short]
    if len(same_short) == 1 and reg.get(comp.kind, short) is not comp:
        raise Failure(f"the unambiguous short name {short!r} does not resolve to {comp.name}")
    if comp.provider.namespace != comp.namespace:
        raise Failure(f"{comp.name} is provided by plugin {comp.provider.namespace!r}, not its own namespace")
    try:
        factory = comp.load_factory()
        model = comp.load_params()
    except Exception as exc:  # noqa: BLE001 - the message is the point
        raise Failure(f"the factory or params model of {comp.name} does not import: {type(exc).__name__}: {exc}")
    if not callable(factory):
        raise Failure(f"the factory of {comp.name} is a {type(factory).__name__}, not a callable")
    if model is not None:
        from pydantic import BaseModel

        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise Failure(f"the params model of {comp.name} is not a pydantic model class")
    if subject.kind == "arch":
        return  # an architecture is built from a whole spec; its factory importing is the check
    subject.require_buildable()
    try:
        obj = build_component(subject)
    except Exception as exc:  # noqa: BLE001
        raise Failure(f"{comp.name} does not build with params {subject.params}: {type(exc).__name__}: {exc}")
    base = BASE_CLASSES.get(subject.kind)
    if base is not None and not isinstance(obj, _load(base)):
        raise Failure(
            f"{comp.name} built a {type(obj).__name__}, which is not a {base.split(':')[1]} "
            f"(the base class of kind {subject.kind!r})"
        )


@register(
    "check_params_forbid_extra_keys",
    "a component's params model forbids unknown keys (a misspelled key in a spec is an error with "
    "its dotted path, never silently dropped); a component without params refuses any.",
    ALL_KINDS,
)
def check_params_forbid_extra_keys(subject) -> None:
    from atlas_core.errors import SpecError

    subject.require()
    comp = subject.component
    bogus = "not_a_param_of_this_component"
    model = comp.load_params()
    if model is not None and model.model_config.get("extra") != "forbid":
        raise Failure(
            f"the params model {model.__name__} has extra={model.model_config.get('extra')!r}; "
            "derive it from atlas_core.Params (extra='forbid')"
        )
    try:
        comp.validate({**subject.params, bogus: 1}, path=comp.name)
    except SpecError as exc:
        if bogus not in str(exc):
            raise Failure(f"the error for an unknown key does not name it: {exc}")
        return
    raise Failure(f"params with the unknown key {bogus!r} were accepted")


def _dump_toml(data: dict) -> str:
    from atlas_core.spec import dump_toml

    return dump_toml(data)


@register(
    "check_params_roundtrip_toml",
    "validated params written as TOML (as `atlas spec show` writes a resolved spec) read back and "
    "validate to the same params: every value has a TOML spelling.",
    ALL_KINDS,
)
def check_params_roundtrip_toml(subject) -> None:
    subject.require()
    comp = subject.component
    if comp.load_params() is None:
        raise Skip(f"{comp.name} takes no params")
    subject.require_buildable()
    params = comp.validate(subject.params, path=comp.name)
    data = params.model_dump(mode="json")
    try:
        text = _dump_toml({"params": data})
        back = tomllib.loads(text).get("params", {})
    except Exception as exc:  # noqa: BLE001
        raise Failure(f"params {data} cannot be written as TOML and read back: {type(exc).__name__}: {exc}")
    try:
        again = comp.validate(back, path=comp.name)
    except Exception as exc:  # noqa: BLE001
        raise Failure(f"params read back from TOML do not validate: {exc}\n--- TOML ---\n{text}")
    if again != params:
        before, after = params.model_dump(), again.model_dump()
        diff = {k: (before.get(k), after.get(k)) for k in set(before) | set(after) if before.get(k) != after.get(k)}
        raise Failure(f"params changed through TOML (field: (before, after)) {diff}")


_IMPORT_CACHE: dict[str, dict] = {}
_PROBE = r"""
import importlib, json, sys, time
t = time.perf_counter()
err = None
try:
    importlib.import_module(sys.argv[1])
except BaseException as exc:
    err = f"{type(exc).__name__}: {exc}"
heavy = sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[2].split(',')))
print(json.dumps({"error": err, "heavy": heavy, "seconds": time.perf_counter() - t}))
"""


def probe_import(module: str) -> dict:
    """Import ``module`` in a fresh interpreter; report its error and the heavy modules it pulled in."""
    if module in _IMPORT_CACHE:
        return _IMPORT_CACHE[module]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, module, ",".join(HEAVY_MODULES)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        result = {"error": f"the import probe crashed: {proc.stderr.strip()[-500:]}", "heavy": [], "seconds": 0.0}
    else:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    _IMPORT_CACHE[module] = result
    return result


@register(
    "check_entry_module_light",
    "the plugin's entry module imports on its own in a fresh interpreter without importing torch, "
    "triton or another heavy framework (listing plugins stays fast; heavy imports belong inside "
    "factories, named lazily as 'module:attribute').",
    ALL_KINDS,
)
def check_entry_module_light(subject) -> None:
    if subject.component is None:
        rec = subject.host.records.get(subject.case.namespace)
        if rec is None:
            subject.require()
        module = rec.module
    else:
        module = subject.component.provider.module
    if subject.component is not None and subject.component.provider.distribution == "<local>":
        import importlib.util

        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise Skip(f"entry module {module!r} was added in-process and has no importable file")
    res = probe_import(module)
    if res["error"]:
        raise Failure(f"importing the entry module {module!r} raises {res['error']}")
    if res["heavy"]:
        raise Failure(
            f"importing the entry module {module!r} imports {', '.join(res['heavy'])}",
            import_seconds=float(res["seconds"]),
        )


KNOWN_CAPABILITIES = {
    ("structure", "linear"): "is_linear",
    ("structure", "matrix_shaped"): "matrix_shaped",
    ("retention", "linear"): "linear",
}


def _has_capability_claims(subject) -> bool:
    if subject.component is None:
        return False
    caps = subject.component.capabilities
    return (
        subject.kind == "retention"
        or any((subject.kind, c) in KNOWN_CAPABILITIES for c in caps)
        or (subject.kind == "algorithm" and "chunk" in caps)
    )


@register(
    "check_capabilities_hold",
    "what a component declares is true of the object it builds: a structure declaring 'linear' or "
    "'matrix_shaped' sets is_linear / matrix_shaped; an algorithm declaring 'chunk' implements "
    "chunk(); a retention with linear = True has identity pre/post hooks (the chunkwise forms "
    "skip them), and one declaring 'linear' sets linear = True.",
    {"structure", "retention", "algorithm"},
    applies=_has_capability_claims,
)
def check_capabilities_hold(subject) -> None:
    subject.require_buildable()
    obj = build_component(subject)
    for cap in sorted(subject.component.capabilities):
        attr = KNOWN_CAPABILITIES.get((subject.kind, cap))
        if attr and not getattr(obj, attr, False):
            raise Failure(f"{subject.name} declares capability {cap!r} but its object has {attr} = "
                          f"{getattr(obj, attr, None)!r}")
    if subject.kind == "algorithm" and "chunk" in subject.component.capabilities:
        from atlas_core.knobs import Algorithm

        if type(obj).chunk is Algorithm.chunk:
            raise Failure(f"{subject.name} declares capability 'chunk' but does not implement chunk()")
    if subject.kind == "retention" and obj.linear:  # Retention declares linear
        import torch

        g = torch.Generator().manual_seed(5)
        W = {"M": torch.randn(2, 2, 3, 4, generator=g, dtype=torch.float64) * 0.5}
        for hook in ("pre", "post"):
            out = getattr(obj, hook)(dict(W))
            if set(out) != set(W) or any(not torch.equal(out[k], W[k]) for k in W):
                raise Failure(f"{subject.name} has linear = True but its {hook}() hook changes the weights "
                              "(set linear = False for a nonlinear retention)")
