"""Distributed execution of memory rules: context parallelism (`context_parallel`), one sequence
split along time over several processes (see `atlas_core.distributed.context`)."""

from .context import MODES, affine_reason, context_parallel, mode_for

__all__ = ["MODES", "affine_reason", "context_parallel", "mode_for"]
