"""The training loop: AdamW on a task's masked cross-entropy, evaluation, checkpoints, Ctrl-C.

One optimizer step ``s`` (0-based):

1. ``lr = lr_at(s)`` (warm-up, then cosine to ``min_lr``);
2. ``inputs, targets = task.batch(batch_size, data_generator)``: ``[B, T]`` each (the global batch;
   with N processes each keeps ``B / N`` rows, see `distributed`); with ``[train] pack = true``
   the task's `packed_batch` also says where documents begin and the rows run as packed
   documents (``cu_seqlens``, `atlas_core.varlen`), no target the first token of a document;
3. ``loss = sum CE(logits, targets) / (global count of targets != -100)``; backward; gradients
   summed over processes; global-norm clipping at ``grad_clip``; ``AdamW.step()``.

Every ``log_every`` steps a ``train`` record goes to ``metrics.jsonl``; every ``eval_every`` steps
(and at the end) an ``eval`` record (`evaluate`); every ``checkpoint_every`` steps (and at the end)
a checkpoint. At the end the curve is drawn (``curve.png``) and the result returned.

Precision and compilation (``[train] precision``, ``compile``): ``"bf16"`` runs the training
forward pass under ``torch.autocast(dtype=torch.bfloat16)`` on the run's device; the weights, the
gradients and AdamW's state stay float32, the loss is computed in float32, and every memory rule
call runs with autocast off (`atlas_core.rule.Rule.forward`), so the memory's state and inner loop
stay float32. ``compile = true`` trains through ``torch.compile(model)`` (the same parameters;
checkpoints hold the plain model's weights); compiled code is cached where torch keeps it
(``$TORCHINDUCTOR_CACHE_DIR``, by default ``/tmp/torchinductor_<user>``), and the first step, which pays the compilation, is timed on stderr and in ``metrics.jsonl``. Evaluations run the
plain model in float32 in both cases.

What a person reads on stderr (rank 0; the same lines whether or not stderr is a terminal, the
progress bar only on a terminal): one start line (run directory, parameters, device, steps), a
warning when the run is projected to take over half an hour (estimated from the first steps),
one line per evaluation, and one summary line (see `metrics`).

Ctrl-C: the first SIGINT asks the loop to stop after the current step (all processes agree on
the step), a checkpoint of that step is saved and `TrainingInterrupted` raised; the CLI prints one
line and exits 130. A second Ctrl-C stops at once without saving (the last checkpoint stays).

Resume restores the weights, the optimiser state, the data generator and torch's global RNG, the
step and the token count, so N steps + resume + M steps equals N + M steps.

A killed run (SIGKILL, power loss, even in the middle of a save) is continued with ``--resume``:
before writing, the trainer adopts a complete checkpoint that a killed save left under a
temporary name and deletes the rest (`checkpoint.recover_checkpoints`). A run stopped before its
first checkpoint has nothing to resume: `train` starts it again from step 0 in the same directory
(``--resume DIR``, with the run's saved ``spec.toml`` unless a SPEC is given, or a fresh run with
``--out DIR``) and says so in one line on stderr.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..errors import AtlasError
from .checkpoint import latest_checkpoint, recover_checkpoints, save_checkpoint
from .run_dir import LOCK_FILE, claim_run_dir, write_text_atomic
from .distributed import (
    SINGLE, DistInfo, all_reduce_sum, any_rank, from_env, full_state, full_value, shard,
    wrap,
)
from .evaluate import build_task, evaluate, held_out, task_meta, task_table
from .metrics import (
    CURVE_FILE, LONG_RUN_S, METRICS_FILE, MetricsLog, duration, end_line, estimate_line, eval_line,
    plot_curves, read_metrics, start_line,
)
from .optim import (
    build_optimizer, load_optimizer_tensors, lr_at, named_unique_parameters, optimizer_tensors,
    set_lr,
)
from .setup import Plan, RunComplete, TrainOptions
from .tasks import IGNORE_INDEX
from .threads import describe, plan_threads


class TrainingInterrupted(AtlasError):
    """The run was stopped by Ctrl-C after saving a checkpoint of ``step``."""

    def __init__(self, step: int, checkpoint: str | Path | None):
        self.step, self.checkpoint = step, checkpoint
        where = f"checkpoint saved to {checkpoint}" if checkpoint else "no checkpoint saved"
        resume = f"; continue with: atlas train --resume {checkpoint}" if checkpoint else ""
        super().__init__(f"interrupted at step {step}; {where}{resume}")


class TrainingDiverged(AtlasError, ValueError):
    """The loss became nan or inf."""


class CompileFailed(AtlasError, RuntimeError):
    """torch.compile could not compile the model."""


COMPILE_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
#: torch.compile's backend ("inductor": generated C++ / Triton code; the tests trace with "eager")
COMPILE_BACKEND = "inductor"
ESTIMATE_AFTER_STEPS = 3  # steps after the first that the duration estimate waits for ...
ESTIMATE_AFTER_S = 20.0  # ... or this many seconds, whichever comes first


def compile_cache_dir() -> str:
    """Where torch.compile keeps compiled code: ``$TORCHINDUCTOR_CACHE_DIR`` when set, else
    torch's default (``/tmp/torchinductor_<user>``); later runs of the same model reuse it."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:  # an older torch: the variable, or its documented default
        return os.environ.get(COMPILE_CACHE_ENV) or "/tmp/torchinductor_<user>"
    return cache_dir()


