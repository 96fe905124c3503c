"""Typed registries of components, with provenance.

Every component has a kind (see `KINDS`), a name ``namespace:name``, a lazily imported factory, an
optional pydantic params model, declared capabilities and the plugin that provided it. Plugins
receive a `NamespacedRegistry`, which only accepts names in their own namespace, so provenance is
always right and two plugins can never silently shadow each other.

Factories are called as ``factory(params, ctx)`` where ``params`` is the validated params model
(or None when the component takes none) and ``ctx`` a `BuildContext` that can build nested
components (an Omega window builds its inner bias this way). A factory or params model that does
not import, and a factory that raises anything but an `AtlasError` or a ValueError, is one
`PluginError` that names the component and its plugin (`Component.load_factory`).
"""

from __future__ import annotations

import fnmatch
import importlib
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

from pydantic import BaseModel, ValidationError

from ..errors import AtlasError, Issue, PluginError, SpecError, UnknownComponentError, did_you_mean
from ..params import Params  # noqa: F401  (the params base, re-exported for plugins)

KINDS = (
    "structure",
    "bias",
    "retention",
    "algorithm",
    "feature_map",
    "rule",
    "strategy",
    "backend",
    "arch",
    "task",
)

# Namespaces whose plugins are known but may not be installed: a missing one is named with the
# distribution that provides it.
KNOWN_DISTRIBUTIONS = {
    "core": "atlas-ttm",
    "titans": "atlas-ttm (bundled plugin)",
    "omega": "atlas-ttm (bundled plugin)",
    "atlas_muon": "atlas-ttm (bundled plugin)",
    "mru": "atlas-ttm (bundled plugin)",
    "cuda": "atlas-ttm (bundled plugin)",
    "fla": "atlas-ttm (bundled plugin)",
    "zoo": "atlas-ttm (bundled plugin)",
    "miras": "atlas-miras (pip install ./packages/atlas-miras)",
}

# Namespaces owned by a distribution: only that distribution's entry point may provide them. An
# entry point of another distribution with one of these names is refused (the owner keeps
# working), so no package can replace the core or a bundled plugin by squatting its name.
NAMESPACE_OWNERS = {
    "core": "atlas-ttm",
    "titans": "atlas-ttm",
    "cuda": "atlas-ttm",
    "fla": "atlas-ttm",
    "omega": "atlas-ttm",
    "atlas_muon": "atlas-ttm",
    "mru": "atlas-ttm",
    "zoo": "atlas-ttm",
    "miras": "atlas-miras",
}


def canonical_distribution(name: str) -> str:
    """A distribution name as packaging compares them: ``Atlas_TTM`` -> ``atlas-ttm``."""
    import re

    return re.sub(r"[-_.]+", "-", str(name)).lower()


@dataclass(frozen=True)
class Provider:
    namespace: str
    distribution: str
    version: str
    module: str


CORE_PROVIDER = Provider("core", "atlas-ttm", "0", "atlas_core.components.plugin")


