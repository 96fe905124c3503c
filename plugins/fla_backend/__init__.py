"""``fla``: flash-linear-attention's chunk ops (delta rule, gated delta rule, KDA, GLA, simple GLA)
as kernel backends of ``core:exact_chunk`` and ``core:chunkwise``, chosen by ``"auto"`` only on a
device where the conformance kit passed (`atlas fla certify`).

Nothing here imports torch or fla at import time; see `plugin` for the registration, `mapping` for
which op computes which rule and how a call maps onto it, and docs/kernels.md ("fla's chunk
kernels") for when the backends run and how they are tested without a GPU.
"""
