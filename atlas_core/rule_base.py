"""The base class of every rule: declared traits, the bound strategy cache (`Rule.runner`) and
the call path (`Rule.forward`: input checks, packed documents, autocast off, prepare -> strategy
-> finish). The call contract and the knob-composed rule are in `atlas_core.rule`."""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any, Mapping

import torch
from torch import nn

from . import input_checks
from .forms.rule_form import RuleForm
from .knobs.gates import Gate


def _strategy_key(value: Any) -> Any:
    """A hashable key for a strategy value (a name, a table, or a Strategy object)."""
    if isinstance(value, (str, type(None))):
        return value
    if isinstance(value, Mapping):
        return json.dumps(value, sort_keys=True, default=str)
    return ("object", id(value))


class Rule(nn.Module):
    """Base class of every rule. Subclasses implement `prepare` (validate and normalise the
    call's tensors into the strategy's input object), `reference` (the readable sequential
    algorithm, used by ``core:sequential``) and `finish` (turn a strategy's output into the
    public result)."""

    spec: Mapping[str, Any] = MappingProxyType({})  # the spec it was built from (set by its builder)
    default_strategy: Any = "core:sequential"
    #: gradients inside a block of ``anchor`` tokens are taken at the block's start (1: per token)
    anchor: int = 1
    #: the gates a memory layer must produce for this rule (none: a standalone rule takes its
    #: own inputs)
    gates: tuple[Gate, ...] = ()
    #: sub-steps per token (Gated DeltaProduct): k and v then carry ``[B, T, n, H, D]`` and the
    #: gates named in `step_gates` ``[B, T, n, H]`` (``[B, T, n, H, Dk]`` per key); q and the
    #: other gates stay per token
    steps_per_token: int = 1
    step_gates: tuple[str, ...] = ()
    #: the call is ``rule(q, k, v, gates=..., state=...)``, what `atlas_core.layer.MemoryLayer`
    #: feeds; a rule with other inputs (the MRU's ``X``) sets False and brings its own layer
    takes_qkv: bool = True
    #: knob-composed (`ComposedRule`): a structure and a feature map to read the memory with
    composed: bool = False
    #: what every strategy, backend and the kit read about the rule (`atlas_core.forms.RuleForm`),
    #: decided once when the rule is built; a standalone rule's is ``RuleForm()``
    form: RuleForm = RuleForm()

    def bind(self, heads: int, d_key: int | None = None, d_value: int | None = None) -> "Rule":
        """Fix the sizes a caller works with (heads, Dk, Dv); the base records nothing."""
        return self

    @property
    def gate_names(self) -> tuple[str, ...]:
        """The names of `gates`, sorted."""
        return tuple(sorted(g.name for g in self.gates))

    def example_inputs(self, *, batch: int, seq_len: int, dtype=torch.float32, device=None,
                       generator: torch.Generator | None = None) -> Mapping[str, Any] | None:
        """Keyword arguments of a valid call for the conformance kit (tensors ``[B, T, ...]``, or
        one level of dicts of them); None: the kit makes a knob-composed rule's calls itself and
        skips the tensor checks of a standalone rule without them (docs/plugins.md)."""
        return None

    def prepare(self, *args, **kwargs):
        raise NotImplementedError

    def reference(self, inputs):
        raise NotImplementedError

    def finish(self, inputs, output):
        return output

    def runner(self, strategy: Any = None, registry=None):
        """The bound strategy for ``strategy`` (None: the rule's default), resolved and checked
        once per value, then cached: later calls with the same value do no registry lookup and
        no ``supports()`` call."""
        from .strategies.base import resolve_strategy

        value = self.default_strategy if strategy is None else strategy
        cache = self.__dict__.setdefault("_runners", {})
        key = _strategy_key(value)
        hit = cache.get(key)
        if hit is not None and (not isinstance(key, tuple) or hit[0] is value):
            return hit[1]
        strat = resolve_strategy(self, value, registry)
        cache[key] = (value, strat)
        # the bound object itself is a value too (a layer passes its runner back on every call)
        cache[("object", id(strat))] = (strat, strat)
        return strat

    def single_step(self, inputs) -> bool:
        """Whether this call is one token, run by the sequential step whatever the strategy
        (every strategy computes the same function; a chunked one would pay a whole chunk)."""
        return False

    def forward(self, *args, strategy: Any = None, check_inputs: bool | None = None,
                cu_seqlens: torch.Tensor | None = None, **kwargs):
        input_checks.check_devices(args, kwargs)
        if input_checks.wanted(check_inputs):  # opt-in: ATLAS_CHECK_INPUTS=1 or check_inputs=True
            input_checks.check_values(self, args, kwargs)
        if cu_seqlens is not None:  # packed documents, batch 1 (atlas_core/varlen.py)
            kwargs = {**kwargs, "cu_seqlens": cu_seqlens}
        strat = self.runner(strategy)
        device = next((a.device.type for a in (*args, *kwargs.values())
                       if isinstance(a, torch.Tensor)), None)
        if device is not None and torch.is_autocast_enabled(device):
            # under autocast (train.precision = "bf16") the memory stays float32: its state,
            # inner loop and readout run with autocast off; the output returns in the input dtype
            with torch.autocast(device, enabled=False):
                return self._run(strat, args, kwargs)
        return self._run(strat, args, kwargs)

    def _run(self, strat, args, kwargs):
        if "cu_seqlens" in kwargs:  # each document is a call of its own (the strategy contract)
            from .varlen import packed_call

            kwargs = dict(kwargs)
            cu = kwargs.pop("cu_seqlens")
            return packed_call(lambda a, kw: self._run(strat, a, kw), self.prepare, args, kwargs, cu)
        inputs = self.prepare(*args, **kwargs)
        out = self.reference(inputs) if self.single_step(inputs) else strat.run(self, inputs)
        return self.finish(inputs, out)