def _first_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _load(ref: Any) -> Any:
    """Resolve a ``"module:attribute"`` string (plugin-internal only, never from a spec)."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class Component:
    name: str
    kind: str
    factory: Any  # callable or "module:attribute"
    params: Any = None  # pydantic model class, "module:attribute", or None
    summary: str = ""
    capabilities: frozenset[str] = frozenset()
    priority: int = 0
    provider: Provider = CORE_PROVIDER
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        return self.name.split(":", 1)[0]

    def origin(self) -> str:
        """``core:l2 (bias) of plugin 'core' (atlas-ttm 0.1.0, atlas_core.components.plugin)``:
        who to blame when the component fails."""
        p = self.provider
        return (f"{self.name} ({self.kind}) of plugin {p.namespace!r} ({p.distribution} "
                f"{p.version}, {p.module})")

    def _import(self, ref: Any, what: str, where: str = "") -> Any:
        try:
            return _load(ref)
        except Exception as exc:  # noqa: BLE001 - a plugin's module may raise anything
            at = f", needed at {where}," if where else ""
            raise PluginError(
                f"{self.origin()}: its {what} {ref!r}{at} does not import ({_first_line(exc)}); "
                f"reinstall or fix the plugin (`atlas check {self.provider.namespace}` tests "
                f"it), or use another {self.kind}"
            ) from exc

    def load_factory(self, where: str = "") -> Callable:
        """The factory, called as ``factory(params, ctx)``. A factory that does not import is a
        `PluginError` naming the plugin; so is one that raises anything but an `AtlasError` or a
        ValueError (the ways a factory refuses its params), which would otherwise reach the
        user as a traceback of someone else's code. ``where``: the spec path it is built for."""
        factory = self._import(self.factory, "factory", where)
        if not callable(factory):
            return factory  # the conformance kit reports it; calling it fails below anyway
        comp = self

        def build(params: Any, ctx: Any) -> Any:
            try:
                return factory(params, ctx)
            except (AtlasError, ValueError):
                raise
            except Exception as exc:  # noqa: BLE001 - a plugin's factory may raise anything
                where = getattr(ctx, "path", "")
                raise PluginError(
                    f"{comp.origin()} failed while building{f' {where}' if where else ''} "
                    f"({_first_line(exc)}); this is a bug in the plugin: report it to its "
                    f"authors, or use another {comp.kind} (ATLAS_DEBUG=1 shows the traceback)"
                ) from exc

        build.__wrapped__ = factory  # type: ignore[attr-defined]
        build.__name__ = getattr(factory, "__name__", "build")
        build.__doc__ = getattr(factory, "__doc__", None)
        return build

    def load_params(self, where: str = "") -> type[BaseModel] | None:
        return self._import(self.params, "params model", where) if self.params is not None else None

    def validate(self, raw: Mapping[str, Any], path: str = "") -> BaseModel | None:
        """Validate raw params; raises SpecError with every issue at its dotted path."""
        model = self.load_params(path)
        if model is None:
            if raw:
                keys = ", ".join(sorted(raw))
                raise SpecError(
                    [Issue(path, f"{self.name} takes no parameters", keys, "remove them")]
                )
            return None
        try:
            return model.model_validate(dict(raw))
        except ValidationError as exc:
            raise SpecError(validation_issues(exc, path, model)) from None


def _members(ann: Any) -> tuple:
    """The non-None members of a union annotation (``()`` for anything else)."""
    if typing.get_origin(ann) not in (typing.Union, types.UnionType):
        return ()
    return tuple(a for a in typing.get_args(ann) if a is not type(None))


def _walk(model: Any, loc: tuple) -> tuple[tuple, Any]:
    """``loc`` without pydantic's union-member tags (``inner.str``, ``inner.dict[str,any]`` for a
    field typed ``str | dict``), and the params model that owns its last key: ``model`` itself
    for a top-level key, the nested model for a key in a nested table (``gate_bias.alfa``), None
    where the annotations do not say."""
    ann: Any = model
    out: list = []
    owner = None
    for part in loc:
        members = _members(ann)
        if len(members) == 1:  # Optional[X]: pydantic adds no tag
            ann = members[0]
        elif members:  # a real union: this part names the member pydantic tried
            ann = None
            continue
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            owner = ann
            field = ann.model_fields.get(part) if isinstance(part, str) else None
            ann = field.annotation if field is not None else None
        else:
            owner = None
            args = typing.get_args(ann) if ann is not None else ()
            ann = args[-1] if args else None  # list[X] -> X, dict[K, V] -> V
        out.append(part)
    return tuple(out), owner


def validation_issues(exc: ValidationError, path: str, model: Any) -> list[Issue]:
    """Pydantic errors as `Issue`s at their dotted paths under ``path``.

    The one implementation used for every params model (component params through
    `Component.validate`, the ``[layer]`` table through the spec resolver): an unknown key's
    "did you mean" comes from the keys of the table it was written in, nested tables included; a
    value that fits no member of a union is one issue at the field's path.
    """
    issues: list[Issue] = []
    merged: dict[str, int] = {}
    for err in exc.errors():
        loc, owner = _walk(model, tuple(err["loc"]))
        where = ".".join(str(p) for p in (path, *loc) if p != "")
        if err["type"] == "extra_forbidden":
            fields = list(getattr(owner, "model_fields", {}))
            hint = did_you_mean(str(loc[-1]), fields) or (
                f"allowed keys: {', '.join(fields)}" if fields else None)
            issues.append(Issue(where, "unknown key", err.get("input"), hint))
            continue
        # pydantic's "Value error, " prefix says nothing to a user
        msg = err["msg"].removeprefix("Value error, ")
        if where in merged:  # another member of the same union refused it too
            i = merged[where]
            old = issues[i]
            if msg not in old.message:
                issues[i] = Issue(where, f"{old.message}, or {msg[:1].lower()}{msg[1:]}", old.value)
            continue
        merged[where] = len(issues)
        issues.append(Issue(where, msg, err.get("input")))
    return issues


