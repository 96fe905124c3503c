"""Entry module of the ``planted`` plugin: registration only (no torch)."""

from __future__ import annotations

from atlas_core import hookimpl

_P = "atlas_acme_planted"


@hookimpl
def atlas_register(registry):
    registry.add("retention", "rho_keep", f"{_P}.rho_keep:build", capabilities=("linear",),
                 summary="retain factor alpha = 1 - rho^2 from its own gate rho in [0, 1]")
    registry.add_preset("rho_delta", {"structure": "core:linear", "bias": "core:l2",
                                      "retention": "planted:rho_keep", "algorithm": "core:gd",
                                      "feature_map": "core:identity"},
                        summary="the delta rule with planted:rho_keep")
    registry.add("rule", "mesa", f"{_P}.mesa:build", params=f"{_P}.mesa:MesaParams",
                 capabilities=("standalone",), check_cases=[{"params": {"lam": 0.5}}],
                 summary="MesaNet-style least squares: y_t = G_t (H_t + lam I)^-1 q_t")
    registry.add("strategy", "mesa_chunks", f"{_P}.mesa_chunks:build",
                 params=f"{_P}.mesa_chunks:MesaChunksParams",
                 check_cases=[{"rule": {"use": "planted:mesa", "lam": 0.5}}],
                 summary="planted:mesa chunk by chunk in closed form (decay matrices, batched solves)")
