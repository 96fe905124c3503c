"""``atlas examples list|copy``: the example specs that ship with the package.

``list`` shows each example's name, what it is and what it costs to train; ``copy DEST`` writes
them (or the ones named) into a folder to edit and train from. Works the same from a wheel and
from a checkout.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import AtlasTyper, FormatOption, emit, examples, log, out_console

app = AtlasTyper(help="The example specs that ship with the package (list them, copy them out).",
                 no_args_is_help=True)


@app.command("list", epilog=examples("atlas examples list", "atlas examples list --format json"))
def list_cmd(fmt: FormatOption = None) -> None:
    """List the example specs: name, what each is, its training cost."""
    from atlas_core.example_specs import list_examples

    rows = list_examples()

    def human(rs):
        from rich.table import Table
        from rich.text import Text

        table = Table("name", "what it is", "cost", show_lines=False)
        for r in rs:  # as plain text: a summary's "[B, T, H]" or "[a | b]" is not rich markup
            table.add_row(Text(r["name"]), Text(r["summary"]), Text(r["cost"]))
        out_console().print(table)

    emit(rows, fmt, human)


@app.command("copy", epilog=examples("atlas examples copy my-specs",
                                     "atlas examples copy . --name titans_lmm --name zoo_gla"))
def copy_cmd(
    dest: Annotated[str, typer.Argument(help="the folder to write the specs into (created if missing)")],
    name: Annotated[Optional[list[str]], typer.Option("--name", help="only this example (repeatable)")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace files that exist")] = False,
    fmt: FormatOption = None,
) -> None:
    """Copy the example specs (or the ones named), with the files they read, into DEST."""
    from atlas_core.errors import did_you_mean
    from atlas_core.example_specs import examples_dir

    src = examples_dir()
    available = sorted(p.stem for p in src.glob("*.toml"))
    wanted = list(name or available)
    unknown = [n for n in wanted if n not in available]
    if unknown:
        hint = did_you_mean(unknown[0], available)
        raise typer.BadParameter(f"no example {unknown[0]!r}" + (f"; {hint}" if hint else "")
                                 + f" (examples: {', '.join(available)})", param_hint="--name")
    target = Path(dest)
    # each spec with the files it reads (text_char.toml: its corpus text_char.txt)
    files = [p.name for n in wanted for p in sorted(src.glob(f"{n}.*")) if p.suffix in (".toml", ".txt")]
    clash = [f for f in files if (target / f).exists()]
    if clash and not force:
        raise FileExistsError(f"{target / clash[0]} exists; pass --force to replace it or copy "
                              "into another folder")
    target.mkdir(parents=True, exist_ok=True)
    for f in files:
        tmp = target / f".{f}.partial"
        shutil.copyfile(src / f, tmp)
        tmp.replace(target / f)
    emit({"copied": wanted, "to": str(target)}, fmt,
         lambda r: log(f"examples: copied {len(r['copied'])} spec(s) to {r['to']}"))


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="examples")
