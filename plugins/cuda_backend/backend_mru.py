"""``cuda:mru_scan``: the Triton backend of the MRU's matrix-product scan strategies.

Serves the ``mru:mru`` rule (``H_t = H_{t-1} X_t``; seed 002) for the scan strategies
``mru:brent_kung``, ``mru:sklansky`` and ``mru:hillis_steele``: all of them compute the same
exact prefix products, so one kernel (`mru_scan`, a chunked three-phase scan) serves them all.
The call's inputs are the rule's `MRUInputs` (``X: [B, H, T, d, d]``, ``h0: [B, H, d, d]`` or
None); `run` returns ``(H [B, H, T, d, d], {"H": H[:, :, -1]})`` as `MRURule.scan` does.
"""

from __future__ import annotations

import torch

from atlas_core.backends import Backend

from .availability import launch_errors, launch_fallback, tensors_runnable, triton_available

MAX_D = 64
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SCAN_CHUNK = 32  # tokens per program in the kernel's local phases


class MRUScanBackend(Backend):
    name = "cuda:mru_scan"

    def is_available(self) -> tuple[bool, str]:
        return triton_available()

    def verify(self, strategy, rule, inputs) -> tuple[bool, str]:
        try:
            from atlas_plugins.mru.rule import MRURule
        except Exception as exc:  # noqa: BLE001
            return False, f"the mru plugin is not importable ({type(exc).__name__})"
        if not isinstance(rule, MRURule):
            return False, "the kernel runs the mru:mru rule only"
        X, h0 = inputs.X, inputs.h0
        B, H, T, d = inputs.shape
        if T == 0:
            return False, "the sequence is empty"
        if d > MAX_D:
            return False, f"state size d={d} exceeds {MAX_D}"
        for t in (X,) if h0 is None else (X, h0):
            if t.dtype not in DTYPES:
                return False, f"dtype {t.dtype} is not supported (float32, bfloat16, float16)"
        return tensors_runnable(*((X,) if h0 is None else (X, h0)))

    def run(self, strategy, rule, inputs):
        try:
            return self._run(strategy, rule, inputs)
        except launch_errors() as exc:
            return launch_fallback(self.name, strategy, exc, lambda: rule.scan(inputs, strategy.algorithm))

    def _run(self, strategy, rule, inputs):
        from .mru_scan import mru_scan

        H = mru_scan(inputs.X, inputs.h0, chunk=SCAN_CHUNK)
        return H, {"H": H[:, :, -1]}


_INSTANCE = MRUScanBackend()


def build(params, ctx) -> MRUScanBackend:
    return _INSTANCE
