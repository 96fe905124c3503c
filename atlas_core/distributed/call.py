"""What both context-parallel modes share (`atlas_core.distributed.context` and
`atlas_core.distributed.relay`): the record of one call (`Call`) and the autograd helpers their
backward passes use (`leaf`, `grads`, `add_grads`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Call:
    """What one context-parallel call needs besides its tensors."""

    rule: Any
    strategy: Any
    group: Any
    rank: int
    world: int
    ranks: list[int]  # global ranks of the group, in group order
    state_keys: list[str]
    gate_names: list[str]
    n_params: int
    memory_keys: list[str] = field(default_factory=list)

    def unpack(self, tensors):
        ns, ng = len(self.state_keys), len(self.gate_names)
        s0 = dict(zip(self.state_keys, tensors[:ns]))
        q, k, v = tensors[ns:ns + 3]
        gates = dict(zip(self.gate_names, tensors[ns + 3:ns + 3 + ng]))
        params = list(tensors[ns + 3 + ng:])
        return s0, q, k, v, gates, params

    def run(self, q, k, v, gates, state):
        # the class's forward: a model with context parallelism on routes the rule's own call here
        return type(self.rule).forward(self.rule, q, k, v, gates=gates or None, state=state,
                                       strategy=self.strategy)


def leaf(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached, a leaf that takes a gradient when it is floating point."""
    return t.detach().requires_grad_(t.is_floating_point())


def grads(outputs, inputs, grad_outputs, retain: bool):
    """The gradients of ``outputs`` (weighted by ``grad_outputs``; None entries skipped) with
    respect to ``inputs``: one entry per input, None where it takes no gradient."""
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if g is not None and o.requires_grad]
    wanted = [x for x in inputs if x.requires_grad]
    if not pairs or not wanted:
        got = [None] * len(wanted)
    else:
        got = list(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs],
                                       retain_graph=retain, allow_unused=True))
    it = iter(got)
    return [next(it) if x.requires_grad else None for x in inputs]


def add_grads(a, b):
    """``a + b`` where either may be None (no gradient)."""
    if a is None:
        return b
    if b is None:
        return a
    return a + b