def _is_compile_error(exc: BaseException) -> bool:
    return any(t.__module__.startswith(("torch._dynamo", "torch._inductor"))
               for t in type(exc).__mro__)


def _root_cause(exc: BaseException) -> BaseException:
    """The innermost error behind torch.compile's wrappers (``inner_exception``, ``__cause__``)."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "inner_exception", None) or exc.__cause__
        if inner is None:
            break
        exc = inner
    return exc


def _graph_breaks() -> str:
    """How many graph breaks torch.compile made so far, for the compile line (its own warnings,
    many lines each, are silenced while training: `_quiet_compile`)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return ""
    reasons = counters.get("graph_break", {})
    count = sum(reasons.values())
    if not count:
        return ", no graph break"
    first = (str(next(iter(reasons))).strip().splitlines() or [""])[0][:120]
    return (f", {count} graph break{'s' if count != 1 else ''} (first: {first}; "
            "TORCH_LOGS=graph_breaks prints them)")


@contextlib.contextmanager
def _quiet_compile(enabled: bool):
    """torch.compile's warnings (graph breaks, recompilations) off while ``enabled``: the
    compile line summarises them."""
    import logging

    loggers = [logging.getLogger(n) for n in ("torch._dynamo", "torch._inductor")] if enabled else []
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Trainer:
    """Runs a `Plan`. ``on_step(trainer)`` is called after every optimizer step (tests use it
    to stop a run where they want, through the same path as Ctrl-C: `request_stop`)."""

    def __init__(self, plan: Plan, dist: DistInfo = SINGLE,
                 on_step: Callable[["Trainer"], None] | None = None, progress: bool = True,
                 shard: str = "ddp", context_parallel: int = 1,
                 threads: tuple[int, str] | None = None) -> None:
        self.plan, self.dist, self.on_step = plan, dist, on_step
        #: (count, reason) chosen by the launcher for spawned workers; None: chosen in `run`
        self.threads = threads
        self.shard = shard  # the data-parallel engine with N processes: "ddp" or "fsdp"
        self.cp = context_parallel  # > 1: the processes split each sequence along time
        self.show_progress = progress and dist.is_main and _is_terminal(sys.stderr)
        self.show_lines = dist.is_main
        self.p = plan.train
        self.device = plan.device
        self.stop_requested = False
        self.step = 0
        self.tokens_seen = 0
        self.elapsed_before = 0.0
        self.last_eval: dict[str, Any] | None = None
        self.checkpoint_path: Path | None = None
        self._run_lock = None  # the run directory's lock (`claim_run_dir`), held by the main rank
        sinks = ()
        if dist.is_main and plan.train.tensorboard:
            from .tensorboard import TensorBoardSink

            sinks = (TensorBoardSink(plan.run_dir),)
        self.log = MetricsLog(plan.run_dir / METRICS_FILE, enabled=dist.is_main, sinks=sinks)
        self._setup()

    # -- construction -------------------------------------------------------------------------
    def _setup(self) -> None:
        from ..model import build_model

        p, spec = self.p, self.plan.spec
        model_vocab = int(spec.model.get("vocab_size", 0))
        self.task_table = task_table(p.task, model_vocab, p.seq_len)
        self.task = self.plan.task or build_task(p.task, model_vocab, p.seq_len)
        if p.pack and (not self.task.packs_documents or self.cp > 1):
            from ..errors import Issue, SpecError

            why = (f"task {self.task.name!r} has no documents to pack (the text task has)"
                   if self.cp == 1 else "context parallelism splits rows along time, which packed "
                   "documents do not support")
            raise SpecError([Issue("train.pack", why, True, "set pack = false")])
        self.eval_task = held_out(self.task)
        torch.manual_seed(p.seed)  # the model's initial weights
        self.model = build_model(spec).to(self.device)
        self.forward = self.model  # what a training step calls (torch.compile's wrapper or the model)
        if p.precision == "bf16":  # bf16 activations meet fp32 norm weights: torch's unfused path
            warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
        if p.compile:
            self.forward = torch.compile(self.model, backend=COMPILE_BACKEND)
        self.params = [q for _, q in named_unique_parameters(self.model)]
        self.optimizer = build_optimizer(self.model, p)
        self.data_gen = torch.Generator().manual_seed(p.seed)
        ckpt = self.plan.resume
        if ckpt is not None:
            ckpt.load_model(self.model)
            tensors, rest = ckpt.optimizer_state()
            load_optimizer_tensors(self.model, self.optimizer, tensors, rest)
            rng = ckpt.rng()
            self.data_gen.set_state(rng["rng/data"])
            torch.set_rng_state(rng["rng/torch"])
            if self.device.startswith("cuda") and "rng/cuda.0" in rng:
                torch.cuda.set_rng_state(rng["rng/cuda.0"])
            self.step = ckpt.step
            self.tokens_seen = int(ckpt.meta.get("tokens_seen", 0))
            self.elapsed_before = float(ckpt.meta.get("elapsed_s", 0.0))
            self.last_eval = ckpt.meta.get("last_eval")
        self._engine(ckpt)

    def _engine(self, ckpt) -> None:
        """With N processes, the engine around the model (`distributed.wrap`: DDP or FSDP2).
        FSDP replaces the parameters by their shards, so the optimiser is built again over them
        (FSDP starts runs only: `distributed.check_launch`)."""
        if not self.dist.active:
            return
        if self.cp > 1:  # atlas_core.distributed.lm: memory layers run across the ranks
            from ..distributed.lm import enable

            enable(self.model, torch.distributed.new_group(list(range(self.dist.world))))
        engine = wrap(self.model, self.dist, self.shard, self.device)
        self.forward = (torch.compile(engine, backend=COMPILE_BACKEND) if self.p.compile
                        else engine)
        if self.shard == "fsdp":
            self.params = [q for _, q in named_unique_parameters(self.model)]
            self.optimizer = build_optimizer(self.model, self.p)

    def _part(self, rows: torch.Tensor) -> torch.Tensor:
        """This rank's part of a global batch: its rows, or its time slice (context parallel)."""
        if self.cp > 1:
            from ..distributed.lm import time_slice

            return time_slice(rows, self.dist.rank, self.dist.world)
        return shard(rows, self.dist)

    @property
    def n_params(self) -> int:
        return sum(q.numel() for q in self.params)

    def request_stop(self) -> None:
        """Stop after the current step and save (what Ctrl-C does)."""
        self.stop_requested = True

    # -- one step -----------------------------------------------------------------------------
    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor,
                   starts: torch.Tensor | None = None) -> dict[str, float]:
        """One optimizer step on this rank's rows; returns global loss / accuracy / grad norm.
        ``starts`` (``[train] pack``): where documents begin in each row; the rows then run as
        one packed row with ``cu_seqlens`` (`atlas_core.varlen`), each document as if alone."""
        self.model.train()
        with self.autocast():
            if starts is None:
                logits = self.forward(inputs)
            else:
                from ..varlen import pack_rows

                row, cu = pack_rows(inputs, starts)
                logits = self.forward(row, cu_seqlens=cu).reshape(*inputs.shape, -1)
        logits = logits.float()  # [b, T, V]
        keep = targets != IGNORE_INDEX
        ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                             ignore_index=IGNORE_INDEX, reduction="sum")
        hits = ((logits.detach().argmax(-1) == targets) & keep).sum()
        counts = all_reduce_sum(torch.stack([keep.sum(), hits]).double(), self.dist)
        total = counts[0].clamp_min(1.0)
        loss = ce / total.to(ce.dtype)
        self.optimizer.zero_grad(set_to_none=True)
        # DDP and FSDP average the gradients over ranks: N times the loss makes that the sum
        (loss * self.dist.world if self.dist.active else loss).backward()
        clip = self.p.grad_clip if self.p.grad_clip > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, clip)
        self.optimizer.step()
        report = all_reduce_sum(loss.detach().double().reshape(1), self.dist)
        return {"loss": float(report.item()), "accuracy": float(counts[1] / total),
                "grad_norm": float(full_value(grad_norm))}

    def autocast(self):
        """The context of a training forward pass: bf16 autocast, or nothing (fp32)."""
        if self.p.precision != "bf16":
            return contextlib.nullcontext()
        return torch.autocast(self.device.split(":")[0], dtype=torch.bfloat16)

    # -- checkpoints --------------------------------------------------------------------------
    def rng_state(self) -> dict[str, torch.Tensor]:
        rng = {"rng/data": self.data_gen.get_state(), "rng/torch": torch.get_rng_state()}
        if self.device.startswith("cuda"):
            rng["rng/cuda.0"] = torch.cuda.get_rng_state()
        return rng

    def save(self) -> Path | None:
        """Checkpoint the current step (rank 0 writes; the others wait)."""
        path = None
        # FSDP: every rank takes part in gathering the full state that rank 0 writes
        model, optimizer = full_state(self.model, self.optimizer, self.shard, self.dist)
        if self.dist.is_main:
            meta = {
                "step": self.step,
                "tokens_seen": self.tokens_seen,
                "elapsed_s": self.elapsed(),
                "world_size": self.dist.world,
                "task": task_meta(self.task, self.task_table),
                "last_eval": self.last_eval,
            }
            path = save_checkpoint(
                self.plan.run_dir, self.step, model=model, spec=self.plan.spec,
                optimizer_state=optimizer_tensors(self.model, optimizer),
                rng=self.rng_state(), meta=meta, keep=self.p.keep_checkpoints,
            )
            self.checkpoint_path = path
        if self.dist.active:
            torch.distributed.barrier()
        return path

    def elapsed(self) -> float:
        return self.elapsed_before + (time.perf_counter() - self._t0)

    # -- the loop -----------------------------------------------------------------------------
    def evaluate(self) -> dict[str, Any]:
        whole = contextlib.nullcontext()
        if self.cp > 1:  # every rank evaluates whole sequences, the model unsplit
            from ..distributed.lm import off

            whole = off(self.model)
        with whole:
            result = evaluate(self.model, self.eval_task, batches=self.p.eval_batches,
                              batch_size=self.p.batch_size, seed=self.p.seed, device=self.device,
                              dist=SINGLE if self.cp > 1 else self.dist)
        self.last_eval = {"step": self.step, **result}
        self.log.write({"kind": "eval", **self.last_eval})
        return result

    def _install_sigint(self):
        if threading.current_thread() is not threading.main_thread():
            return None

        def handler(signum, frame):
            if self.stop_requested:  # the second Ctrl-C: stop now, without saving
                raise KeyboardInterrupt
            self.stop_requested = True

        return signal.signal(signal.SIGINT, handler)

    def run(self) -> dict[str, Any]:
        p, plan = self.p, self.plan
        if self.dist.is_main:
            # one writer per run directory; a new one is created with its spec.toml inside
            self._run_lock = claim_run_dir(plan.run_dir, plan.spec.to_toml())
            for path in recover_checkpoints(plan.run_dir / "checkpoints"):
                print(f"recovered {path}: a complete checkpoint that an interrupted save had left "
                      "under a temporary name", file=sys.stderr)
            if plan.resume is None:
                # A fresh run gets a directory with a metrics log only when that log belongs to
                # a run stopped before its first checkpoint (see `train`): start the log over.
                (plan.run_dir / METRICS_FILE).unlink(missing_ok=True)
            write_text_atomic(plan.run_dir / "spec.toml", plan.spec.to_toml())
            self.log.truncate_after(self.step)
            self.log.write({"kind": "run", "event": "resume" if plan.resume else "start",
                            "step": self.step, "world_size": self.dist.world,
                            "spec_hash": plan.spec.spec_hash})
        threads_before = torch.get_num_threads()
        count, why = self.threads or plan_threads(p.threads, processes=self.dist.world,
                                                  torchrun=from_env() is not None)
        torch.set_num_threads(count)
        self._t0 = time.perf_counter()
        tokens_per_step = p.batch_size * self.task.seq_len
        previous = self._install_sigint()
        progress = _Progress(self.show_progress, p.steps, self.step)
        self._progress = progress
        from ..strategies.trust import parallel_note

        note = parallel_note(plan.spec.memory.get("parallel"))  # the strategy and its distribution
        self.say(start_line(plan.run_dir, self.n_params, self.device, self.step, p.steps,
                            p.batch_size, self.task.seq_len, p.precision, p.compile,
                            processes=self.dist.world, mode=self._mode(),
                            threads=describe(count, why, self.dist.world))
                 + (f"; {note}" if note else ""))
        window_t, window_tokens = time.perf_counter(), 0
        first_step, first_done, estimated, train_loss = self.step, None, False, None
        try:
            with progress, _quiet_compile(p.compile):
                while self.step < p.steps:
                    set_lr(self.optimizer, lr_at(self.step, p))
                    if p.pack:  # packed documents: where each begins in a row
                        inputs, targets, starts = self.task.packed_batch(p.batch_size, self.data_gen)
                        starts = self._part(starts).to(self.device, non_blocking=True)
                    else:
                        inputs, targets = self.task.batch(p.batch_size, self.data_gen)
                        starts = None
                    inputs = self._part(inputs).to(self.device, non_blocking=True)
                    targets = self._part(targets).to(self.device, non_blocking=True)
                    t_step = time.perf_counter()
                    try:
                        stats = self.train_step(inputs, targets, starts)
                    except Exception as exc:
                        if p.compile and self.step == first_step and _is_compile_error(exc):
                            why = _root_cause(exc)
                            first = (str(why).strip().splitlines() or [""])[0][:300]
                            raise CompileFailed(
                                f"train.compile: torch.compile failed on this model "
                                f"({type(why).__name__}: {first}); set compile = false in "
                                "[train] to train without it"
                            ) from exc
                        raise
                    train_loss = stats["loss"]
                    if not math.isfinite(stats["loss"]):
                        raise TrainingDiverged(
                            f"the loss became {stats['loss']} at step {self.step + 1}; lower "
                            f"train.lr (now {p.lr}) or raise train.warmup_steps; the last "
                            "checkpoint is untouched"
                        )
                    self.step += 1
                    self.tokens_seen += tokens_per_step
                    window_tokens += tokens_per_step
                    now = time.perf_counter()
                    if first_done is None:  # the first step: warm-up, and compilation if asked
                        first_done = now
                        self._first_step(now - t_step)
                    elif not estimated and (self.step - first_step - 1 >= ESTIMATE_AFTER_STEPS
                                            or now - first_done >= ESTIMATE_AFTER_S):
                        estimated = True
                        self._estimate((now - first_done) / (self.step - first_step - 1),
                                       p.steps - self.step, tokens_per_step)
                    tps = window_tokens / max(now - window_t, 1e-9)
                    progress.update(self.step, stats["loss"], tps)
                    if self.step % p.log_every == 0 or self.step == p.steps:
                        self.log.write({"kind": "train", "step": self.step, **stats,
                                        "lr": lr_at(self.step - 1, p), "tokens_per_s": tps,
                                        "elapsed_s": self.elapsed()})
                        window_t, window_tokens = now, 0
                    if p.eval_every and self.step % p.eval_every == 0 and self.step != p.steps:
                        r = self.evaluate()
                        self.say(eval_line(self.step, p.steps, r, train_loss, self.elapsed()))
                    if p.checkpoint_every and self.step % p.checkpoint_every == 0:
                        self.save()
                    if self.on_step is not None:
                        self.on_step(self)
                    if any_rank(self.stop_requested, self.dist, self.device):
                        break
            if self.step < p.steps:  # stopped early: save and say so
                path = self.save()
                self.log.write({"kind": "run", "event": "interrupt", "step": self.step})
                raise TrainingInterrupted(self.step, path)
            final = self.evaluate()
            self.say(eval_line(self.step, p.steps, final, train_loss, self.elapsed()))
            path = self.save()
        except BaseException:
            self.log.close()  # events written so far reach the disk
            raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            torch.set_num_threads(threads_before)
        result = {
            "name": plan.spec.name,
            "arch": plan.spec.arch,
            "spec_hash": plan.spec.spec_hash,
            "task": self.task.describe(),
            "steps": self.step,
            "eval_loss": final["loss"],
            "accuracy": final["accuracy"],
            "perplexity": final["perplexity"],
            "eval_tokens": final["tokens"],
            "params": self.n_params,
            "time_s": self.elapsed(),
            "tokens_per_s": self.tokens_seen / max(self.elapsed(), 1e-9),
            "world_size": self.dist.world,
            "rank": self.dist.rank,
            "device": self.device,
            "run_dir": str(plan.run_dir),
            "checkpoint": str(path) if path else None,
        }
        if self.dist.is_main:
            self.log.write({"kind": "run", "event": "end", "step": self.step,
                            "accuracy": final["accuracy"], "eval_loss": final["loss"]})
            self.log.close()
            why = plot_curves(read_metrics(plan.run_dir / METRICS_FILE), plan.run_dir / CURVE_FILE,
                              f"{plan.spec.name}: {self.task.describe()}")
            result["curve"] = None if why else str(plan.run_dir / CURVE_FILE)
            if why:
                print(why, file=sys.stderr)
            self.say(end_line(result))
            if self._run_lock is not None:
                self._run_lock.release()
        return result

    # -- what a person reads on stderr --------------------------------------------------------
    def _mode(self) -> str:
        """How N processes share the work, for the start line ("" for one process)."""
        if not self.dist.active:
            return ""
        if self.cp > 1:
            return f"context parallel: each sequence split in {self.cp}"
        return f"data parallel, {self.shard}"

    def say(self, line: str) -> None:
        """One line on stderr (rank 0), through the progress bar when one is shown."""
        if not self.show_lines:
            return
        progress = getattr(self, "_progress", None)
        if progress is not None and progress.bar is not None and progress.bar.live.is_started:
            progress.note(line)
        else:
            print(line, file=sys.stderr, flush=True)

    def _first_step(self, seconds: float) -> None:
        self.log.write({"kind": "timing", "event": "first_step", "step": self.step,
                        "seconds": seconds, "compiled": self.p.compile})
        if self.p.compile:
            self.say(f"compile: the first step took {duration(seconds)} ({seconds:.1f} s), "
                     f"compiling the model{_graph_breaks()}; compiled code is cached in "
                     f"{compile_cache_dir()}")

    def _estimate(self, seconds_per_step: float, remaining: int, tokens_per_step: int) -> None:
        projected = self.elapsed() + remaining * seconds_per_step
        self.log.write({"kind": "timing", "event": "estimate", "step": self.step,
                        "projected_s": projected, "seconds_per_step": seconds_per_step})
        if projected > LONG_RUN_S:
            self.say(estimate_line(projected, seconds_per_step,
                                   tokens_per_step / max(seconds_per_step, 1e-9), remaining))


