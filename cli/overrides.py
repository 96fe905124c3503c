"""What the spec-taking commands share: ``KEY.PATH=VALUE`` words and the common flags.

``atlas train``, ``atlas compare``, ``atlas build`` and ``atlas spec validate|show`` take, after
their spec file(s), any number of overrides ``KEY.PATH=VALUE`` (`atlas_core.spec.overrides`), and
the training commands take the common flags ``--steps``, ``--lr``, ``--batch-size``,
``--seq-len``, ``--seed`` (each the override of the ``[train]`` key of the same name; a flag
applies after the ``KEY=VALUE`` words, so it wins over one for the same key).
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

OVERRIDES_HELP = ("KEY.PATH=VALUE overrides of the spec, e.g. model.d_model=64, applied before "
                  "validation (a value is a TOML literal such as 64, 1e-3, true or [1,2]; other "
                  "text is a string); see docs/cli.md")

StepsOption = Annotated[Optional[int], typer.Option(
    "--steps", min=1, help="total optimizer steps (= train.steps=N)", show_default=False)]
LrOption = Annotated[Optional[float], typer.Option(
    "--lr", help="AdamW peak learning rate (= train.lr=X)", show_default=False)]
BatchSizeOption = Annotated[Optional[int], typer.Option(
    "--batch-size", min=1, help="rows per optimizer step, the global batch (= train.batch_size=N)",
    show_default=False)]
SeqLenOption = Annotated[Optional[int], typer.Option(
    "--seq-len", min=2, help="sequence length of the task (= train.seq_len=N)", show_default=False)]
SeedOption = Annotated[Optional[int], typer.Option(
    "--seed", min=0, help="seed of the weights and the data (= train.seed=N)", show_default=False)]


def split_words(words: list[str] | None, *, at_most: int | None = None,
                what: str = "SPEC") -> tuple[list[str], list[str]]:
    """Command-line words -> ``(files, override texts)``; more than ``at_most`` files is a
    usage error (a word meant as an override needs the form ``KEY.PATH=VALUE``)."""
    from atlas_core.spec.overrides import split_args

    files, texts = split_args(words or [])
    if at_most is not None and len(files) > at_most:
        extra = files[at_most:]
        raise typer.BadParameter(
            f"one {what} at most, got also {', '.join(repr(f) for f in extra)}; an override is "
            "KEY.PATH=VALUE, e.g. model.d_model=64"
        )
    return files, texts


def overrides_of(texts: list[str], **flags: Any) -> list:
    """The parsed ``KEY=VALUE`` texts followed by the given common flags."""
    from atlas_core.spec.overrides import flag_overrides, parse_overrides

    return parse_overrides(texts) + flag_overrides(**flags)
