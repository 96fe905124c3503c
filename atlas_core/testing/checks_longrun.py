"""A memory that lives: at default gates a structure's memory neither dies nor explodes.

A structure whose weights decay toward an absorbing point (a multi-layer memory decayed toward
zero: each layer's gradient is multiplied by the other layers' weights) loses everything it
stored over a long context while every other check passes. This check runs the structure in its
test composition for `LIVE_T` tokens at the memory layer's default gates (unit-norm q and k) and
compares the norm of the memory it reads with (`Structure.effective`) at the end with the norm
after the first `LIVE_REF` tokens.
"""

from __future__ import annotations

import math

import torch

from . import inputs as I
from .results import Failure, register

LIVE_T = 1024
LIVE_REF = 128
BAND = (0.1, 10.0)


def _norm(rule, state) -> float:
    S = rule.structure
    W = S.effective({k: state[k] for k in S.weight_shapes()})
    return math.sqrt(sum(float(w.detach().double().pow(2).sum()) for w in W.values()))


@register(
    "check_memory_stays_alive",
    f"at the memory layer's default gates, over {LIVE_T} tokens (unit-norm q and k, B = 1), the "
    f"norm of the memory the structure reads with stays finite, non-zero and within "
    f"[{BAND[0]}, {BAND[1]}] times its norm after {LIVE_REF} tokens (under the kit's parallel "
    "variant when one runs the rule: chunk size 3, on the rule rebuilt with anchor = 6 where the "
    "strategy refuses it as given; else core:sequential).",
    {"structure"},
)
def check_memory_stays_alive(subject) -> None:
    subject.require_buildable()
    rule = subject.build_rule(dtype=torch.float32)
    if not subject.composed(rule):
        raise Failure("a structure is checked inside a knob-composed rule; this one is standalone")
    variants = subject.run_variants(rule)
    variant = variants[-1]  # the last is a parallel strategy when one runs the rule
    flat = subject.inputs(rule, B=1, T=LIVE_T, dtype=torch.float32, seed=5, mode="default")
    with torch.no_grad():
        first = subject.run(rule, I.time_slice(flat, 0, LIVE_REF), variant)
        last = subject.run(rule, I.time_slice(flat, LIVE_REF, None), variant, state=I.state_of(first))
    n1, n2 = _norm(rule, I.state_of(first)), _norm(rule, I.state_of(last))
    nums = {"strategy": variant.title, "sizes": subject.sizes_text(1, LIVE_T)}
    if not (math.isfinite(n1) and math.isfinite(n2)):
        raise Failure(f"the memory's norm is not finite ({n1:.3g} after {LIVE_REF} tokens, {n2:.3g} "
                      f"after {LIVE_T})", **nums)
    if n2 == 0.0 or not BAND[0] * n1 <= n2 <= BAND[1] * n1:
        what = "dies" if n2 < BAND[0] * n1 else "explodes"
        raise Failure(
            f"the memory {what}: its norm is {n1:.3g} after {LIVE_REF} tokens and {n2:.3g} after "
            f"{LIVE_T} (band {BAND[0]} to {BAND[1]} times); a structure whose retention decays it "
            "toward an absorbing point loses what it stored", **nums,
        )