@dataclass
class BuildContext:
    """Handed to factories so that they can build nested components."""

    registry: "Registry"
    path: str = ""
    options: dict[str, Any] = field(default_factory=dict)

    def build(self, kind: str, value: Any, path: str) -> Any:
        return self.registry.build(kind, value, path=path, options=self.options)


def split_use(value: Any, path: str = "") -> tuple[str, dict[str, Any]]:
    """``"ns:name"`` or ``{"use": "ns:name", **params}`` -> (name, params)."""
    if isinstance(value, str):
        return value, {}
    if isinstance(value, Mapping):
        if "use" not in value:
            raise SpecError([Issue(path, "a table needs a 'use' key naming the component", dict(value))])
        rest = {k: v for k, v in value.items() if k != "use"}
        if not isinstance(value["use"], str):
            raise SpecError([Issue(f"{path}.use", "must be a component name 'ns:name'", value["use"])])
        return value["use"], rest
    raise SpecError(
        [Issue(path, "expected a component name 'ns:name' or a table with 'use'", value)]
    )


class Registry:
    """All registered components, by kind. Deterministic iteration order (by name)."""

    def __init__(self) -> None:
        self._items: dict[str, dict[str, Component]] = {k: {} for k in KINDS}
        # namespaces whose plugin is installed but provides nothing: namespace -> why (disabled
        # by the environment, failed to load); a missing name in one says so instead of "not
        # installed"
        self.unavailable: dict[str, str] = {}

    def mark_unavailable(self, namespace: str, reason: str) -> None:
        """Record that ``namespace``'s plugin is present but did not register (the host calls it)."""
        self.unavailable[namespace] = reason

    def unavailable_note(self, name: str) -> str | None:
        """Why ``name`` may be missing: its namespace's plugin failed to load, was refused or is
        disabled (for a short name: every such namespace), pointing to `atlas plugins doctor`.
        None when every plugin loaded."""
        if not self.unavailable:
            return None
        ns = name.split(":", 1)[0] if ":" in name else None
        if ns is not None:
            why = self.unavailable.get(ns)
            return f"namespace {ns!r} {why}" if why else None
        parts = [f"{n!r} {why}" for n, why in sorted(self.unavailable.items())]
        text = "; ".join(parts)
        if "atlas plugins doctor" not in text:
            text += "; see `atlas plugins doctor`"
        return "it may come from a plugin that did not load: " + text

    # -- registration -------------------------------------------------------------------------
    def check_new(self, component: Component, pending: Iterable[Component] = ()) -> None:
        """Raise `PluginError` unless ``component`` may be added (its kind and name are valid and
        neither the registry nor ``pending`` holds that name)."""
        if component.kind not in KINDS:
            raise PluginError(
                f"{component.name}: unknown kind {component.kind!r}; kinds are {', '.join(KINDS)}"
            )
        ns, sep, short = component.name.partition(":")
        if not sep or not ns or not short:
            raise PluginError(f"component name {component.name!r} must look like 'namespace:name'")
        old = self._items[component.kind].get(component.name)
        if old is None:
            old = next((c for c in pending if c.kind == component.kind and c.name == component.name), None)
        if old is not None:
            raise PluginError(
                f"duplicate {component.kind} {component.name!r}: provided by "
                f"{old.provider.distribution} ({old.provider.module}) and by "
                f"{component.provider.distribution} ({component.provider.module})"
            )

    def snapshot(self) -> tuple[dict[str, dict[str, Component]], dict[str, str]]:
        """What the registry holds now; the host takes one before a plugin's code runs, to find and
        undo writes that bypassed the plugin's `NamespacedRegistry` (`changes_since`, `restore`)."""
        return {k: dict(v) for k, v in self._items.items()}, dict(self.unavailable)

    def changes_since(self, snap) -> list[str]:
        """The components (``kind ns:name``) and unavailable namespaces added, removed or replaced
        since ``snap``."""
        items, unavailable = snap
        out = []
        for kind, table in self._items.items():
            old = items.get(kind, {})
            out += [f"{kind} {n}" for n in sorted(set(table) | set(old))
                    if table.get(n) is not old.get(n)]
        out += [f"unavailable namespace {n}" for n in sorted(set(self.unavailable) | set(unavailable))
                if self.unavailable.get(n) != unavailable.get(n)]
        return out

    def restore(self, snap) -> None:
        """Put back what ``snap`` held (in place: views keep pointing at this registry)."""
        items, unavailable = snap
        for kind, table in self._items.items():
            table.clear()
            table.update(items.get(kind, {}))
        self.unavailable.clear()
        self.unavailable.update(unavailable)

    def add(self, component: Component) -> Component:
        self.check_new(component)
        self._items[component.kind][component.name] = component
        return component

    def add_all(self, components: Iterable[Component]) -> list[Component]:
        """Add every component or none: all are checked before the first is added."""
        staged: list[Component] = []
        for comp in components:
            self.check_new(comp, staged)
            staged.append(comp)
        for comp in staged:
            self._items[comp.kind][comp.name] = comp
        return staged

    # -- lookup -------------------------------------------------------------------------------
    def names(self, kind: str) -> list[str]:
        return sorted(self._items[kind])

    def all(self, kind: str | None = None, pattern: str | None = None) -> Iterator[Component]:
        kinds = [kind] if kind else list(KINDS)
        for k in kinds:
            for name in sorted(self._items[k]):
                if pattern and not fnmatch.fnmatch(name, pattern) and pattern not in name:
                    continue
                yield self._items[k][name]

    def find(self, name: str) -> list[Component]:
        """Every component of any kind with this (full or unambiguous short) name."""
        out = []
        for k in KINDS:
            try:
                out.append(self.get(k, name))
            except SpecError:
                pass
        return out

    def get(self, kind: str, name: str, path: str = "") -> Component:
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; kinds are {', '.join(KINDS)}")
        table = self._items[kind]
        if not isinstance(name, str):  # a spec's list or table where a name goes
            raise SpecError([Issue(path or kind, f"must be a {kind} name 'ns:name'", name)])
        if name in table:
            return table[name]
        if ":" not in name:
            matches = [c for n, c in table.items() if n.split(":", 1)[1] == name]
            if len(matches) == 1:
                return matches[0]
            if len(matches) > 1:
                opts = " or ".join(repr(c.name) for c in matches)
                raise UnknownComponentError(
                    [Issue(path, f"ambiguous {kind} name", name, f"write {opts}")]
                )
        raise UnknownComponentError([Issue(path, f"unknown {kind}", name, self._hint(kind, name))])

    def _hint(self, kind: str, name: str) -> str:
        ns = name.split(":", 1)[0] if ":" in name else None
        installed = {c.namespace for k in KINDS for c in self._items[k].values()}
        if ns and ns not in installed:
            if ns in self.unavailable:
                return self.unavailable_note(name) or ""
            dist = KNOWN_DISTRIBUTIONS.get(ns)
            if dist:
                return f"namespace {ns!r} is not installed; it is provided by {dist}"
            return f"no installed plugin provides namespace {ns!r} (installed: {', '.join(sorted(installed))})"
        hint = did_you_mean(name, self._items[kind])
        if hint:
            return hint
        other = [c for k in KINDS if k != kind for c in [self._items[k].get(name)] if c]
        if other:
            return f"{name!r} is a {other[0].kind}, not a {kind}"
        note = None if ns else self.unavailable_note(name)
        return f"see `atlas components list {kind}`" + (f"; {note}" if note else "")

    # -- building -----------------------------------------------------------------------------
    def build(self, kind: str, value: Any, *, path: str = "", options: dict | None = None) -> Any:
        """Build a component from ``"ns:name"`` or ``{"use": "ns:name", **params}``."""
        name, raw = split_use(value, path)
        comp = self.get(kind, name, f"{path}.use" if isinstance(value, Mapping) else path)
        try:
            params = comp.validate(raw, path)
        except SpecError as exc:
            raise SpecError(exc.issues + self._nested_issues(comp, raw, path, exc.issues, options)) from None
        ctx = BuildContext(self, path, dict(options or {}))
        return comp.load_factory(path)(params, ctx)


    def _nested_issues(self, comp: Component, raw: Mapping[str, Any], path: str,
                       found: list[Issue], options: dict | None) -> list[Issue]:
        """Problems of the nested components a component's params name (declared as
        ``nested={"param": kind}`` when it is registered), so that they are reported together
        with the component's own even though its factory, which would build them, cannot run."""
        out: list[Issue] = []
        for key, kind in dict(comp.extra.get("nested", {})).items():
            where = f"{path}.{key}" if path else key
            if key not in raw or any(i.path == where or i.path.startswith(where + ".") for i in found):
                continue
            try:
                self.build(kind, raw[key], path=where, options=options)
            except SpecError as exc:
                out.extend(exc.issues)
            except (AtlasError, ValueError):  # reported when the component itself is fixed
                pass
        return out