class _Progress:
    """A rich progress bar on stderr (step, loss, tokens/s, ETA), or nothing."""

    def __init__(self, enabled: bool, total: int, start: int) -> None:
        self.enabled = enabled
        self.bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn("step"), MofNCompleteColumn(), BarColumn(),
                TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                console=Console(file=sys.stderr), transient=False,
            )
            self.task = self.bar.add_task("train", total=total, completed=start, loss="-", tps="-")

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def update(self, step: int, loss: float, tps: float) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=step, loss=f"{loss:.4f}", tps=f"{tps:,.0f}")

    def note(self, line: str) -> None:
        if self.bar is not None:
            self.bar.console.print(line, markup=False, highlight=False, soft_wrap=True)


# -- entry points ---------------------------------------------------------------------------------
def run_plan(opts, dist: DistInfo = SINGLE) -> dict[str, Any]:
    """Plan and train (the function each spawned process runs)."""
    from .setup import make_plan

    plan = make_plan(opts, world=dist.world // opts.context_parallel)
    return Trainer(plan, dist, progress=opts.progress, shard=opts.shard,
                   context_parallel=opts.context_parallel, threads=opts.threads).run()


def _unsaved_run(d: Path, resuming: bool = False) -> bool:
    """Whether ``d`` holds a run stopped before its first checkpoint: a metrics log without the
    end marker, and no complete checkpoint (counting those a killed save left under temporary
    names, which a resume adopts). ``resuming`` (``--resume d``): a run killed after it locked the
    directory (``run.lock``) but before its first log line counts too."""
    log = d / METRICS_FILE
    if latest_checkpoint(d / "checkpoints") is not None:
        return False
    if not log.is_file():
        return resuming and (d / LOCK_FILE).is_file()
    return not any(r.get("kind") == "run" and r.get("event") == "end" for r in read_metrics(log))


def restart_unsaved(opts: TrainOptions) -> tuple[TrainOptions, str | None]:
    """The options that start again a run stopped before its first checkpoint, and the line
    that says so; ``(opts, None)`` when ``--resume`` / ``--out`` name no such run.

    ``--resume DIR`` restarts it from step 0 in DIR with the run's ``spec.toml`` (or SPEC):
    with nothing saved, step 0 is where the run is, and the same spec and seed redo it exactly.
    ``--out DIR`` for a fresh run may reuse DIR (only a complete checkpoint or a finished run
    makes a directory hold a run). Everything else is left to `make_plan`'s checks."""
    if opts.run_dir_checked:
        return opts, None
    note = None
    if opts.resume:
        d = Path(opts.resume).expanduser()
        if d.name == "checkpoints" and not (d / METRICS_FILE).exists():
            d = d.parent
        if not (_unsaved_run(d, resuming=True) and ((d / "spec.toml").is_file() or opts.spec)):
            return opts, None
        note = (f"{d} holds no checkpoint (the run stopped before its first one): starting it "
                "again from step 0")
        spec = opts.spec
        if spec is None:  # the run's own spec may not choose the local files it reads either
            from ..spec import load_spec
            from .setup import _refuse_stored_files

            path = str(d / "spec.toml")
            spec = load_spec(path)  # resolved once, here: the plan uses it as it is
            _refuse_stored_files(spec, path, str(d))
        opts = dataclasses.replace(opts, resume=None, spec=spec)
        if opts.out is None or Path(opts.out).expanduser().resolve() == d.resolve():
            return dataclasses.replace(opts, out=str(d), run_dir_checked=True), note
    if opts.out and _unsaved_run(Path(opts.out).expanduser()):
        note = note or (f"--out {opts.out} held a run stopped before its first checkpoint: "
                        "starting the new run there")
        return dataclasses.replace(opts, run_dir_checked=True), note
    return opts, note


def train(opts, nproc: int = 1, on_step: Callable[[Trainer], None] | None = None) -> dict[str, Any]:
    """Train as ``atlas train`` does: check everything, then run in 1 or ``nproc`` processes.

    Under ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) this process is one rank.
    ``--resume`` of a run that already finished its steps trains nothing: one line on stderr
    says the run is complete, and its result is returned (`setup.RunComplete`)."""
    try:
        return _train(opts, nproc, on_step)
    except RunComplete as done:
        env = from_env()
        done.result["rank"] = env.rank if env is not None else 0
        if done.result["rank"] == 0:
            print(done.line, file=sys.stderr)
        return done.result


def _train(opts, nproc: int, on_step: Callable[[Trainer], None] | None) -> dict[str, Any]:
    from . import distributed
    from .setup import make_plan, worker_options

    env = distributed.from_env()
    opts, note = restart_unsaved(opts)
    if env is not None:
        # Every rank checks the inputs before the rendezvous (init returns only when all ranks
        # have joined, so no rank can see a directory that rank 0 already started writing);
        # then all ranks take rank 0's choice of run directory.
        distributed.check_launch(opts.shard, opts.context_parallel, env.world, opts.resume)
        plan = make_plan(opts, world=env.world // opts.context_parallel)
        distributed.check_context_model(plan, opts.context_parallel)
        if note and env.is_main:
            print(note, file=sys.stderr)
        distributed.init(env, plan.device)
        clean = False  # every rank reaches the end together only on a normal or interrupted exit
        try:
            chosen = [str(plan.run_dir)]
            torch.distributed.broadcast_object_list(chosen, src=0)
            plan.run_dir = Path(chosen[0])
            result = Trainer(plan, env, on_step, progress=opts.progress, shard=opts.shard,
                             context_parallel=opts.context_parallel).run()
            clean = True
            return result
        except TrainingInterrupted:
            clean = True
            raise
        finally:
            distributed.shutdown(clean)
    if nproc < 1:
        raise ValueError(f"--nproc {nproc} must be >= 1")
    if opts.context_parallel > 1 and nproc == 1:  # one process per slice of each sequence
        nproc = opts.context_parallel
    distributed.check_launch(opts.shard, opts.context_parallel, nproc, opts.resume)
    plan = make_plan(opts, world=nproc // opts.context_parallel)  # every input error surfaces here
    distributed.check_context_model(plan, opts.context_parallel)
    if note:
        print(note, file=sys.stderr)
    if nproc == 1:
        return Trainer(plan, SINGLE, on_step, progress=opts.progress).run()
    if plan.device.startswith("cuda") and torch.cuda.device_count() < nproc:
        raise ValueError(
            f"--nproc {nproc} on CUDA needs {nproc} GPUs (one per process), this machine has "
            f"{torch.cuda.device_count()}; lower --nproc or use --device cpu"
        )
    if on_step is not None:
        raise ValueError("on_step callbacks run in one process only (nproc=1)")
    # one choice of threads for all the workers, made before they start (and load the machine)
    chosen = plan_threads(plan.train.threads, processes=nproc)
    return distributed.spawn(run_plan, dataclasses.replace(worker_options(opts, plan), threads=chosen),
                             nproc, plan.device, threads=chosen[0])
