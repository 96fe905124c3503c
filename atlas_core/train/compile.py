"""``[train] compile = true``: torch.compile's backend and cache, the first step's compile line
(graph breaks), torch.compile's own warnings silenced while training, and a compile failure turned
into one `CompileFailed` naming ``train.compile``.

Precision and compilation (``[train] precision``, ``compile``): ``"bf16"`` runs the training
forward pass under ``torch.autocast(dtype=torch.bfloat16)`` on the run's device; the weights, the
gradients and AdamW's state stay float32, the loss is computed in float32, and every memory rule
call runs with autocast off (`atlas_core.rule.Rule.forward`), so the memory's state and inner loop
stay float32. ``compile = true`` trains through ``torch.compile(model)`` (the same parameters;
checkpoints hold the plain model's weights); compiled code is cached where torch keeps it
(``$TORCHINDUCTOR_CACHE_DIR``, by default ``/tmp/torchinductor_<user>``), and the first step,
which pays the compilation, is timed on stderr and in ``metrics.jsonl``. Evaluations run the
plain model in float32 in both cases.
"""

from __future__ import annotations

import contextlib
import os

from .errors import CompileFailed

COMPILE_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
#: torch.compile's backend ("inductor": generated C++ / Triton code; the tests trace with "eager")
COMPILE_BACKEND = "inductor"


def compile_cache_dir() -> str:
    """Where torch.compile keeps compiled code: ``$TORCHINDUCTOR_CACHE_DIR`` when set, else
    torch's default (``/tmp/torchinductor_<user>``); later runs of the same model reuse it."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:  # an older torch: the variable, or its documented default
        return os.environ.get(COMPILE_CACHE_ENV) or "/tmp/torchinductor_<user>"
    return cache_dir()


def is_compile_error(exc: BaseException) -> bool:
    return any(t.__module__.startswith(("torch._dynamo", "torch._inductor"))
               for t in type(exc).__mro__)


def root_cause(exc: BaseException) -> BaseException:
    """The innermost error behind torch.compile's wrappers (``inner_exception``, ``__cause__``)."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "inner_exception", None) or exc.__cause__
        if inner is None:
            break
        exc = inner
    return exc


def compile_failed(exc: BaseException) -> CompileFailed:
    """The one error a failed compilation (of the first step) is reported as."""
    why = root_cause(exc)
    first = (str(why).strip().splitlines() or [""])[0][:300]
    return CompileFailed(f"train.compile: torch.compile failed on this model ({type(why).__name__}: "
                         f"{first}); set compile = false in [train] to train without it")


def graph_breaks() -> str:
    """How many graph breaks torch.compile made so far, for the compile line (its own warnings,
    many lines each, are silenced while training: `quiet_compile`)."""
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
def quiet_compile(enabled: bool):
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
