"""``atlas export-hf RUN_OR_CHECKPOINT OUT_DIR``: a checkpoint as a Hugging Face model directory.

``OUT_DIR`` then opens with ``transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)`` after
``import atlas_core`` (docs/huggingface.md). Needs the ``hf`` extra (transformers).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .common import FormatOption, emit, examples, out_console


def human(r: dict[str, Any]) -> None:
    out_console().print(
        f"exported {r['name']} ({r['arch']}) at step {r['step']} to {r['out_dir']}: "
        f"{', '.join(r['files'])}\n"
        f"load it with: import atlas_core; from transformers import AutoModelForCausalLM; "
        f"AutoModelForCausalLM.from_pretrained({r['out_dir']!r})",
        markup=False, highlight=False,
    )


def export_hf(
    checkpoint: Annotated[str, typer.Argument(help="a checkpoint directory or a run directory (its latest checkpoint)")],
    out_dir: Annotated[str, typer.Argument(help="the directory to write (created; must be new or empty)")],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace OUT_DIR if it holds files")] = False,
    dtype: Annotated[str, typer.Option("--dtype", help="the weights' dtype in the export: float32 or "
                                       "bfloat16 (half the bytes; from_pretrained loads it so)")] = "float32",
    fmt: FormatOption = None,
) -> None:
    """Export a checkpoint for Hugging Face transformers (config.json + model.safetensors)."""
    from atlas_core.hf.export import export_checkpoint

    emit(export_checkpoint(checkpoint, out_dir, overwrite=overwrite, dtype=dtype), fmt, human)


def register(app: typer.Typer) -> None:
    app.command(
        "export-hf",
        epilog=examples(
            "atlas export-hf runs/text-char hf/text-char",
            "atlas export-hf runs/mqar-default/checkpoints/step-000002000 hf/mqar --overwrite",
            "atlas export-hf runs/text-char hf/text-char-bf16 --dtype bfloat16",
        ),
    )(export_hf)
