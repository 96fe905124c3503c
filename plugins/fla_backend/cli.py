"""``atlas fla certify|status|revoke``: the certificates that let ``"auto"`` run fla's kernels.

    atlas fla certify                      # the kit on every fla backend, on this device
    atlas fla certify fla:gla simple_gla   # some of them
    atlas fla status                       # available? certified here? where is the file?
    atlas fla revoke fla:gla               # "auto" stops choosing it on this device

`atlas check fla` runs the same checks without recording anything. Cheap to import (typer only):
the CLI imports every plugin's command module at start-up.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from atlas_cli.common import AtlasTyper, Failed, FormatOption, emit, examples, log, out_console

app = AtlasTyper(help="fla's chunk kernels as backends: certify them on this device (the "
                 "conformance kit), show and revoke certificates.")

Names = Annotated[Optional[list[str]], typer.Argument(
    help="fla backends (fla:gla or gla); default: all of them")]


def _names(given: list[str] | None) -> list[str]:
    from atlas_core.errors import did_you_mean

    from .certify import backend_names

    known = backend_names()
    if not given:
        return known
    out = []
    for name in given:
        full = name if ":" in name else f"fla:{name}"
        if full not in known:
            hint = did_you_mean(full, known) or f"the fla backends are {', '.join(known)}"
            raise typer.BadParameter(f"{name!r} is not an fla backend; {hint}", param_hint="BACKENDS")
        out.append(full)
    return out


def _table(title: str, cols: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    from rich.table import Table

    table = Table(title=title)
    for col in cols:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*row)
    out_console().print(table)


@app.command("certify", epilog=examples("atlas fla certify", "atlas fla certify fla:gla fla:simple_gla"))
def certify_cmd(backends: Names = None, fmt: FormatOption = None) -> None:
    """Run the conformance kit on fla's backends on this device; certify the ones that pass."""
    from .certify import certify

    names = _names(backends)
    seen: set[str] = set()

    def progress(case: str, check: str) -> None:  # stderr, one line per case: fla compiles for minutes
        if case not in seen:
            seen.add(case)
            log(f"certify: {case} ...")

    rows = certify(names, progress=progress)

    def human(rows):
        _table("atlas fla certify", ("backend", "device", "certified", "calls", "reason"),
               [(r["backend"], str(r["device"]), "yes" if r["certified"] else "no", str(r["calls"]),
                 r["reason"]) for r in rows])

    emit(rows, fmt, human)
    bad = [r["backend"] for r in rows if not r["certified"]]
    if bad:
        log(f"not certified: {', '.join(bad)} (\"auto\" keeps running the PyTorch code for them)")
        raise Failed()


@app.command("status", epilog=examples("atlas fla status", "atlas --format json fla status"))
def status_cmd(fmt: FormatOption = None) -> None:
    """Whether each fla backend is available and certified on this device."""
    from . import certificates
    from .availability import available, device_name
    from .backend import FlaBackend

    ok, why = available()
    rows = []
    for name in _names(None):
        be = FlaBackend(name.split(":", 1)[1])
        cert_ok, cert_why = be.certified() if ok else (False, "")
        rows.append({"backend": name, "available": ok, "certified": cert_ok,
                     "device": device_name() if ok else None, "reason": why if not ok else cert_why})
    data = {"certificates": str(certificates.path()), **certificates.versions(), "backends": rows}

    def human(d):
        out_console().print(f"certificates: {d['certificates']} (fla {d['fla']}, atlas {d['atlas']}, "
                            f"triton {d['triton']})", markup=False)
        _table("fla backends", ("backend", "available", "certified", "reason"),
               [(r["backend"], "yes" if r["available"] else "no", "yes" if r["certified"] else "no",
                 r["reason"]) for r in d["backends"]])

    emit(data, fmt, human)


@app.command("revoke", epilog=examples("atlas fla revoke", "atlas fla revoke fla:gla"))
def revoke_cmd(backends: Names = None, fmt: FormatOption = None) -> None:
    """Remove the certificates of fla's backends on this device (for the installed versions)."""
    from . import certificates
    from .availability import available, device_name

    ok, why = available()
    if not ok:
        raise typer.BadParameter(f"fla's backends are not available here ({why}): no device to revoke for")
    dev = device_name()
    rows = [{"backend": n, "device": dev, "revoked": certificates.revoke(n, dev)} for n in _names(backends)]
    emit(rows, fmt, lambda rows: _table("atlas fla revoke", ("backend", "device", "revoked"),
                                        [(r["backend"], r["device"], "yes" if r["revoked"] else "no (none held)")
                                         for r in rows]))
