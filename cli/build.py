"""``atlas build FILE [KEY.PATH=VALUE]...``: build the model a spec describes (with the overrides
applied, `atlas_core.spec.overrides`) and report its parameters per block.

``--device meta`` constructs the model under ``torch.device("meta")``: shapes and parameter
counts without allocating memory, so even a large spec can be checked on a laptop. Before the
model is built, its parameter count is estimated from builds of one and two blocks on the meta
device (`atlas_core.preflight.check_model_size`): a spec over 10**10 parameters is one error,
not a build that runs for hours.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from .common import FormatOption, emit, examples, log, out_console
from .overrides import OVERRIDES_HELP, overrides_of, split_words


class BuildDevice(str, Enum):
    cpu = "cpu"
    meta = "meta"


def _fallback_report(model) -> list[tuple[str, int]]:
    return [(name, sum(p.numel() for p in child.parameters())) for name, child in model.named_children()]


def _report_rows(report: Any) -> list[dict[str, Any]]:
    """param_report() as rows: a list of (name, count) pairs, or a mapping name -> count."""
    items = report.items() if hasattr(report, "items") else report
    return [{"block": str(name), "params": int(count)} for name, count in items]


def build_report(file: str, device: str = "cpu", overrides: list | None = None) -> dict[str, Any]:
    from atlas_core.spec.overrides import load_with_overrides

    # first: a file that is no spec fails before torch loads
    spec = load_with_overrides(Path(file), overrides or [])

    import torch

    from atlas_core.model import build_model
    from atlas_core.preflight import check_model_size

    check_model_size(spec)  # counted from one- and two-block builds before the whole is built
    log(f"building {spec.arch} from {file} on {device}")
    if device == "meta":
        with torch.device("meta"):
            model = build_model(spec)
    else:
        model = build_model(spec)
    report = model.param_report() if hasattr(model, "param_report") else _fallback_report(model)
    params = list(model.parameters())
    return {
        "file": file,
        "name": spec.name,
        "arch": spec.arch,
        "spec_hash": spec.spec_hash,
        "device": device,
        "blocks": _report_rows(report),
        "total_params": sum(p.numel() for p in params),
        "total_bytes": sum(p.numel() * p.element_size() for p in params),
        "param_devices": sorted({str(p.device) for p in params}),
    }


def build(
    words: Annotated[list[str], typer.Argument(
        metavar="FILE KEY.PATH=VALUE", help="a spec file (.toml), then " + OVERRIDES_HELP)],
    device: Annotated[BuildDevice, typer.Option("--device", help="cpu, or meta to build without memory")] = BuildDevice.cpu,
    fmt: FormatOption = None,
) -> None:
    """Build the model of a spec and print its parameter count per block."""
    files, texts = split_words(words, at_most=1, what="FILE")
    if not files:
        raise typer.BadParameter("give a spec FILE (.toml)")
    data = build_report(files[0], device.value, overrides_of(texts))

    def human(d):
        from rich.table import Table
        from rich.text import Text

        table = Table(title=f"{d['name']}  ({d['arch']}, spec_hash {d['spec_hash']}, device {d['device']})")
        table.add_column("block", overflow="fold")
        table.add_column("params", justify="right")
        for r in d["blocks"]:
            table.add_row(Text(r["block"]), f"{r['params']:,}")
        table.add_row("[bold]total[/]", f"[bold]{d['total_params']:,}[/]")
        con = out_console()
        con.print(table)
        shared = sum(r["params"] for r in d["blocks"]) - d["total_params"]
        if shared > 0:
            con.print(f"blocks share {shared:,} parameters (tied weights); the total counts them once")
        con.print(f"{d['total_bytes'] / 2**20:.2f} MiB of parameters")

    emit(data, fmt, human)


def register(app: typer.Typer) -> None:
    app.command(
        "build",
        epilog=examples("atlas build examples/titans_lmm.toml",
                        "atlas build examples/titans_lmm.toml model.d_model=256 model.depth=4",
                        "atlas build examples/titans_deep_lmm.toml --device meta"),
    )(build)
