"""Rules: a composition of the MIRAS knobs, or a standalone rule, and the call contract.

A rule is a pure function of explicit tensors (docs/math.md, "Shapes and names")::

    y, state = rule(q, k, v, gates={"alpha": a, "eta": e, "theta": th}, state=None,
                    strategy="core:sequential")

- ``q, k: [B, T, H, Dk]``, ``v: [B, T, H, Dv]``, each gate ``[B, T, H]`` (``[B, T, H, Dk]`` for a
  gate declared with ``shape = "key"``); ``y: [B, T, H, Dv]``. ``rule.gates`` lists the gates the
  knobs declare (`atlas_core.knobs.Gate`), ``rule.gate_names`` their names;
- ``state`` maps names to tensors: the memory weights (``"M": [B, H, Dv, Dphi]`` for
  ``core:linear``), the optimiser state (``"Z.M"`` for momentum) and, for windowed biases, the
  last c - 1 inputs (``"window.k": [B, H, c-1, Dphi]``, ``"window.v"``, ``"window.gamma"``);
- with ``anchor = A > 1`` (docs/math.md, "Anchoring as part of the rule") the state also carries
  the position inside the current anchor block (``"anchor.pos": [B]``) and the block's anchor
  memory (``"anchor.<weight>"``, e.g. ``"anchor.M"``), so any split of a sequence into calls
  equals one call;
- the only learned parameters a rule may hold are those of its feature map and of a structure's
  initial weights; the memory layer that holds the rule registers them.

The strategy is resolved once per strategy value and cached on the rule (`Rule.runner`): a call
makes no registry lookup and no ``supports()`` check after the first one with that value.

Packed documents: ``rule(q, k, v, gates=..., cu_seqlens=LongTensor[N + 1])`` with batch size 1
runs each document as a call of its own (`atlas_core.varlen`; the state has one row per document).

Half-precision inputs are computed in float32 (outputs are cast back; the state stays float32);
under ``torch.autocast`` a rule call runs with autocast off, so its inner loop stays float32 too.
"""

from .composed_rule import (ANCHOR_POS, KNOB_DEFAULTS, KNOB_KINDS, MAX_ANCHOR, MAX_STEPS, RULE_KEYS,
                            ComposedRule, MemoryInputs, check_anchor, check_steps)
from .rule_base import Rule
from .rule_build import build_preset, build_rule

__all__ = ["ANCHOR_POS", "KNOB_DEFAULTS", "KNOB_KINDS", "MAX_ANCHOR", "MAX_STEPS", "RULE_KEYS",
           "ComposedRule", "MemoryInputs", "Rule", "build_preset", "build_rule", "check_anchor",
           "check_steps"]