class NamespacedRegistry:
    """The view of the registry a plugin's `atlas_register` hook receives."""

    def __init__(self, registry: Registry, provider: Provider, *, staged: bool = False) -> None:
        self._registry = registry
        self.provider = provider
        self.namespace = provider.namespace
        #: with ``staged``, `add` only checks and collects; `commit` adds them all at once (the
        #: host commits when the plugin's hook returns, so a hook that raises leaves nothing)
        self.staged: list[Component] | None = [] if staged else None
        #: True while the plugin's hook runs (set by the host): `commit` is refused then
        self.in_hook = False

    def commit(self) -> list[Component]:
        """Add the staged components to the registry, all or none; returns them. Only the host
        commits, when the plugin's hook has returned: a call from inside the hook is refused, so
        a hook that raises after it still leaves nothing behind."""
        if self.in_hook:
            raise PluginError(
                f"plugin {self.namespace!r} ({self.provider.distribution}) called registry.commit() "
                "inside its atlas_register hook; the host commits a plugin's registrations when the "
                "hook returns (all or nothing): remove the call")
        if self.staged is None:
            return []
        done = self._registry.add_all(self.staged)
        self.staged = []
        return done

    def _qualify(self, name: str) -> str:
        if ":" not in name:
            return f"{self.namespace}:{name}"
        ns = name.split(":", 1)[0]
        if ns != self.namespace:
            raise PluginError(
                f"plugin {self.namespace!r} ({self.provider.distribution}) may only register names "
                f"in its own namespace, not {name!r}"
            )
        return name

    def add(
        self,
        kind: str,
        name: str,
        factory: Any,
        *,
        params: Any = None,
        summary: str = "",
        capabilities: tuple[str, ...] | frozenset[str] = (),
        priority: int = 0,
        **extra: Any,
    ) -> Component:
        comp = Component(
            name=self._qualify(name),
            kind=kind,
            factory=factory,
            params=params,
            summary=summary,
            capabilities=frozenset(capabilities),
            priority=priority,
            provider=self.provider,
            extra=dict(extra),
        )
        if self.staged is not None:
            self._registry.check_new(comp, self.staged)
            self.staged.append(comp)
            return comp
        return self._registry.add(comp)

    def add_preset(
        self, name: str, knobs: Mapping[str, Any], *, summary: str = "", **extra: Any
    ) -> Component:
        """A rule preset: default knob values that a spec may override key by key. ``extra``
        carries declarations such as the conformance kit's ``check_cases`` and ``reductions``."""
        return self.add(
            "rule",
            name,
            "atlas_core.rule:build_preset",
            summary=summary,
            capabilities=("preset",),
            knobs=dict(knobs),
            **extra,
        )
