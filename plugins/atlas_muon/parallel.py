"""``atlas_muon:atlas_parallel``: chunk-parallel training of Muon rules (Atlas Sec 5, Eq 15, 32-34).

Per chunk of C tokens (docs/math.md, "Parallel forms"):

1. every gradient is taken at the chunk's anchor, the memory before the chunk, so the per-token
   (window-weighted) gradients ``G: [B, H, C, *s]`` come from one batched VJP;
2. the momentum recurrence ``Z_t = eta_t Z_{t-1} + G_t`` is a linear scan (its closed form, a
   lower-triangular decay matrix times G: `Muon.momenta`);
3. ``NS_k`` runs on every ``Z_t`` of the chunk in one batched call;
4. the retention recurrence ``M_t = alpha_t M_{t-1} - theta_t N_t`` is a second scan;
5. the reads ``y_t = M_t(phi(q_t))`` (or ``M_{t-1}`` with ``read = "before"``) are per token.

Accepted chunk sizes are ``core:chunkwise``'s: C divides the rule's anchor (C = 1 always). The
result equals ``core:sequential`` on the same rule for every accepted C and any split of a
sequence into calls: the memory, the momenta and the Omega window buffer are carried across chunks
and calls, and the chunk grid is aligned to absolute positions (a call that starts inside a chunk
first runs up to the next chunk boundary, as for ``core:chunkwise``).

Memory (docs/math.md, "Training memory of the chunked strategies"). The forward transient is
O(C |W|) per chunk, never O(T |W|). What autograd would keep for the backward pass is the larger
cost: every chunk's momenta and NS iterates, O(T k |W|) over the sequence. With ``checkpoint =
true`` (the default) each chunk is recomputed during the backward pass from the state at its start
(`atlas_core.forms.recompute`), so only the chunk-boundary states are kept — O((T / C) |W|)
plus one chunk's working set O(C k |W|) — at the price of one more forward of every chunk. When
those boundary states would exceed ``memory_budget_mib``, they are kept only every
ceil(sqrt(T / C)) chunks and each segment is recomputed in turn (one more forward again):
O(sqrt(T / C) |W|). Results and gradients are identical in every mode.

The per-chunk code is ``core:chunkwise``'s generic path (this strategy subclasses it); what this
strategy adds is the restriction to Muon (the linear-memory "attention" fast path of
``core:chunkwise`` never applies to Muon) and a higher auto priority. ``core:chunkwise`` also runs
Muon rules, with the same results and the same recomputation.
"""

from __future__ import annotations

from atlas_core.strategies.chunkwise import Chunkwise

from .muon import Muon
from .params import AtlasParallelParams


class AtlasParallel(Chunkwise):
    name = "atlas_muon:atlas_parallel"

    def __init__(self, params: AtlasParallelParams | None = None) -> None:
        # Chunkwise reads ``chunk_size`` and ``backend`` from its params object
        super().__init__(params or AtlasParallelParams())
        self.checkpoint = self.params.checkpoint

    def describe(self) -> str:
        return (f"{self.name}(chunk_size={self.chunk_size}, checkpoint={self.checkpoint}, "
                f"memory_budget_mib={self.memory_budget_mib})")

    def supports(self, rule) -> tuple[bool, str]:
        algorithm = rule.form.algorithm_type  # None for a standalone rule
        if algorithm is None or not issubclass(algorithm, Muon):
            spec = getattr(rule, "spec", {}) or {}
            got = spec.get("algorithm", spec.get("use", type(rule).__name__))
            return False, (
                f"atlas_muon:atlas_parallel runs the Muon algorithm (atlas_muon:muon) only, got "
                f"algorithm {got!r}; use core:chunkwise for other algorithms"
            )
        return super().supports(rule)

    def fast_path(self, rule) -> bool:
        return False  # NS is nonlinear in Z: always the per-token (generic) chunk


def build(params: AtlasParallelParams | None, ctx) -> AtlasParallel:
    return AtlasParallel(params)
