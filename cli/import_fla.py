"""``atlas import-fla SRC OUT``: a flash-linear-attention checkpoint as an atlas run directory.

``SRC`` is the directory an fla model's ``save_pretrained`` wrote (``config.json`` + safetensors);
``OUT`` becomes a run directory with one checkpoint that ``atlas generate``, ``atlas eval``,
``atlas export-hf`` and ``atlas_core.load`` accept (`atlas_core.fla_import`; docs/zoo.md,
"Importing fla checkpoints").
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .common import FormatOption, emit, examples, out_console


def human(r: dict[str, Any]) -> None:
    out_console().print(
        f"imported fla {r['family']} as core:lm + {r['preset']} ({r['parameters']:,} parameters) "
        f"into {r['out']}\ncheckpoint: {r['checkpoint']}",
        markup=False, highlight=False,
    )


def import_fla(
    src: Annotated[str, typer.Argument(help="an fla checkpoint directory (config.json + safetensors)")],
    out: Annotated[str, typer.Argument(help="the run directory to write (new or empty)")],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="write into OUT even if it holds files")] = False,
    fmt: FormatOption = None,
) -> None:
    """Import a flash-linear-attention model (DeltaNet, Gated DeltaNet, Gated DeltaProduct, KDA, GLA,
    RetNet, linear attention)."""
    from atlas_core.fla_import import import_fla as run

    emit(run(src, out, overwrite=overwrite), fmt, human)


def register(app: typer.Typer) -> None:
    app.command(
        "import-fla",
        epilog=examples(
            "atlas import-fla fla-gdn-340m/ runs/gdn",
            "atlas generate runs/gdn --prompt-ids '1 2 3' --greedy",
        ),
    )(import_fla)
