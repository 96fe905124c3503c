"""``atlas components list|show``: the registered components, by kind, with provenance.

Listing reads the registry only (no factory or params model is imported, so no torch).
``show`` imports the component's params model to print its JSON schema with defaults.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from .common import AtlasTyper, FormatOption, emit, examples, out_console

components_app = AtlasTyper(help="Registered components (knobs, rules, strategies, backends, archs, tasks).")


def _registry():
    from atlas_core.host.manager import get_registry

    return get_registry()


def _row(c) -> dict[str, Any]:
    return {
        "name": c.name,
        "kind": c.kind,
        "namespace": c.namespace,
        "distribution": c.provider.distribution,
        "version": c.provider.version,
        "summary": c.summary,
        "capabilities": sorted(c.capabilities),
        "priority": c.priority,
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


@components_app.command(
    "list",
    epilog=examples("atlas components list", "atlas components list strategy",
                    "atlas components list structure 'titans:*'", "atlas components list mlp"),
)
def list_components(
    kind: Annotated[Optional[str], typer.Argument(help="a kind (structure, bias, retention, algorithm, feature_map, rule, strategy, backend, arch, task), or a pattern")] = None,
    pattern: Annotated[Optional[str], typer.Argument(help="glob or substring of the name, e.g. 'core:*'")] = None,
    fmt: FormatOption = None,
) -> None:
    """List registered components, optionally of one KIND and matching PATTERN."""
    from atlas_core.errors import did_you_mean
    from atlas_core.host.registry import KINDS

    if kind is not None and kind not in KINDS:
        hint = did_you_mean(kind, KINDS)
        if hint and pattern is None and not any(ch in kind for ch in ":*?["):
            raise typer.BadParameter(f"unknown kind {kind!r}; {hint}", param_hint="KIND")
        if pattern is not None:
            raise typer.BadParameter(f"unknown kind {kind!r}; kinds are {', '.join(KINDS)}",
                                     param_hint="KIND")
        kind, pattern = None, kind  # a single argument that is not a kind is a pattern
    rows = [_row(c) for c in _registry().all(kind, pattern)]

    def human(rows):
        from rich.table import Table
        from rich.text import Text

        table = Table(title=f"{len(rows)} component(s)")
        for col in ("name", "kind", "provider", "summary", "capabilities"):
            table.add_column(col, overflow="fold")
        for r in rows:
            table.add_row(Text(r["name"]), r["kind"], Text(r["distribution"]), Text(r["summary"]),
                          Text(", ".join(r["capabilities"])))
        out_console().print(table)

    emit(rows, fmt, human)


def _details(c) -> dict[str, Any]:
    row = _row(c)
    row["provider"] = {
        "namespace": c.provider.namespace,
        "distribution": c.provider.distribution,
        "version": c.provider.version,
        "module": c.provider.module,
    }
    row["extra"] = _jsonable(dict(c.extra))
    row["params_schema"] = None
    row["params_error"] = None
    try:
        model = c.load_params()
        if model is not None:
            row["params_schema"] = model.model_json_schema()
    except Exception as exc:  # noqa: BLE001 - a broken params model is shown, not fatal
        row["params_error"] = f"{type(exc).__name__}: {exc}"
    return row


def _param_rows(schema: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(name, type, default, description + constraints) per property of a JSON schema."""
    out = []
    required = set(schema.get("required", []))
    for name, prop in schema.get("properties", {}).items():
        types = [p.get("type") or p.get("$ref", "").rsplit("/", 1)[-1] for p in prop.get("anyOf", [prop])]
        if "enum" in prop:
            types = [" | ".join(repr(e) for e in prop["enum"])]
        typ = " | ".join(str(t) for t in types if t) or "any"
        default = "(required)" if name in required else repr(prop.get("default"))
        limits = [f"{sym} {prop[key]}" for key, sym in
                  (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"))
                  if key in prop]
        desc = prop.get("description", "")
        if limits:
            desc = f"{desc} ({', '.join(limits)})" if desc else ", ".join(limits)
        out.append((name, typ, default, desc))
    return out


@components_app.command(
    "show", epilog=examples("atlas components show core:chunkwise", "atlas --format json components show titans:mlp")
)
def show_component(
    name: Annotated[str, typer.Argument(help="component name 'ns:name' (or an unambiguous short name)")],
    fmt: FormatOption = None,
) -> None:
    """Show one component: kind, provider, summary, capabilities and params with defaults."""
    from atlas_core.errors import AtlasError, did_you_mean

    reg = _registry()
    found = reg.find(name)
    if not found:
        pool = sorted({c.name for c in reg.all()})
        hint = did_you_mean(name, pool) or "see `atlas components list`"
        raise AtlasError(f"no component named {name!r}; {hint}")
    data = [_details(c) for c in found]

    def human(data):
        from rich.markup import escape
        from rich.table import Table
        from rich.text import Text

        con = out_console()
        for d in data:
            con.print(f"[bold]{escape(d['name'])}[/]  ({d['kind']})")
            p = d["provider"]
            con.print(f"  provider: {escape(p['namespace'])} from {escape(p['distribution'])} "
                      f"{escape(p['version'])} ({escape(p['module'])})")
            if d["summary"]:
                con.print(f"  summary: {escape(d['summary'])}")
            con.print(f"  capabilities: {escape(', '.join(d['capabilities']) or '-')}")
            if d["priority"]:
                con.print(f"  priority: {d['priority']}")
            for key, value in d["extra"].items():
                con.print(f"  {escape(key)}: {escape(str(value))}")
            if d["params_error"]:
                con.print(f"  [red]params model failed to load[/]: {escape(d['params_error'])}")
            elif d["params_schema"] is None:
                con.print("  params: none")
            else:
                table = Table(title="params", title_justify="left")
                for col in ("name", "type", "default", "description"):
                    table.add_column(col, overflow="fold")
                for row in _param_rows(d["params_schema"]):
                    table.add_row(*(Text(x) for x in row))
                con.print(table)

    emit(data, fmt, human)


def register(app) -> None:
    app.add_typer(components_app, name="components")
