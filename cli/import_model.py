"""``atlas import SRC OUT``: a checkpoint directory of a known family as an atlas run directory
(`atlas_core.model_import`; docs/import.md). ``atlas import-fla`` is the same command under its
earlier name.

``SRC`` is the directory ``save_pretrained`` wrote (``config.json`` + safetensors, optionally a
tokenizer); ``OUT`` becomes a run directory with one checkpoint that ``atlas generate``, ``atlas
eval``, ``atlas train --resume``, ``atlas export-hf`` and ``atlas_core.load`` accept. ``--set
KEY.PATH=VALUE`` changes the imported spec first (e.g. ``memory.use=titans:titans``), keeping every
weight the changed model can use.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .common import FormatOption, emit, examples, out_console


def human(r: dict[str, Any]) -> None:
    from atlas_core.model_import import describe

    out_console().print(describe(r), markup=False, highlight=False)


def import_model(
    src: Annotated[str, typer.Argument(help="a checkpoint directory (config.json + safetensors)")],
    out: Annotated[str, typer.Argument(help="the run directory to write (new or empty)")],
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="KEY.PATH=VALUE: change the imported spec before the model is built (repeatable), "
        "e.g. memory.use=titans:titans; every weight the changed model can use is kept")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="write into OUT even if it holds files")] = False,
    fmt: FormatOption = None,
) -> None:
    """Import a model: transformers' Qwen3.5, Qwen3-Next and OLMo Hybrid, and flash-linear-attention's
    families (DeltaNet, Gated DeltaNet, Gated DeltaProduct, KDA, GLA, RetNet, linear attention; with
    hybrid attention layers)."""
    from atlas_core.model_import import import_checkpoint

    emit(import_checkpoint(src, out, overrides=set_ or (), overwrite=overwrite), fmt, human)


def import_fla(
    src: Annotated[str, typer.Argument(help="an fla checkpoint directory (config.json + safetensors)")],
    out: Annotated[str, typer.Argument(help="the run directory to write (new or empty)")],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="write into OUT even if it holds files")] = False,
    fmt: FormatOption = None,
) -> None:
    """Import a flash-linear-attention model (the same as `atlas import`, for fla's families)."""
    from atlas_core.fla_import import import_fla as run

    emit(run(src, out, overwrite=overwrite), fmt, human)


def register(app: typer.Typer) -> None:
    app.command(
        "import",
        epilog=examples(
            "atlas import qwen3.5-0.8b/ runs/qwen",
            "atlas import qwen3.5-0.8b/ runs/qwen-titans --set memory.use=titans:titans",
            "atlas generate runs/qwen --prompt 'The capital of France is' --greedy",
        ),
    )(import_model)
    app.command(
        "import-fla",
        epilog=examples(
            "atlas import-fla fla-gdn-340m/ runs/gdn",
            "atlas generate runs/gdn --prompt-ids '1 2 3' --greedy",
        ),
    )(import_fla)
