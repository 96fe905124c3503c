"""``core:exact_chunk``: the per-token delta rule, exact for any chunk size (WY / UT transform).

Runs gd or momentum (Titans) on a linear memory with the l2 bias, or with an Omega window of c
tokens around it, under scalar-decay retention (``core:decay`` / ``core:none``), read "after" or
"before" (`atlas_core.forms.exact_chunk`, which writes out the math and its cost); per-key decay
(GLA, KDA) and the dot bias with gd and a one-token window (`atlas_core.forms.key_decay_chunk`).
The result equals ``core:sequential`` up to rounding for every chunk size C.

What it accepts is read from the rule's form (``"exact_chunk"`` or ``"key_decay_chunk"`` in
``rule.form.chunk_forms``, anchor 1); `supports` names the first reason it refuses: other
algorithms, biases other than l2 and dot (lp / huber), the dot bias or per-key decay with momentum
or a window, nonlinear retention, other structures (deep memory), anchored rules (``anchor > 1``:
run by ``core:chunkwise``).
"""

from __future__ import annotations

from ..forms.exact_chunk import run_exact
from ..forms.key_decay_chunk import run_key_decay
from ..host.registry import Params
from ..params import size_field
from .base import Strategy


class ExactChunkParams(Params):
    chunk_size: int = size_field(32, "chunk", ge=1, description="tokens per chunk (C); the result is exact for any C (16 to 32 is "
        "fastest on a CPU at head size 64: docs/benchmarks.md)")


class ExactChunk(Strategy):
    name = "core:exact_chunk"
    #: a registered kernel backend of this strategy runs a call its verifier accepts (e.g. fla's
    #: chunk kernels on a GPU, once certified: docs/kernels.md); ``ATLAS_BACKEND`` forces one
    uses_backends = True

    def __init__(self, params: ExactChunkParams | None = None) -> None:
        self.params = params or ExactChunkParams()
        self.chunk_size = self.params.chunk_size

    def describe(self) -> str:
        return f"{self.name}(chunk_size={self.chunk_size})"

    def chunk_for(self, rule) -> int:
        return self.chunk_size

    def supports(self, rule) -> tuple[bool, str]:
        f = rule.form  # decided once when the rule was built (atlas_core.forms.RuleForm)
        if not f.composed:
            return False, "core:exact_chunk runs knob-composed rules; this rule is standalone"
        if f.anchored:
            return False, (
                f"the rule is anchored (anchor = {f.anchor}: every gradient of a block is taken at "
                "the block's start memory); core:exact_chunk runs the per-token rule (anchor = 1) "
                "— run anchored rules with core:chunkwise"
            )
        if not f.matrix_memory:
            return False, (
                f"structure {f.name('structure')!r} is not a linear matrix memory; the WY form "
                "needs every step to be affine in M (use core:chunkwise or core:sequential)"
            )
        if f.update is None:
            return False, (
                f"algorithm {f.name('algorithm')!r} is neither core:gd nor core:momentum: its "
                "step is not a linear recurrence in the gradient (use core:sequential)"
            )
        if f.momentum and f.opt_keys != ("Z.M",):
            return False, f"algorithm {f.name('algorithm')!r} keeps state {list(f.opt_keys)}, not Z.M"
        if f.retention_shape == "key" or f.error == "dot":
            # per-key decay (GLA, KDA) and the dot bias: forms/key_decay_chunk.py
            if f.update != "gd" or f.windowed or f.error not in ("l2", "dot"):
                return False, (
                    f"retention {f.name('retention')!r} / bias {f.name('bias')!r}: the exact "
                    "per-key-decay form (and the dot bias's) is implemented for core:gd with the l2 "
                    "or dot bias and a one-token window (use core:sequential)"
                )
            if f.per_token_transition:
                return False, (
                    f"retention {f.name('retention')!r} multiplies the memory by a per-token "
                    "matrix (a transition such as RWKV-7's), which has no exact chunked form "
                    "here; core:sequential runs it")
            if not f.retention_linear:
                return False, f"retention {f.name('retention')!r} transforms the memory after each step"
            return True, ""
        if f.error != "l2":
            return False, (
                f"bias {f.name('bias')!r} is not the l2 (delta-rule) bias, alone or in an Omega "
                "window: the exact form needs an error linear in the memory, M k - v "
                "(use core:chunkwise or core:sequential)"
            )
        if f.gradient_at != "current" and (f.update != "gd" or f.windowed):
            return False, (
                f"retention {f.name('retention')!r} takes the gradient at the decayed memory: "
                "the exact form is implemented for gd with a one-token window only"
            )
        if f.per_token_transition:
            return False, (
                f"retention {f.name('retention')!r} multiplies the memory by a per-token matrix "
                "(a transition such as RWKV-7's), which has no exact chunked form here; "
                "core:sequential runs it"
            )
        if not f.retention_linear:
            return False, (
                f"retention {f.name('retention')!r} is not a scalar decay (it transforms the "
                "memory after each step)"
            )
        return True, ""

    # -- the run --------------------------------------------------------------------------------
    def run(self, rule, p):
        backend = self.bound_backends().select(self, rule, p)
        if backend is not None:
            return backend.run(self, rule, p)
        return self.run_torch(rule, p)

    def run_torch(self, rule, p):
        f = rule.form
        if f.retention_shape == "key" or f.error == "dot":
            return run_key_decay(rule, p, self.chunk_size)  # GLA / KDA, and the dot bias
        return run_exact(rule, p, self.chunk_size)


def build(params, ctx) -> ExactChunk:
    return ExactChunk(params)
