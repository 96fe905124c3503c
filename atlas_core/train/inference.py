"""Using a checkpoint: evaluate it on a task, generate from it (``atlas eval``, ``atlas generate``).

The model is rebuilt from the checkpoint's own resolved spec and its weights are loaded from
safetensors (`load_checkpoint` verifies every file first).

Task selection for evaluation (`eval_task`):
- no task: the training task, with the training params (vocab size and length included);
- the training task's name, optionally with params: the training params updated with them (e.g.
  ``{use = "mqar", num_pairs = 16, seq_len = 128}`` to test longer recall);
- in both, a param that names a file (a text task's ``path``, see `file_params`) and that
  ``--task`` leaves out is the checkpoint's only when the file found at that path is the one the
  run read (its size and SHA-256, recorded in the checkpoint: `task_files`); otherwise the user
  names it (``--task '{use = "text", path = "data.txt"}'``), so a forged ``meta.json`` cannot make
  ``atlas eval`` read a local file its author did not already know. A param left unset (a byte
  or char model's ``tokenizer = None``) names no file. A subword model's tokenizer is kept whole
  in the checkpoint (content, not a path): it is used when ``--task`` names no tokenizer, and a
  tokenizer named must be the same one;
- another task: its defaults, with ``vocab_size`` from the model.
A text task is evaluated on its held-out split; in char mode its vocabulary must be the
checkpoint's (otherwise ids would mean other characters).
"""

from __future__ import annotations

import tempfile
import tomllib
from pathlib import Path
from typing import Callable, Any

import torch

from ..errors import Issue, SpecError
from ..host.registry import split_use
from .checkpoint import Checkpoint, CheckpointError
from .checkpoint_preflight import check_weights_fit, checked_load_checkpoint
from .codec import TextCodec
from .evaluate import build_task, evaluate, held_out, without_file_params
from .setup import resolve_device
from .task_files import unverified_files


def parse_task_option(value: str | None) -> Any:
    """``--task``: a name (``mqar``) or an inline TOML table (``{use = "mqar", num_pairs = 4}``)."""
    if value is None:
        return None
    text = value.strip()
    if text.startswith("{"):
        try:
            return tomllib.loads(f"task = {text}")["task"]
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(
                f"--task {value!r} is not an inline TOML table ({exc}); write e.g. "
                "--task '{use = \"mqar\", num_pairs = 4}'"
            ) from None
    return text


def open_checkpoint(path: str, device: str = "auto") -> tuple[Checkpoint, torch.nn.Module, str]:
    """``(checkpoint, model with its weights in eval mode, device)``."""
    from ..model import build_model

    ckpt = checked_load_checkpoint(path)
    check_weights_fit(ckpt)  # before the model is allocated: the spec could ask for any size
    dev = resolve_device(device)
    model = build_model(ckpt.spec)
    ckpt.load_model(model)
    return ckpt, model.to(dev).eval(), dev


