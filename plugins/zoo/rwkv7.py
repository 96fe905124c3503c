"""``zoo:rwkv7_transition``: RWKV-7's state transition ("Goose", Peng et al. 2025), a generalised delta rule.

In the repository's orientation (memory ``M: [Dv, Dk]``)::

    M_t = M_{t-1} (Diag(w_t) + a_t b_t^T) + theta_t v_t k_t^T,
    a_t = -kappa_hat_t,  b_t = kappa_hat_t * iclr_t,  kappa_hat_t = kappa_t / |kappa_t|

with three gates per key dimension (``[B, T, H, Dk]``): ``w`` the per-channel retain factor,
``kappa`` the erase key (its direction only) and ``iclr`` the in-context learning rate that
scales the write-back along it. The write ``v k^T`` is the dot bias with ``core:gd`` (``theta = 1``
is RWKV-7's unit write).

The transition is a retention with its own per-token map (``per_token_transition``): the rule's
loop takes the retained memory from `transition` instead of ``alpha M``. It is linear in M but
not a scalar decay, so it declares ``linear = False``: the chunked strategies refuse it and
``core:sequential`` runs it.
"""

from __future__ import annotations

import torch

from atlas_core.knobs.gates import Gate
from atlas_core.knobs.retention import Retention

W = Gate("w", shape="key", activation="sigmoid", bias=3.0, range=(0.0, 1.0),
         summary="RWKV-7 per-key retain factor w_t in (0, 1): sigmoid(3.0) ~ 0.95", role="transition")
KAPPA = Gate("kappa", shape="key", activation="identity", bias=1.0,
             summary="RWKV-7 erase key kappa_t (its direction kappa_t / |kappa_t| is used)", role="transition")
ICLR = Gate("iclr", shape="key", activation="sigmoid", bias=0.0, range=(0.0, 1.0),
            summary="RWKV-7 in-context learning rate in (0, 1) per key dimension: sigmoid(0) = 0.5",
            role="transition")


def erase_write(kappa: torch.Tensor, iclr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RWKV-7's erase and write keys ``a = -kappa_hat``, ``b = kappa_hat * iclr`` (any leading
    shape, key dimension last)."""
    kh = torch.nn.functional.normalize(kappa, dim=-1, eps=1e-12)
    return -kh, kh * iclr


class RWKV7Transition(Retention):
    gates = (W, KAPPA, ICLR)
    linear = False  # not a scalar decay: no chunked form
    per_token_transition = True

    def transition(self, Wts: dict, gates: dict) -> dict:
        M = Wts["M"]  # [B, H, Dv, Dk]; gates [B, H, Dk]
        a, b = erase_write(gates["kappa"], gates["iclr"])
        Ma = torch.einsum("bhvk,bhk->bhv", M, a)
        return {"M": M * gates["w"].unsqueeze(-2) + Ma.unsqueeze(-1) * b.unsqueeze(-2)}

    def check_composition(self, rule) -> list[str]:
        out = list(super().check_composition(rule))
        if not rule.structure.is_linear:
            out.append(f"RWKV-7's transition acts on a matrix memory M: [Dv, Dk]; structure "
                       f"{rule.spec.get('structure')!r} is not one (use core:linear)")
        if any(rule.feature_map.out_dim(d) != d for d in (1, 2, 8, 64)):
            out.append(f"RWKV-7's gates are per key dimension [B, T, H, Dk], but feature map "
                       f"{rule.spec.get('feature_map')!r} changes the key dimension (use core:identity)")
        return out


def build(params, ctx) -> RWKV7Transition:
    return RWKV7Transition()
