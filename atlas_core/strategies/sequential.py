"""``core:sequential``: the reference. Runs the rule's own readable token-by-token loop.

Every rule supports it, and every other strategy is tested against it.
"""

from __future__ import annotations

from .base import Strategy


class Sequential(Strategy):
    name = "core:sequential"

    def supports(self, rule) -> tuple[bool, str]:
        return True, ""  # every rule has its reference loop (`Rule.reference`)

    def run(self, rule, inputs):
        return rule.reference(inputs)


def build(params, ctx) -> Sequential:
    return Sequential()
