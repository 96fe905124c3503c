"""``core:identity``: the identity feature map, ``phi(x) = x`` (Dphi = Dk)."""

from __future__ import annotations

from ..knobs.feature_map import FeatureMap


def build(params, ctx) -> FeatureMap:
    return FeatureMap()
