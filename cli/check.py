"""``atlas check NAMESPACE|COMPONENT``: run the conformance kit without writing a test.

    atlas check titans                 # every component of the titans plugin
    atlas check miras:lp               # one component (its declared cases, or default params)
    atlas check core --check check_causal --format json
    atlas check zoo:deltanet --strategy acme   # under acme's strategies, not the bundled ones
    atlas check --list                 # the check catalogue

Prints a table of passed / failed / xfail / skipped checks with the reason of each (for a passed
check: the strategies and variants it compared, and its warnings), and exits 1 when any check
failed. Rules and knobs are compared under the bundled strategies and their own plugin's
(``--strategy`` chooses others); a failure under another package's strategy is marked as that
strategy's. Every strategy of the namespace also runs at its own default chunk size
(``check_default_chunk_size``) and against every rule the environment has, refusing those with no
exact chunked form (``check_strategy_on_every_rule``). An unknown namespace or
component is one line with a suggestion (exit 1); a plugin that failed to import fails its checks
with that error (plugins are loaded strictly).
The same checks run under pytest through `atlas_core.testing.parametrize_with_checks`.

Mounting (the root app): ``app.command("check", epilog=EPILOG)(check)``, or `register(app)`.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from .common import Failed, FormatOption, emit, examples, log, out_console

EPILOG = examples("atlas check titans", "atlas check miras:lp --format json",
                  "atlas check zoo:deltanet --strategy acme", "atlas check --list")
STYLE = {"passed": "green", "failed": "red", "xfail": "yellow", "xpass": "yellow", "skipped": "cyan"}


def _catalogue_rows() -> list[dict[str, str]]:
    from atlas_core.testing import catalogue

    return [
        {"check": c.name, "kinds": ", ".join(sorted(c.kinds)), "contract": c.clause, "docs": c.anchor}
        for c in catalogue().values()
    ]


def _show_catalogue(fmt) -> None:
    rows = _catalogue_rows()

    def human(rows):
        from rich.table import Table

        table = Table(title="conformance checks (docs/plugins.md#the-check-catalogue)")
        for col in ("check", "kinds", "contract"):
            table.add_column(col, overflow="fold")
        for r in rows:
            table.add_row(r["check"], r["kinds"], r["contract"])
        out_console().print(table)

    emit(rows, fmt, human)


def _human(data: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"atlas check {data['target']}")
    for col in ("component", "check", "status", "reason"):
        table.add_column(col, overflow="fold")
    for r in data["results"]:
        detail = r["message"] if r["status"] in ("failed", "xfail") else r["reason"]
        notes = "; ".join(r.get("notes") or ())
        if r["status"] not in ("failed", "xfail") and notes:
            detail = f"{detail}; {notes}" if detail else notes
        style = STYLE.get(r["status"], "")
        status = r["status"]
        if r.get("blame") and r["blame"] != r["case"]:  # a third-party strategy's failure
            status += f" ({r['blame']}'s)"
        table.add_row(escape(r["case"]), r["check"], f"[{style}]{escape(status)}[/]", escape(detail or ""))
    con = out_console()
    con.print(table)
    c = data["counts"]
    parts = [f"{c[s]} {s}" for s in ("passed", "failed", "xfail", "xpass", "skipped") if c.get(s)]
    verdict = "[green]ok[/]" if data["ok"] else "[red]FAILED[/]"
    con.print(f"{verdict}: " + ", ".join(parts) + f" ({data['seconds']:.1f} s)")


def _progress():
    """One line per component on stderr, when stderr is a terminal (data stays on stdout)."""
    import sys

    if not sys.stderr.isatty():
        return None
    seen: set[str] = set()

    def progress(case: str, name: str) -> None:
        if case not in seen:
            seen.add(case)
            log(f"checking {case} ...")

    return progress


def check(
    target: Annotated[Optional[str], typer.Argument(
        help="a plugin namespace (titans) or a component name (miras:lp)")] = None,
    only: Annotated[Optional[list[str]], typer.Option(
        "--check", help="run only this check (repeatable); see --list")] = None,
    device: Annotated[Optional[str], typer.Option(help="device of the checks, e.g. cpu or cuda")] = None,
    dtype: Annotated[Optional[str], typer.Option(
        help="dtype of the equivalence checks: float64 (default) or float32")] = None,
    strategies: Annotated[Optional[list[str]], typer.Option(
        "--strategy", help="compare rules and knobs under these strategies (names or namespaces, "
        "repeatable) instead of the bundled ones; e.g. --strategy acme to certify acme's strategies "
        "on a bundled rule")] = None,
    list_checks: Annotated[bool, typer.Option("--list", help="list the check catalogue and exit")] = False,
    fmt: FormatOption = None,
) -> None:
    """Run the conformance checks on a plugin namespace or one component."""
    import time

    if list_checks:
        _show_catalogue(fmt)
        return
    if not target:
        raise typer.BadParameter("give a namespace or a component name, e.g. `atlas check titans`",
                                 param_hint="TARGET")
    from atlas_core.errors import did_you_mean
    from atlas_core.testing import cases_for_target, catalogue, configure, run_cases

    configure(device=device, dtype=dtype, strategies=strategies or ())  # () resets an earlier choice
    if only:
        known = catalogue()
        for name in only:
            if name not in known:
                hint = did_you_mean(name, known) or "see `atlas check --list`"
                raise ValueError(f"unknown check {name!r}; {hint}")
    t0 = time.perf_counter()
    cases = cases_for_target(target)
    results = run_cases(cases, checks=only, progress=_progress())
    seconds = time.perf_counter() - t0
    from atlas_core.testing.results import STATUSES

    counts = {s: 0 for s in STATUSES}
    for r in results:
        counts[r.status] += 1
    data = {
        "target": target,
        "ok": counts["failed"] == 0,
        "counts": counts,
        "seconds": round(seconds, 2),
        "results": [r.as_dict() for r in results],
    }
    emit(data, fmt, _human)
    if not data["ok"]:
        log(f"{counts['failed']} check(s) failed; each message names the contract and its section "
            "in docs/plugins.md")
        raise Failed()


def register(app: typer.Typer) -> None:
    """Mount ``atlas check`` on the root app."""
    app.command("check", epilog=EPILOG)(check)