def eval_task(ckpt: Checkpoint, task: Any = None, seq_len: int | None = None):
    """The task to evaluate ``ckpt`` on (see the module docstring)."""
    vocab = int(ckpt.spec.model.get("vocab_size", 0))
    trained = ckpt.meta.trained_task()
    trained_use = trained.get("use")
    if task is None:
        name, raw = trained_use, {}
    else:
        from .params import resolve_task

        resolved = resolve_task(task, "--task")  # unknown names get a suggestion
        name, raw = split_use(resolved, "--task")
    if name is None:
        raise SpecError([Issue("--task", "the checkpoint records no task; name one", None,
                               "e.g. --task mqar")])
    codec = ckpt.meta.codec()
    own_tokenizer = False
    if name == trained_use:
        # The training params, except the files they name: those come from the command line, or
        # are the recorded ones when the files there are still the ones the run read.
        kept, dropped = without_file_params(name, trained.get("params", {}))
        # a file param left unset (None: no tokenizer in byte or char mode) names no file
        kept.update({k: v for k, v in dropped.items() if v is None})
        dropped = {k: v for k, v in dropped.items() if v is not None}
        table = {"use": name, **kept, **raw}
        # a subword model keeps its whole tokenizer (content, not a path): it is used when the
        # command names none
        own_tokenizer = ("tokenizer" in dropped and "tokenizer" not in raw
                         and getattr(codec, "mode", None) == "bpe")
        unnamed = {k: v for k, v in dropped.items()
                   if k not in raw and not (own_tokenizer and k == "tokenizer")}
        refused = unverified_files(name, unnamed, ckpt.meta.recorded_files())
        if refused:
            trained_files = ", ".join(f"{k} = {unnamed[k]!r}" for k in sorted(refused))
            why = "; ".join(refused[k] for k in sorted(refused))
            wanted = ", ".join(f'{k} = "FILE"' for k in sorted(refused))
            kept_note = "the other training params are kept" + (
                ", and the tokenizer is the checkpoint's own" if own_tokenizer else "")
            raise SpecError([Issue(
                "--task", f"the checkpoint was trained on {name} with {trained_files}, and a "
                f"checkpoint's file is read again only when it is the file the run read: {why}",
                None,
                f"name {'them' if len(refused) > 1 else 'it'} yourself: --task "
                f"'{{use = \"{name}\", {wanted}}}' ({kept_note})")])
        table.update(unnamed)  # every recorded file here is the one the run read
    else:
        table = {"use": name, **raw}
    if own_tokenizer:
        with tempfile.TemporaryDirectory(prefix="atlas-tokenizer-") as tmp:
            (Path(tmp) / "tokenizer.json").write_text(codec.tokenizer_json)
            built = held_out(build_task({**table, "tokenizer": str(Path(tmp) / "tokenizer.json")},
                                        vocab, seq_len, path="--task"))
    else:
        built = held_out(build_task(table, vocab, seq_len, path="--task"))
    if built.name == "text" and built.params.mode == "char":
        if codec is None or codec.vocab != tuple(built.vocab):
            raise SpecError([Issue(
                "--task", "this char-level text has another character vocabulary than the "
                "checkpoint's training text, so its ids would mean other characters", built.params.path,
                "evaluate on the training file, or train in byte mode")])
    if built.name == "text" and built.params.mode == "bpe":
        if codec is None or codec.tokenizer_json != built.tokenizer.to_str():
            raise SpecError([Issue(
                "--task", "this tokenizer is not the one the checkpoint was trained with, so its "
                "ids would mean other subwords", built.params.tokenizer,
                "name the training tokenizer (or evaluate with the checkpoint's: `atlas "
                "tokenizer export CKPT tokenizer.json`)")])
    return built


def evaluate_checkpoint(path: str, *, task: Any = None, seq_len: int | None = None,
                        batches: int | None = None, batch_size: int | None = None,
                        seed: int | None = None, device: str = "auto") -> dict[str, Any]:
    """Evaluate a checkpoint (`eval_task`, `evaluate`). ``batches``, ``batch_size`` and ``seed``
    default to the run's ``eval_batches``, ``batch_size`` and ``seed``, so the training task is
    evaluated on the rows of the run's own evaluations (its final figures, reproduced)."""
    ckpt, model, dev = open_checkpoint(path, device)
    built = eval_task(ckpt, task, seq_len)
    train = ckpt.spec.train or {}
    batches = batches if batches is not None else _int(train.get("eval_batches"), 8)
    batch_size = batch_size if batch_size is not None else _int(train.get("batch_size"), 32)
    seed = seed if seed is not None else _int(train.get("seed"), 0)
    result = evaluate(model, built, batches=batches, batch_size=batch_size, seed=seed, device=dev)
    return {"checkpoint": str(ckpt.path), "step": ckpt.step, "name": ckpt.spec.name,
            "task": built.describe(), **result}


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def parse_ids(text: str) -> list[int]:
    """``--prompt-ids``: integers separated by commas and/or spaces."""
    parts = [p for p in text.replace(",", " ").split() if p]
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"--prompt-ids {text!r}: give integers separated by commas or spaces") from None


def _prompt_ids(codec: TextCodec | None, ckpt: Checkpoint, prompt: str | None, ids: list[int] | None) -> list[int]:
    """One prompt's ids: its text encoded by the checkpoint's codec, its ids, or (a text model
    without a prompt) the start of a document."""
    if prompt is None and ids is None:  # a text model samples from a document start; an id model needs its prompt
        if codec is None:
            task = ckpt.meta.trained_task().get("use", "?")
            raise ValueError(
                f"this checkpoint was trained on {task}, whose tokens are ids with no start of "
                "their own; pass --prompt-ids, e.g. --prompt-ids '3 17 5'")
        return document_start(codec)
    if prompt is not None:
        if codec is None:
            task = ckpt.meta.trained_task().get("use", "?")
            raise ValueError(
                f"this checkpoint was trained on {task}, whose tokens are ids, not text; pass "
                "--prompt-ids, e.g. --prompt-ids '3 17 5'"
            )
        return codec.encode(prompt)
    return list(ids or [])


