"""The ``cuda`` plugin: registers the Triton kernel backends through the `atlas_register` hook.

- backend ``cuda:chunk_linear`` serves ``core:chunkwise`` (linear memory, l2/dot bias with an
  optional Omega window, gd/momentum, linear retention, read after/before);
- backend ``cuda:mru_scan`` serves the MRU's product scans (``mru:brent_kung``, ``mru:sklansky``,
  ``mru:hillis_steele``, listed in the ``strategies`` extra): the kernel computes the same
  products whichever scan order was asked for.

Each backend is available when Triton imports and a CUDA device is present, or when
``TRITON_INTERPRET=1`` runs the kernels in Triton's CPU interpreter. ``ATLAS_DISABLE_BACKENDS``
switches them off; ``ATLAS_BACKEND`` forces one (see `atlas_core.backends`).

Cheap to import: no torch and no Triton here; factories are ``"module:attribute"`` strings.
"""

from __future__ import annotations

from atlas_core.host.hookspecs import hookimpl

_P = "atlas_plugins.cuda_backend"


@hookimpl
def atlas_register(registry):
    registry.add(
        "backend", "chunk_linear", f"{_P}.backend_chunk:build", priority=100,
        strategy="core:chunkwise",
        summary="Triton chunkwise linear-memory update (l2/dot, Omega window, gd/momentum), fwd + bwd",
    )
    registry.add(
        "backend", "mru_scan", f"{_P}.backend_mru:build", priority=100,
        strategy="mru:brent_kung", strategies=("mru:brent_kung", "mru:sklansky", "mru:hillis_steele"),
        summary="Triton MRU matrix-product scan (chunked three-phase), closed-form backward",
    )
