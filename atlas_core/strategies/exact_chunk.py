"""``core:exact_chunk``: the per-token delta rule, exact for any chunk size (WY / UT transform).

Runs gd or momentum (Titans) on a linear memory with the l2 bias, or with an Omega window of c
tokens around it, under scalar-decay retention (``core:decay`` / ``core:none``), read "after" or
"before" (`atlas_core.forms.exact_chunk`, which writes out the math and its cost); per-key decay
(GLA, KDA) and the dot bias with gd and a one-token window (`atlas_core.forms.key_decay_chunk`).
The result equals ``core:sequential`` up to rounding for every chunk size C.

What it accepts is the catalogue's (`atlas_core.forms.catalogue.exact_reason`: the
``"exact_chunk"`` or ``"key_decay_chunk"`` form, both per-token); `supports` names the first
reason it refuses: other algorithms, biases other than l2 and dot (lp / huber), the dot bias or
per-key decay with momentum or a window, nonlinear retention, other structures (deep memory),
anchored rules (``anchor > 1``: run by ``core:chunkwise``).
"""

from __future__ import annotations

from ..forms.catalogue import exact_reason
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
        why = exact_reason(f)  # the exact_chunk / key_decay_chunk forms (forms/catalogue.py)
        return why is None, why or ""

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
