"""The plugin host: loads entry points one at a time and records what failed.

Deliberate choices (learned from pytest, tox, datasette and llm):
- each entry point of the group ``atlas_core.plugins`` is imported on its own; a plugin that raises
  at import (or in its hook) is recorded with its distribution, version and error, and the host
  carries on. ``ATLAS_STRICT_PLUGINS=1`` re-raises instead (the conformance kit always does);
- registration is explicit through the `atlas_register` hook, never an import side effect;
- a hook implementation whose name is not a known hook is an error with a "did you mean";
- a plugin's registrations are all or nothing: they are staged while its hook runs and committed
  by the host when it returns (`commit` from inside the hook is refused); a hook that raises
  leaves no component behind, and a write to the registry that bypasses the hook's view (made
  while the plugin's import or hook runs) is undone and fails the plugin;
- a namespace belongs to one distribution: the bundled ones to their owner (`NAMESPACE_OWNERS`;
  another distribution's entry point of that name is refused, the owner keeps working), any
  other one to the single distribution that claims it (two claimants: both refused);
- order is deterministic: the core first, then the other namespaces sorted by name.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy

from ..errors import PluginError, did_you_mean
from . import hookspecs
from .registry import (
    NAMESPACE_OWNERS,
    NamespacedRegistry,
    Provider,
    Registry,
    canonical_distribution,
)

ENTRY_POINT_GROUP = "atlas_core.plugins"
STRICT_ENV = "ATLAS_STRICT_PLUGINS"
DISABLE_ENV = "ATLAS_DISABLE_PLUGINS"  # comma-separated namespaces to skip


@dataclass
class PluginRecord:
    namespace: str
    module: str
    distribution: str
    version: str
    status: str = "pending"  # "ok" | "failed" | "refused" | "disabled"
    error: str | None = None
    traceback: str | None = None
    components: list[str] = field(default_factory=list)
    hooks: list[str] = field(default_factory=list)
    import_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "module": self.module,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status,
            "error": self.error,
            "components": list(self.components),
            "hooks": list(self.hooks),
            "import_seconds": round(self.import_seconds, 4),
        }


def strict_from_env() -> bool:
    return os.environ.get(STRICT_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def _entry_points() -> list[metadata.EntryPoint]:
    eps = list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    seen: dict[tuple[str, str], metadata.EntryPoint] = {}
    for ep in eps:  # the same distribution found twice on sys.path: keep the first
        seen.setdefault((ep.name, canonical_distribution(_dist_of(ep)[0])), ep)
    return sorted(seen.values(), key=lambda e: (e.name != "core", e.name, _dist_of(e)[0]))


def _claims(eps: list[metadata.EntryPoint]) -> dict[str, list[metadata.EntryPoint]]:
    """Entry points grouped by namespace, in loading order (the core first, then sorted)."""
    out: dict[str, list[metadata.EntryPoint]] = {}
    for ep in eps:
        out.setdefault(ep.name, []).append(ep)
    return out


def _dist_of(ep: metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "<unknown>", "?"
    return dist.metadata["Name"] or "<unknown>", dist.version or "?"


class PluginHost:
    """Loads plugins into a `Registry`. Use `get_host()` for the process-wide instance."""

    def __init__(self, *, strict: bool | None = None) -> None:
        self.strict = strict_from_env() if strict is None else strict
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.registry = Registry()
        self.records: dict[str, PluginRecord] = {}
        self._modules: dict[str, ModuleType] = {}

    # -- loading ------------------------------------------------------------------------------
    def load_entry_points(self) -> "PluginHost":
        """Load every entry point of the group, one at a time. A namespace belongs to one
        distribution: the bundled namespaces (`NAMESPACE_OWNERS`) to their owner, whose entry
        point alone is loaded (another distribution's is refused); any other namespace claimed
        by two distributions is refused for both (neither is loaded: which one would win
        depends on the order of sys.path)."""
        disabled = {s.strip() for s in os.environ.get(DISABLE_ENV, "").split(",") if s.strip()}
        for name, eps in _claims(_entry_points()).items():
            owner = NAMESPACE_OWNERS.get(name)
            if owner is not None:
                mine = [ep for ep in eps if canonical_distribution(_dist_of(ep)[0]) == owner]
                if mine:
                    self._load_one(mine[0], disabled)
                for ep in eps:
                    if ep not in mine:
                        self._refuse_squatter(name, ep, owner, present=bool(mine))
                continue
            if len(eps) > 1:
                self._refuse_collision(name, eps)
                continue
            self._load_one(eps[0], disabled)
        return self

    def _load_one(self, ep: metadata.EntryPoint, disabled: set[str]) -> None:
        dist, version = _dist_of(ep)
        rec = PluginRecord(ep.name, ep.value, dist, version)
        self.records[ep.name] = rec
        if ep.name in disabled:
            rec.status = "disabled"
            self.registry.mark_unavailable(
                ep.name, f"is disabled by {DISABLE_ENV}; remove {ep.name!r} from that variable "
                "to use it")
            return
        t0 = time.perf_counter()
        before = self.registry.snapshot()
        try:
            module = ep.load()
            self._undo_writes(ep.name, before, "its entry module's import")
        except BaseException as exc:  # noqa: BLE001 - a plugin may raise anything
            if isinstance(exc, KeyboardInterrupt):
                raise
            rec.import_seconds = time.perf_counter() - t0
            self._fail(rec, exc)
            return
        rec.import_seconds = time.perf_counter() - t0
        self.add_plugin_module(ep.name, module, rec)

    def _refuse_squatter(self, name: str, ep: metadata.EntryPoint, owner: str, *, present: bool) -> None:
        dist, version = _dist_of(ep)
        rec = PluginRecord(f"{name} ({dist})", ep.value, dist, version)
        self.records[rec.namespace] = rec
        if present:
            why = f"the {owner} plugin of that name is loaded instead"
        else:
            why = f"{owner} is not installed, so the namespace stays empty"
            self.registry.mark_unavailable(
                name, f"belongs to {owner}, which is not installed; {dist} {version} claims it and "
                "was refused (see `atlas plugins doctor`)")
        self._refuse(rec, (
            f"namespace {name!r} belongs to {owner}; the entry point {name} = {ep.value} of {dist} "
            f"{version} claims it and is refused ({why}); uninstall {dist} or ask its authors to "
            "use their own namespace"))

    def _refuse_collision(self, name: str, eps: list[metadata.EntryPoint]) -> None:
        claims = [f"{_dist_of(ep)[0]} {_dist_of(ep)[1]} ({ep.value})" for ep in eps]
        text = " and ".join(claims)
        for ep in eps:
            dist, version = _dist_of(ep)
            rec = PluginRecord(f"{name} ({dist})", ep.value, dist, version)
            self.records[rec.namespace] = rec
            self._refuse(rec, (
                f"namespace {name!r} is claimed by {text}; neither is loaded (which would win "
                "depends on the order of sys.path); uninstall all but one of them"))
        self.registry.mark_unavailable(
            name, f"is claimed by {text}, so neither was loaded; uninstall all but one "
            "(see `atlas plugins doctor`)")

    def _refuse(self, rec: PluginRecord, message: str) -> None:
        rec.status = "refused"
        rec.error = message
        if self.strict:
            raise PluginError(f"plugin {rec.namespace!r} refused: {message}")

    def add_plugin_module(
        self, namespace: str, module: ModuleType, record: PluginRecord | None = None
    ) -> PluginRecord:
        """Register one plugin module (also used by tests and by `atlas check` on a path)."""
        rec = record or PluginRecord(namespace, getattr(module, "__name__", "?"), "<local>", "0")
        first = self.records.get(namespace)
        if first is not None and first is not rec and first.status == "ok":
            rec.namespace = f"{namespace} ({rec.module})"
            self.records[rec.namespace] = rec
            self._fail(rec, PluginError(
                f"namespace {namespace!r} is claimed by {first.distribution} ({first.module}) "
                f"and by {rec.distribution} ({rec.module})"
            ))
            return rec
        self.records[namespace] = rec
        try:
            self._check_hook_names(module)
            self.pm.register(module, name=namespace)
            rec.hooks = sorted(
                name for name in hookspecs.HOOK_NAMES
                if any(i.plugin_name == namespace for i in getattr(self.pm.hook, name).get_hookimpls())
            )
            provider = Provider(namespace, rec.distribution, rec.version, rec.module)
            # all or nothing: the hook's registrations are staged and committed when it returns,
            # so a hook that raises half-way leaves no component of this plugin behind
            view = NamespacedRegistry(self.registry, provider, staged=True)
            impl = getattr(module, "atlas_register", None)
            if impl is not None:
                before = self.registry.snapshot()
                view.in_hook = True
                try:
                    impl(registry=view)
                finally:
                    view.in_hook = False
                    self._undo_writes(namespace, before, "its atlas_register hook")
            rec.components = sorted(c.name for c in view.commit())
            rec.status = "ok"
            self._modules[namespace] = module
        except BaseException as exc:  # noqa: BLE001
            if isinstance(exc, KeyboardInterrupt):
                raise
            if self.pm.is_registered(module):
                self.pm.unregister(module)
            self._fail(rec, exc)
        return rec

    def _undo_writes(self, namespace: str, before, during: str) -> None:
        """Undo registry writes made while a plugin's code ran other than through the view its
        hook was given (the registry behind a private attribute, `Registry.add`), and fail the
        plugin naming them. In-process code can always reach the registry; this catches the
        writes made while the host watches (docs/plugins.md#what-the-host-can-and-cannot-prevent)."""
        wrote = self.registry.changes_since(before)
        if not wrote:
            return
        self.registry.restore(before)
        shown = ", ".join(wrote[:5]) + (f" and {len(wrote) - 5} more" if len(wrote) > 5 else "")
        raise PluginError(
            f"plugin {namespace!r} wrote to the registry during {during} other than through the "
            f"registry its hook receives ({shown}); those writes are undone and the plugin is not "
            "loaded: register with registry.add / registry.add_preset only")

    def _check_hook_names(self, module: ModuleType) -> None:
        marker = f"{hookspecs.PROJECT}_impl"
        for attr in dir(module):
            obj = getattr(module, attr, None)
            if callable(obj) and hasattr(obj, marker) and attr not in hookspecs.HOOK_NAMES:
                hint = did_you_mean(attr, hookspecs.HOOK_NAMES) or (
                    "known hooks: " + ", ".join(hookspecs.HOOK_NAMES)
                )
                raise PluginError(f"unknown hook {attr!r}; {hint}")

    def _fail(self, rec: PluginRecord, exc: BaseException) -> None:
        rec.status = "failed"
        rec.error = f"{type(exc).__name__}: {exc}"
        first_line = rec.error.splitlines()[0] if rec.error else ""
        self.registry.mark_unavailable(
            rec.namespace, f"failed to load ({first_line[:200]}); see `atlas plugins doctor`")
        rec.traceback = "".join(traceback.format_exception(exc))
        if self.strict:
            raise PluginError(
                f"plugin {rec.namespace!r} ({rec.distribution} {rec.version}, {rec.module}) "
                f"failed to load: {rec.error}"
            ) from exc

    # -- queries ------------------------------------------------------------------------------
    def failed(self) -> list[PluginRecord]:
        """The plugins that failed to load or were refused."""
        return [r for r in self.records.values() if r.status in ("failed", "refused")]

    def cli_apps(self) -> list[tuple[str, Any, str]]:
        """(command name, typer app, namespace) from every plugin's `atlas_cli_apps` hook."""
        out = []
        for ns, module in sorted(self._modules.items()):
            fn = getattr(module, "atlas_cli_apps", None)
            if fn is None:
                continue
            try:
                for name, app in fn() or []:
                    out.append((name, app, ns))
            except Exception as exc:  # noqa: BLE001
                self._fail(self.records[ns], exc)
        return out


_HOST: PluginHost | None = None


def get_host() -> PluginHost:
    """The process-wide host, loading entry points on first use."""
    global _HOST
    if _HOST is None:
        _HOST = PluginHost().load_entry_points()
    return _HOST


def get_registry() -> Registry:
    return get_host().registry


def reset_host(host: PluginHost | None = None) -> None:
    """Forget the process-wide host (tests), or install a given one."""
    global _HOST
    _HOST = host
