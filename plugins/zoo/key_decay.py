"""Per-key-dimension retention: GLA's and KDA's forgetting (docs/zoo.md, docs/math.md "Per-key decay").

The retain factor is one number per key dimension, ``alpha_t: [B, T, H, Dk]``, acting on the
memory's key axis: ``M_{t-1} Diag(alpha_t)`` (key dimension d of every value row keeps
``alpha_t[d]``). The memory structure applies it (`Structure.retain`; ``core:linear`` does).

- ``zoo:key_decay``: the gradient is taken at ``M_{t-1}`` (with ``core:dot`` the bias ignores the
  memory, so this is GLA, Yang et al. 2023: ``M_t = M_{t-1} Diag(alpha_t) + theta_t v_t k_t^T``);
- ``zoo:key_decay_first``: decay first, then the step from the decayed memory (KDA, Kimi Delta
  Attention: ``M' = M_{t-1} Diag(alpha_t)``, ``M_t = M' - theta_t (M' k_t - v_t) k_t^T``).

The gate ``alpha`` is declared per key: ``sigmoid(w x + b)`` with the initial bias 3.0, so every
key dimension starts keeping about 0.95 per token (GLA's own ``sigmoid^(1/16)`` parametrisation
starts near 0.96); ``[layer] gate_bias.alpha`` changes it.
"""

from __future__ import annotations

import torch

from atlas_core.knobs.gates import Gate
from atlas_core.knobs.retention import Retention

ALPHA_KEY = Gate("alpha", shape="key", bias=3.0, range=(0.0, 1.0),
                 summary="per-key retain factor alpha_t[d] in [0, 1]: sigmoid(3.0) ~ 0.95", role="retention")


class KeyDecay(Retention):
    """``zoo:key_decay``: ``M_t = M_{t-1} Diag(alpha_t) - theta_t g_t``, g at ``M_{t-1}``."""

    gates = (ALPHA_KEY,)
    alpha_shape = "key"

    def alpha(self, gates: dict, like: torch.Tensor) -> torch.Tensor:
        return gates["alpha"]  # [B, T, H, Dk]


class KeyDecayFirst(KeyDecay):
    """``zoo:key_decay_first``: decay by ``Diag(alpha_t)`` first, then the step from the decayed
    memory (the gradient at ``M_{t-1} Diag(alpha_t)``)."""

    gradient_at = "retained"


def build(params, ctx) -> KeyDecay:
    return KeyDecay()


def build_first(params, ctx) -> KeyDecayFirst:
    return KeyDecayFirst()