def generate_from_checkpoint(
    path: str, *, prompt: str | list[str] | None = None, prompt_ids: list[int] | list[list[int]] | None = None,
    max_new_tokens: int = 64, temperature: float = 1.0, top_k: int | None = None,
    top_p: float | None = None, greedy: bool = False, seed: int = 0, device: str = "auto",
    dtype: str = "float32", on_token: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Continue one prompt (``prompt`` text or ``prompt_ids``) or several (a list of texts or of id
    lists: decoded together as one batch, each as alone: `atlas_core.decode.generate`), the model's
    weights in ``dtype``. ``on_token(row, id)`` is called with each new token as it comes. The
    result of one prompt: ``prompt_ids``, ``ids`` (the new ones), with text ``prompt`` and
    ``text``; of several, ``rows`` of those; both with the timings (``prefill_s``, ``decode_s``,
    ``tokens_per_s``: the decoded tokens, all rows, a second after the first)."""
    import time

    from ..decode import generate
    from ..decode.load import open_for_inference

    if prompt is not None and prompt_ids is not None:
        raise ValueError("give --prompt TEXT or --prompt-ids IDS, not both")
    texts = prompt if isinstance(prompt, list) else ([prompt] if prompt is not None else None)
    id_rows = (prompt_ids if prompt_ids and isinstance(prompt_ids[0], list)
               else ([prompt_ids] if prompt_ids is not None else None))
    ckpt, model = open_for_inference(path, dtype=dtype, device=device)
    codec = model.codec
    wanted = texts if texts is not None else (id_rows if id_rows is not None else [None])
    rows = [_prompt_ids(codec, ckpt, t if texts is not None else None, t if id_rows is not None else None)
            for t in wanted]
    vocab = model.vocab_size
    for ids in rows:
        if not ids:
            raise ValueError("the prompt is empty; give at least one token")
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise ValueError(f"--prompt-ids: {bad[:5]} outside [0, {vocab}) (the model's vocab_size)")
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    usable = vocab
    if codec is not None and codec.vocab is not None:
        usable = len(codec.vocab)
    elif codec is not None and codec.mode == "bpe":
        usable = min(vocab, codec.tokenizer.get_vocab_size())
    new: list[list[int]] = [[] for _ in rows]
    start = time.perf_counter()
    first = None
    for tok in generate(model, [torch.tensor(r, device=dev) for r in rows], max_new_tokens, usable=usable,
                        temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy, generator=gen):
        if first is None:
            first = time.perf_counter()
        new[tok.row].append(tok.token)
        if on_token is not None:
            on_token(tok.row, tok.token)
    end = time.perf_counter()
    decoded = sum(len(n) for n in new) - len(rows)  # the tokens after each row's first
    timing = {"dtype": dtype, "prefill_s": (first or end) - start, "decode_s": end - (first or end),
              "tokens_per_s": decoded / (end - first) if first is not None and end > first and decoded > 0 else None}

    def row(ids: list[int], out: list[int], unprompted: bool) -> dict[str, Any]:
        r: dict[str, Any] = {"prompt_ids": ids, "ids": out}
        if codec is not None:
            r["prompt"] = "" if unprompted else codec.decode(ids)
            r["text"] = codec.decode(out)
        return r

    unprompted = texts is None and id_rows is None
    head = {"checkpoint": str(ckpt.path), "step": ckpt.step}
    if len(rows) == 1:
        return {**head, **row(rows[0], new[0], unprompted), **timing}
    return {**head, "rows": [row(r, n, unprompted) for r, n in zip(rows, new)], **timing}


def document_start(codec: TextCodec) -> list[int]:
    """The ids a text model starts a document from, when sampling without a prompt: the
    end-of-text token (subwords), else the blank line that separates documents (bytes, and
    characters when the text had newlines), else the first character."""
    if codec.mode == "bpe":
        from .tokenizer import eot_id

        return [eot_id(codec.tokenizer, "the checkpoint's tokenizer")]
    try:
        return codec.encode("\n\n")
    except ValueError:  # a character vocabulary without a newline
        return [0]
