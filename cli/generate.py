"""``atlas generate CKPT``: sample a continuation from a checkpoint.

A model trained on a ``text`` task takes ``--prompt TEXT`` (encoded as it was trained: bytes, the
checkpoint's character vocabulary or its subword tokenizer), or no prompt: it then samples from
the start of a document (`atlas_core.train.inference.document_start`). Every model takes
``--prompt-ids`` (token ids). Decoding is incremental with the carried memory state
(`MemoryLM.generate`).
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from .common import FormatOption, emit, examples, out_console
from .train import Device


def human(r: dict[str, Any]) -> None:
    con = out_console()
    if "text" in r:
        con.print(r["prompt"] + r["text"], markup=False, highlight=False, soft_wrap=True)
    else:
        con.print(" ".join(str(i) for i in r["ids"]), markup=False, highlight=False)


def generate(
    checkpoint: Annotated[str, typer.Argument(help="a checkpoint directory or a run directory")],
    prompt: Annotated[Optional[str], typer.Option("--prompt", help="prompt text (text-task models; without a prompt they sample from the start of a document)")] = None,
    prompt_ids: Annotated[Optional[str], typer.Option("--prompt-ids", help="prompt token ids, e.g. '3 17 5'")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=0, help="tokens to generate")] = 64,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="sampling temperature (0: greedy)")] = 1.0,
    top_k: Annotated[Optional[int], typer.Option("--top-k", min=1, help="sample among the k most likely tokens")] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p", min=0.0, max=1.0, help="nucleus sampling mass")] = None,
    greedy: Annotated[bool, typer.Option("--greedy", help="always take the most likely token")] = False,
    seed: Annotated[int, typer.Option("--seed", min=0, help="sampling seed")] = 0,
    device: Annotated[Device, typer.Option("--device", help="auto, cpu or cuda")] = Device.auto,
    fmt: FormatOption = None,
) -> None:
    """Generate tokens (or text) from a checkpoint, continuing a prompt."""
    from atlas_core.train.inference import generate_from_checkpoint, parse_ids

    if top_p is not None and top_p <= 0:
        raise typer.BadParameter(f"--top-p {top_p} must be in (0, 1]")
    ids = parse_ids(prompt_ids) if prompt_ids is not None else None
    result = generate_from_checkpoint(
        checkpoint, prompt=prompt, prompt_ids=ids, max_new_tokens=max_new_tokens,
        temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy, seed=seed,
        device=device.value,
    )
    emit(result, fmt, human)


def register(app: typer.Typer) -> None:
    app.command(
        "generate",
        epilog=examples(
            "atlas train examples/text_char.toml --out runs/text-char",
            "atlas generate runs/text-char --prompt 'The memory ' --max-new-tokens 200 --top-k 20",
            "atlas generate runs/text-char --max-new-tokens 200",
            "atlas generate runs/mqar-default --prompt-ids '5 40 9 33 5' --greedy --max-new-tokens 1",
        ),
    )(generate)
