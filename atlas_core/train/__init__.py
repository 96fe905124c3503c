"""Training: on-the-fly tasks, the trainer and checkpoints.

========================  ==========================================================================
``params``                the ``[train]`` table (`TrainParams`), validated with the spec
``tasks``                 mqar, copy, selective_copy, sniah, text: seeded ``(inputs, targets)`` batches
``optim``                 AdamW groups, warm-up + cosine schedule, optimiser state as named tensors
``setup``                 command-line options -> a checked `Plan` (spec, overrides, resume, run dir)
``launch``                `prepare` (read the run directory once), `train`: check the inputs, then
                          run in 1 or N processes (spawn or torchrun)
``trainer``               the loop (`Trainer`): steps, evaluation, checkpoints, Ctrl-C
``step``                  one optimizer step: masked cross-entropy, backward, clipping
``timing``, ``report``    the steps' timing, the lines on stderr and the timing records
``progress``, ``compile`` the progress bar; torch.compile's backend, cache and failures
``evaluate``              the task of a model, loss / accuracy / perplexity over counted targets
``checkpoint``            atomic safetensors + JSON + TOML checkpoints, verified on load, no pickle
``checkpoint_meta``       a checkpoint's ``meta.json`` as a record (`CheckpointMeta`): progress, task
``run_dir``               the run directory's file operations: its lock, atomic writes, fsync
``data_parallel``         N processes over ``torch.distributed``: engines (DDP, FSDP2), spawning
``errors``                every error training raises
``metrics``               the JSONL log and the PNG curve
``inference``, ``codec``  ``atlas eval`` / ``atlas generate`` on a checkpoint
``compare``               several specs on one setting, one table (``atlas compare``)
========================  ==========================================================================

Calling the package trains: ``atlas_core.train(spec, **overrides)`` is `atlas_core.api.train`
(``atlas train`` runs it; `atlas_core.api.load` opens the result).

Nothing is imported here: ``import atlas_core.train`` stays cheap (no torch).
"""

import sys as _sys
import types as _types


class _CallableModule(_types.ModuleType):
    """``atlas_core.train(spec, **overrides)`` is `atlas_core.api.train`: this package and the
    function share the name, so calling the package calls the function."""

    def __call__(self, *args, **kwargs):
        from ..api import train

        return train(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallableModule
