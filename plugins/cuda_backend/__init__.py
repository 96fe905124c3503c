"""``cuda``: Triton kernels for the chunkwise linear-memory update (with the Omega window) and the
MRU matrix-product scan, registered as backends of ``core:chunkwise`` and the MRU scan strategies.

Nothing here imports Triton or torch at import time; see `plugin` for the registration and
docs/kernels.md for the kernels, their costs and how they are tested without a GPU.
"""
