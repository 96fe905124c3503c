"""``atlas plugins list|doctor``: what the plugin host loaded, and what went wrong.

Neither command imports torch or any kernel: the host imports only the plugins' entry modules,
which must stay cheap (see `atlas_core.host.hookspecs`). A plugin that raised at import (or in its
hook) is shown as failed with its error; an entry point refused because its namespace belongs to
another distribution (or is claimed by two) is shown as refused with the reason. The other plugins
and every other command keep working.

Other modules may add commands to this group (``atlas plugins new``). Add them when the module is
imported (not inside ``register``, which runs for every app `make_app` builds), and list the
module in `atlas_cli.main.COMMAND_MODULES`::

    from atlas_cli.common import examples
    from atlas_cli.plugins import plugins_app

    @plugins_app.command("new", epilog=examples("atlas plugins new acme"))
    def new(name: str) -> None: ...

    def register(app) -> None:  # the command is already on plugins_app
        pass
"""

from __future__ import annotations

from typing import Any

from .common import AtlasTyper, Failed, FormatOption, emit, examples, out_console

plugins_app = AtlasTyper(help="Installed plugins: status, components, load errors.")

# Plugin sub-apps the CLI could not mount (a name already taken), shown by `plugins doctor`.
SKIPPED_APPS: list[dict[str, str]] = []


def _host():
    from atlas_core.host.manager import get_host

    return get_host()


def _rows() -> list[dict[str, Any]]:
    rows = []
    for rec in _host().records.values():
        row = rec.as_dict()
        row["n_components"] = len(rec.components)
        rows.append(row)
    return rows


@plugins_app.command("list", epilog=examples("atlas plugins list", "atlas --format json plugins list"))
def list_plugins(fmt: FormatOption = None) -> None:
    """List the installed plugins: namespace, distribution, version, status, components."""
    rows = _rows()

    def human(rows):
        from rich.table import Table
        from rich.text import Text

        table = Table(title="plugins (entry-point group atlas_core.plugins)")
        for col in ("namespace", "distribution", "version", "status", "components", "error"):
            table.add_column(col, overflow="fold")
        for r in rows:
            status = {"ok": "[green]ok[/]", "failed": "[red]failed[/]",
                      "refused": "[red]refused[/]"}.get(r["status"], r["status"])
            table.add_row(Text(r["namespace"]), Text(r["distribution"]), Text(r["version"]),
                          status, str(r["n_components"]), Text(r["error"] or ""))
        out_console().print(table)

    emit(rows, fmt, human)


@plugins_app.command(
    "doctor", epilog=examples("atlas plugins doctor", "ATLAS_STRICT_PLUGINS=1 atlas plugins doctor")
)
def doctor(fmt: FormatOption = None) -> None:
    """Diagnose plugins: failures with tracebacks, refusals with the reason, hooks, import time.
    Exit 1 if any failed or was refused."""
    host = _host()
    rows = []
    for rec in host.records.values():
        row = rec.as_dict()
        row["traceback"] = rec.traceback
        rows.append(row)
    failed = [r for r in rows if r["status"] in ("failed", "refused")]
    data = {"ok": not failed, "plugins": rows, "skipped_cli_apps": list(SKIPPED_APPS)}

    def human(data):
        from rich.markup import escape

        con = out_console()
        for r in data["plugins"]:
            mark = {"ok": "[green]ok[/]", "failed": "[red]FAILED[/]",
                    "refused": "[red]REFUSED[/]"}.get(r["status"], r["status"])
            con.print(
                f"{mark}  [bold]{escape(r['namespace'])}[/]  {escape(r['distribution'])} "
                f"{escape(r['version'])}  module={escape(r['module'])}  import={r['import_seconds'] * 1000:.1f} ms  "
                f"hooks={', '.join(r['hooks']) or '-'}  components={len(r['components'])}"
            )
            if r["status"] == "refused":  # nothing of it was imported: the reason is all there is
                con.print(f"    refused: {r['error']}", markup=False)
            if r["status"] == "failed":
                con.print(f"    error: {r['error']}", markup=False)
                for line in (r["traceback"] or "").rstrip().splitlines():
                    con.print(f"    {line}", markup=False)
        for s in data["skipped_cli_apps"]:
            con.print(f"[yellow]skipped[/] CLI command {escape(repr(s['name']))} of plugin "
                      f"{escape(s['namespace'])}: {escape(s['reason'])}")
        n_failed = sum(r["status"] == "failed" for r in failed)
        n_refused = len(failed) - n_failed
        parts = ([f"{n_failed} plugin(s) failed to load"] if n_failed else []) + (
            [f"{n_refused} plugin(s) refused (a namespace claimed by another distribution)"]
            if n_refused else [])
        con.print("all plugins loaded" if not failed else f"[red]{escape('; '.join(parts))}[/]")

    emit(data, fmt, human)
    if failed:
        raise Failed()


def register(app) -> None:
    app.add_typer(plugins_app, name="plugins")
