"""``core:none``: no retention (alpha = 1); the memory keeps everything."""

from __future__ import annotations

from ..knobs.retention import Retention


class NoRetention(Retention):
    gates = ()


def build(params, ctx) -> NoRetention:
    return NoRetention()
