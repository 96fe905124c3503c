"""``atlas generate CKPT``: sample a continuation from a checkpoint.

A model trained on a ``text`` task takes ``--prompt TEXT`` (encoded as it was trained: bytes, the
checkpoint's character vocabulary or its subword tokenizer), or no prompt: it then samples from
the start of a document (`atlas_core.train.inference.document_start`). Every model takes
``--prompt-ids`` (token ids). Several ``--prompt`` (or ``--prompt-ids``) decode together as one
batch, each exactly as alone. Decoding is incremental with the carried state
(`atlas_core.decode`: core:lm's fused decode step, ``model.step`` for other architectures);
``--dtype bfloat16`` halves the bytes a token reads. One prompt's text streams to stdout as it is
decoded; the timing (prompt, then tokens per second) goes to stderr.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from .common import FormatOption, emit, examples, out_console
from .train import Device


def human(r: dict[str, Any]) -> None:
    con = out_console()
    for i, row in enumerate(r.get("rows", [r])):
        if "rows" in r:
            con.print(f"--- prompt {i + 1}", markup=False, highlight=False)
        if "text" in row:
            con.print(row["prompt"] + row["text"], markup=False, highlight=False, soft_wrap=True)
        else:
            con.print(" ".join(str(t) for t in row["ids"]), markup=False, highlight=False)


class Stream:
    """One prompt's continuation printed as it is decoded: ids, or text (a trailing incomplete
    character held back until its bytes have come)."""

    def __init__(self, codec, prompt: str | None, ids: list[int] | None) -> None:
        import sys

        self.codec, self.out, self.ids, self.shown = codec, sys.stdout, [], ""
        if codec is not None:
            self.out.write(prompt or "")
        self.out.flush()

    def __call__(self, row: int, token: int) -> None:
        self.ids.append(token)
        if self.codec is None:
            self.out.write((" " if len(self.ids) > 1 else "") + str(token))
        else:
            text = self.codec.decode(self.ids).rstrip("\ufffd")
            if text.startswith(self.shown):
                self.out.write(text[len(self.shown):])
                self.shown = text
        self.out.flush()

    def close(self) -> None:
        self.out.write("\n")
        self.out.flush()


def generate(
    checkpoint: Annotated[str, typer.Argument(help="a checkpoint directory or a run directory")],
    prompt: Annotated[Optional[list[str]], typer.Option("--prompt", help="prompt text (text-task models; without a prompt they sample from the start of a document); repeat it for a batch")] = None,
    prompt_ids: Annotated[Optional[list[str]], typer.Option("--prompt-ids", help="prompt token ids, e.g. '3 17 5'; repeat it for a batch")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=0, help="tokens to generate")] = 64,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="sampling temperature (0: greedy)")] = 1.0,
    top_k: Annotated[Optional[int], typer.Option("--top-k", min=1, help="sample among the k most likely tokens")] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p", min=0.0, max=1.0, help="nucleus sampling mass")] = None,
    greedy: Annotated[bool, typer.Option("--greedy", help="always take the most likely token")] = False,
    seed: Annotated[int, typer.Option("--seed", min=0, help="sampling seed")] = 0,
    device: Annotated[Device, typer.Option("--device", help="auto, cpu or cuda")] = Device.auto,
    dtype: Annotated[str, typer.Option("--dtype", help="the weights' dtype: float32 or bfloat16 (half the "
                                       "bytes a token reads; the memory stays float32)")] = "float32",
    fmt: FormatOption = None,
) -> None:
    """Generate tokens (or text) from a checkpoint, continuing one prompt or a batch of prompts."""
    from atlas_core.train.inference import generate_from_checkpoint, parse_ids

    from .common import OutputFormat, log, resolve_format

    if top_p is not None and top_p <= 0:
        raise typer.BadParameter(f"--top-p {top_p} must be in (0, 1]")
    if dtype not in ("float32", "bfloat16"):
        raise typer.BadParameter(f"{dtype!r}: choose float32 or bfloat16", param_hint="--dtype")
    ids = [parse_ids(p) for p in prompt_ids] if prompt_ids else None
    texts = list(prompt) if prompt else None
    if ids is not None and len(ids) == 1:
        ids = ids[0]
    if texts is not None and len(texts) == 1:
        texts = texts[0]
    single = not isinstance(ids, list) or not ids or not isinstance(ids[0], list)
    single = single and not isinstance(texts, list)
    stream = None
    if single and resolve_format(fmt) is not OutputFormat.json:
        stream = _stream_for(checkpoint, texts)
    result = generate_from_checkpoint(
        checkpoint, prompt=texts, prompt_ids=ids, max_new_tokens=max_new_tokens,
        temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy, seed=seed,
        device=device.value, dtype=dtype, on_token=stream,
    )
    if result.get("tokens_per_s") and resolve_format(fmt) is not OutputFormat.json:  # JSON: in the data
        log(f"prompt {sum(len(r['prompt_ids']) for r in result.get('rows', [result]))} tokens in "
            f"{result['prefill_s']:.2f} s; {result['tokens_per_s']:.1f} tokens/s after the first "
            f"({result['dtype']})")
    if stream is not None:
        stream.close()
        return
    emit(result, fmt, human)


def _stream_for(checkpoint: str, prompt: str | None) -> Stream:
    """A `Stream` with the checkpoint's text codec (None for an id model)."""
    from atlas_core.train.checkpoint_preflight import checked_load_checkpoint

    return Stream(checked_load_checkpoint(checkpoint).meta.codec(), prompt, None)


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
