"""Entry module of the ``acme_nlms`` plugin: registration only (no torch)."""

from __future__ import annotations

from atlas_core import hookimpl

_P = "atlas_acme_nlms"


@hookimpl
def atlas_register(registry):
    registry.add(
        "bias", "nlms", f"{_P}.nlms:build", params=f"{_P}.nlms:NLMSParams",
        summary="l2 weighted by mu / (delta + |k|^2): the normalised LMS step (Longhorn-like)",
        check_cases=[{"params": {"delta": 0.1}}],
    )
    registry.add_preset("nlms_delta", {
        "structure": "core:linear",
        "bias": "acme_nlms:nlms",
        "retention": "core:decay",
        "algorithm": "core:gd",
        "feature_map": "core:identity",
    }, summary="M_t = alpha M - theta mu / (delta + |k|^2) (M k - v) k^T")
