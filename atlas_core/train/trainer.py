"""The training loop: AdamW on a task's masked cross-entropy, evaluation, checkpoints, Ctrl-C.

One optimizer step ``s`` (0-based):

1. ``lr = lr_at(s)`` (warm-up, then cosine to ``min_lr``);
2. ``inputs, targets = task.batch(batch_size * grad_accum, data_generator)``: ``[B, T]`` each (the
   global batch; with N processes each keeps ``B / N`` rows, see `data_parallel`); with
   ``[train] pack = true``
   the task's `packed_batch` also says where documents begin and the rows run as packed
   documents (``cu_seqlens``, `atlas_core.varlen`), no target the first token of a document;
3. `step.optimizer_step`: the masked cross-entropy over the global count of targets, backward
   (``grad_accum`` micro-batches of ``batch_size`` rows, gradients accumulated, exchanged between
   processes after the last), clipping, ``AdamW.step()`` (bf16 autocast with ``precision = "bf16"``; ``compile = true``
   trains through ``torch.compile(model)``: `compile`).

Every ``log_every`` steps a ``train`` record goes to ``metrics.jsonl``; every ``eval_every`` steps
(and at the end) an ``eval`` record (`evaluate`, the plain model in float32); every
``checkpoint_every`` steps (and at the end) a checkpoint. At the end the curve is drawn
(``curve.png``) and the result returned.

Ctrl-C: the first SIGINT asks the loop to stop after the current step (all processes agree on
the step), a checkpoint of that step is saved and `TrainingInterrupted` raised; the CLI prints one
line and exits 130. A second Ctrl-C stops at once without saving (the last checkpoint stays).

Resume restores the weights, the optimiser state, the data generator and torch's global RNG, the
step and the token count, so N steps + resume + M steps equals N + M steps.

`Trainer.run` reads in the order it runs: `_open_run` (the run directory, its lock and log),
`_announce` (the start line), then per step `_batch`, `train_step` and `_after_step` (timing,
logging, evaluation and checkpoints at their intervals), then `_finish` (the final evaluation and
checkpoint, or the interrupt) and `_close` (the end marker, the curve, the summary line). The
entry points that check the inputs and launch one or N processes are in `launch`.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from .checkpoint import kill_hook_from_env, recover_checkpoints, save_checkpoint
from .compile import COMPILE_BACKEND, compile_failed, is_compile_error, quiet_compile
from . import data_parallel
from .data_parallel import SINGLE, DistInfo, any_rank, from_env, full_state
from .errors import TrainingDiverged, TrainingInterrupted
from .checkpoint_meta import CheckpointMeta, task_record
from .evaluate import build_task, evaluate, held_out, task_table
from .metrics import CURVE_FILE, METRICS_FILE, MetricsLog, end_line, plot_curves, read_metrics
from .optim import (
    build_optimizer, load_optimizer_tensors, lr_at, named_unique_parameters, optimizer_tensors,
    set_lr,
)
from .progress import is_terminal
from .report import RunReport
from .run_dir import claim_run_dir, write_text_atomic
from .setup import Plan
from .step import autocast_for, optimizer_step
from .task_files import fingerprints
from .threads import describe, plan_threads
from .timing import StepClock


class Trainer:
    """Runs a `Plan`. ``on_step(trainer)`` is called after every optimizer step (tests use it
    to stop a run where they want, through the same path as Ctrl-C: `request_stop`).
    ``checkpoint_hook(point)`` is passed to every save (`checkpoint.save_checkpoint`'s ``at``;
    default: the kill hook ``ATLAS_CHECKPOINT_KILL_AT`` asks for, `checkpoint.kill_hook_from_env`)."""

    def __init__(self, plan: Plan, dist: DistInfo = SINGLE,
                 on_step: Callable[["Trainer"], None] | None = None, progress: bool = True,
                 shard: str = "ddp", context_parallel: int = 1,
                 threads: tuple[int, str] | None = None,
                 checkpoint_hook: Callable[[str], None] | None = None) -> None:
        self.plan, self.dist, self.on_step = plan, dist, on_step
        #: (count, reason) chosen by the launcher for spawned workers; None: chosen in `run`
        self.threads = threads
        self.shard = shard  # the data-parallel engine with N processes: "ddp" or "fsdp"
        self.cp = context_parallel  # > 1: the processes split each sequence along time
        self.checkpoint_hook = checkpoint_hook if checkpoint_hook is not None else kill_hook_from_env()
        self.show_progress = progress and dist.is_main and is_terminal(sys.stderr)
        self.p = plan.train
        self.device = plan.device
        self.stop_requested = False
        self.step = 0
        self.tokens_seen = 0
        self.elapsed_before = 0.0
        self.last_eval: dict[str, Any] | None = None
        self._run_lock = None  # the run directory's lock (`claim_run_dir`), held by the main rank
        sinks = ()
        if dist.is_main and plan.train.tensorboard:
            from .tensorboard import TensorBoardSink

            sinks = (TensorBoardSink(plan.run_dir),)
        self.log = MetricsLog(plan.run_dir / METRICS_FILE, enabled=dist.is_main, sinks=sinks)
        self.report = RunReport(self.log, lines=dist.is_main)
        self.train_loss: float | None = None  # the last step's, for the evaluation lines
        self._setup()

    # -- construction -------------------------------------------------------------------------
    def _setup(self) -> None:
        from ..model import build_model

        p, spec = self.p, self.plan.spec
        model_vocab = int(spec.model.get("vocab_size", 0))
        self.task_table = task_table(p.task, model_vocab, p.seq_len)
        self.task = self.plan.task or build_task(p.task, model_vocab, p.seq_len)
        # the files it read, fingerprinted once: a checkpoint may name them again only if unchanged
        self.task_files = (fingerprints(self.task_table["use"], self.task_table)
                           if self.dist.is_main else {})
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
        self.no_sync = None  # N processes: the context of a micro-batch whose gradients wait
        if p.precision == "bf16":  # bf16 activations meet fp32 norm weights: torch's unfused path
            warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
        if p.compile:
            self.forward = torch.compile(self.model, backend=COMPILE_BACKEND)
        self.params = [q for _, q in named_unique_parameters(self.model)]
        self.optimizer = build_optimizer(self.model, p)
        self.data_gen = torch.Generator().manual_seed(p.seed)
        if self.plan.resume is not None:
            self._restore(self.plan.resume)
        self._engine()

    def _restore(self, ckpt) -> None:
        """Continue from a checkpoint: weights, optimiser state, RNGs, step, tokens, time. A
        checkpoint of weights alone (`atlas import` writes one: no optimiser state, no RNG
        state) starts the optimiser and the data from the run's seed."""
        ckpt.load_model(self.model)
        tensors, rest = ckpt.optimizer_state()
        if tensors or rest.get("param_groups"):
            load_optimizer_tensors(self.model, self.optimizer, tensors, rest)
        rng = ckpt.rng()
        if "rng/data" not in rng:
            self.step = ckpt.step
            return
        self.data_gen.set_state(rng["rng/data"])
        torch.set_rng_state(rng["rng/torch"])
        if self.device.startswith("cuda") and "rng/cuda.0" in rng:
            torch.cuda.set_rng_state(rng["rng/cuda.0"])
        self.step = ckpt.step
        self.tokens_seen = ckpt.meta.tokens_seen
        self.elapsed_before = ckpt.meta.elapsed_s
        self.last_eval = ckpt.meta.last_eval

    def _engine(self) -> None:
        """With N processes, the module a step calls (`data_parallel.engine`); FSDP replaces the
        parameters by their shards, so the optimiser is built again over them."""
        if not self.dist.active:
            return
        engine = data_parallel.engine(self.model, self.dist, self.shard, self.device, self.cp)
        self.forward = torch.compile(engine, backend=COMPILE_BACKEND) if self.p.compile else engine
        self.no_sync = data_parallel.no_sync(engine, self.model, self.shard, self.dist)
        if self.shard == "fsdp":
            self.params = [q for _, q in named_unique_parameters(self.model)]
            self.optimizer = build_optimizer(self.model, self.p)

    def balance_loss(self) -> torch.Tensor | None:
        """The routed experts' load-balancing term of the last forward (`atlas_core.moe`), or None."""
        from ..moe import take_balance_loss

        return take_balance_loss(self.model)

    @property
    def n_params(self) -> int:
        return sum(q.numel() for q in self.params)

    def request_stop(self) -> None:
        """Stop after the current step and save (what Ctrl-C does)."""
        self.stop_requested = True

    # -- one step -----------------------------------------------------------------------------
    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor,
                   starts: torch.Tensor | None = None) -> dict[str, float]:
        """One optimizer step on this rank's rows (`step.optimizer_step`: ``grad_accum``
        micro-batches, gradients exchanged between processes after the last); returns the
        global loss, accuracy and gradient norm."""
        self.model.train()
        return optimizer_step(self.forward, self.params, self.optimizer, inputs, targets, starts,
                              dist=self.dist, grad_clip=self.p.grad_clip,
                              autocast=autocast_for(self.p.precision, self.device),
                              micro_batches=self.p.grad_accum, no_sync=self.no_sync,
                              extra_loss=self.balance_loss)

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
            meta = CheckpointMeta(
                step=self.step, tokens_seen=self.tokens_seen, elapsed_s=self.elapsed(),
                world_size=self.dist.world,
                task=task_record(self.task, self.task_table, self.task_files),
                last_eval=self.last_eval)
            path = save_checkpoint(
                self.plan.run_dir, self.step, model=model, spec=self.plan.spec,
                optimizer_state=optimizer_tensors(self.model, optimizer),
                rng=self.rng_state(), meta=meta, keep=self.p.keep_checkpoints,
                at=self.checkpoint_hook,
            )
        if self.dist.active:
            torch.distributed.barrier()
        return path

    def elapsed(self) -> float:
        return self.elapsed_before + (time.perf_counter() - self._t0)

    # -- the run ------------------------------------------------------------------------------
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
        """Train up to ``steps``; the steps are in the module docstring."""
        p = self.p
        self._open_run()
        threads_before = torch.get_num_threads()
        count, why = self.threads or plan_threads(p.threads, processes=self.dist.world,
                                                  torchrun=from_env() is not None)
        torch.set_num_threads(count)
        self._t0 = time.perf_counter()
        clock = StepClock(self.step, p.batch_size * p.grad_accum * self.task.seq_len)
        previous = self._install_sigint()
        progress = self.report.bar(self.show_progress, p.steps, self.step)
        self._announce(describe(count, why, self.dist.world))
        try:
            with progress, quiet_compile(p.compile):
                while self.step < p.steps:
                    set_lr(self.optimizer, lr_at(self.step, p))
                    inputs, targets, starts = self._batch()
                    clock.start()
                    stats = self._guarded_step(inputs, targets, starts, clock.first_step)
                    self._after_step(stats, clock)
                    if any_rank(self.stop_requested, self.dist, self.device):
                        break
            final, path = self._finish()
        except BaseException:
            self.log.close()  # events written so far reach the disk
            raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
            torch.set_num_threads(threads_before)
        return self._close(final, path)

    def _open_run(self) -> None:
        """Rank 0: take the run directory (its lock, a recovered checkpoint, ``spec.toml``) and
        start or continue its log."""
        if not self.dist.is_main:
            return
        plan = self.plan
        # one writer per run directory; a new one is created with its spec.toml inside
        self._run_lock = claim_run_dir(plan.run_dir, plan.spec.to_toml())
        for path in recover_checkpoints(plan.run_dir / "checkpoints"):
            print(f"recovered {path}: a complete checkpoint that an interrupted save had left "
                  "under a temporary name", file=sys.stderr)
        if plan.resume is None:
            # A fresh run gets a directory with a metrics log only when that log belongs to
            # a run stopped before its first checkpoint (see `launch.train`): start it over.
            (plan.run_dir / METRICS_FILE).unlink(missing_ok=True)
        write_text_atomic(plan.run_dir / "spec.toml", plan.spec.to_toml())
        self.log.truncate_after(self.step)
        self.log.write({"kind": "run", "event": "resume" if plan.resume else "start",
                        "step": self.step, "world_size": self.dist.world,
                        "spec_hash": plan.spec.spec_hash})

    def _batch(self):
        """This rank's part of the next global batch on the device: ``(inputs, targets,
        starts)``, ``starts`` (where each packed document begins) None unless ``pack``. With
        ``grad_accum = N`` the step's N micro-batches are drawn as one batch of N x batch_size
        rows (the rows a batch that large would have), which the step splits."""
        p = self.p
        n = p.batch_size * p.grad_accum
        if p.pack:
            rows = self.task.packed_batch(n, self.data_gen)
        else:
            rows = (*self.task.batch(n, self.data_gen), None)
        return tuple(None if t is None else data_parallel.rank_part(self.dist, self.cp, t).to(
            self.device, non_blocking=True) for t in rows)

    def _guarded_step(self, inputs, targets, starts, first_step: int) -> dict[str, float]:
        """`train_step`, with a compile failure of the run's first step and a non-finite loss
        turned into one error each."""
        try:
            stats = self.train_step(inputs, targets, starts)
        except Exception as exc:
            if self.p.compile and self.step == first_step and is_compile_error(exc):
                raise compile_failed(exc) from exc
            raise
        if not math.isfinite(stats["loss"]):
            raise TrainingDiverged(
                f"the loss became {stats['loss']} at step {self.step + 1}; lower train.lr (now "
                f"{self.p.lr}) or raise train.warmup_steps; the last checkpoint is untouched")
        return stats

    def _after_step(self, stats: dict[str, float], clock: StepClock) -> None:
        """Count the step, then what falls due at it: the first step's timing or the run's
        estimate, the progress bar, a ``train`` record, an evaluation, a checkpoint, ``on_step``."""
        p = self.p
        self.step += 1
        self.tokens_seen += clock.tokens_per_step
        self.train_loss = stats["loss"]
        event, seconds = clock.done(self.step)
        if event == "first":  # warm-up, and compilation if asked
            self.report.first_step(self.step, seconds, p.compile)
        elif event == "estimate":
            self.report.estimate(self.step, self.elapsed(), seconds, p.steps - self.step,
                                 clock.tokens_per_step)
        tps = clock.tokens_per_s()
        self.report.progress.update(self.step, stats["loss"], tps)
        if self.step % p.log_every == 0 or self.step == p.steps:
            self.log.write({"kind": "train", "step": self.step, **stats,
                            "lr": lr_at(self.step - 1, p), "tokens_per_s": tps,
                            "elapsed_s": self.elapsed()})
            clock.reset_window()
        if p.eval_every and self.step % p.eval_every == 0 and self.step != p.steps:
            self.report.evaluated(self.step, p.steps, self.evaluate(), self.train_loss,
                                  self.elapsed())
        if p.checkpoint_every and self.step % p.checkpoint_every == 0:
            self.save()
        if self.on_step is not None:
            self.on_step(self)

    def _finish(self):
        """After the loop: stopped early, save and raise `TrainingInterrupted`; else the final
        evaluation and checkpoint, ``(metrics, path)``."""
        if self.step < self.p.steps:
            path = self.save()
            self.log.write({"kind": "run", "event": "interrupt", "step": self.step})
            raise TrainingInterrupted(self.step, path)
        final = self.evaluate()
        self.report.evaluated(self.step, self.p.steps, final, self.train_loss, self.elapsed())
        return final, self.save()

    def _close(self, final: dict[str, Any], path: Path | None) -> dict[str, Any]:
        """The run's result; rank 0 also writes the end marker, draws the curve, says the summary
        line and releases the run directory."""
        plan = self.plan
        result = {
            "name": plan.spec.name, "arch": plan.spec.arch, "spec_hash": plan.spec.spec_hash,
            "task": self.task.describe(), "steps": self.step, "eval_loss": final["loss"],
            "accuracy": final["accuracy"], "perplexity": final["perplexity"],
            "eval_tokens": final["tokens"], "params": self.n_params, "time_s": self.elapsed(),
            "tokens_per_s": self.tokens_seen / max(self.elapsed(), 1e-9),
            "world_size": self.dist.world, "rank": self.dist.rank, "device": self.device,
            "run_dir": str(plan.run_dir), "checkpoint": str(path) if path else None,
        }
        if not self.dist.is_main:
            return result
        self.log.write({"kind": "run", "event": "end", "step": self.step,
                        "accuracy": final["accuracy"], "eval_loss": final["loss"]})
        self.log.close()
        why = plot_curves(read_metrics(plan.run_dir / METRICS_FILE), plan.run_dir / CURVE_FILE,
                          f"{plan.spec.name}: {self.task.describe()}")
        result["curve"] = None if why else str(plan.run_dir / CURVE_FILE)
        if why:
            print(why, file=sys.stderr)
        self.report.say(end_line(result))
        if self._run_lock is not None:
            self._run_lock.release()
        return result

    def _announce(self, threads: str) -> None:
        """The start line: run directory, parameters, device and how N processes share the
        work, precision, threads, steps, and the memory's strategy."""
        from ..strategies.trust import parallel_note

        mode = ""
        if self.dist.active:
            mode = (f"context parallel: each sequence split in {self.cp}" if self.cp > 1
                    else f"data parallel, {self.shard}")
        self.report.start(self.plan.run_dir, self.n_params, self.device, self.step, self.p,
                          self.task.seq_len, self.dist.world, mode, threads,
                          parallel_note(self.plan.spec.memory.get("parallel")))
