"""The zoo plugin: registers the ``zoo:*`` presets and components through `atlas_register`.

The field's published linear-memory rules, written with the MIRAS knobs in the repository's
conventions (docs/math.md, "The zoo's conventions"; docs/zoo.md gives each equation and how a
published implementation's tensors map onto it): memory ``M: [Dv, Dk]``, read ``y = M q`` with q
as given (no 1/sqrt(d) inside the rule), ``alpha`` the retain multiplier, ``theta`` the write
strength. Presets here are per-token rules (anchor 1).

Cheap to import: no torch here; factories are ``"module:attribute"`` strings.
"""

from __future__ import annotations

from atlas_core.host.hookspecs import hookimpl

_Z = "atlas_plugins.zoo"


def _knobs(bias: str, retention: str) -> dict:
    return {"structure": "core:linear", "bias": bias, "retention": retention,
            "algorithm": "core:gd", "feature_map": "core:identity", "read": "after"}


#: DeltaNet's layer defaults, fla's ``DeltaNet`` layer (docs/zoo.md, "Layer options"): no output
#: gate, short convolutions initialised N(0, 0.02), ``theta = sigmoid(w x)`` (fla's beta, no bias)
#: and q scaled by 1/sqrt(Dk). With these a plain core:lm learns MQAR (docs/mqar_comparison.md).
DELTANET_LAYER = {"output_gate": "none", "conv_init": "normal", "gate_form": {"theta": "no_bias"},
                  "q_scale": "rsqrt_d_key"}


@hookimpl
def atlas_register(registry):
    registry.add("retention", "fixed_decay", f"{_Z}.retention:build",
                 summary="RetNet's fixed per-head retention: alpha_h = 1 - 2^(-5 - h), no gate")
    registry.add_preset(
        "linear_attention", _knobs("core:dot", "core:none"),
        summary="linear attention (Katharopoulos et al. 2020): M_t = M + theta v k^T")
    registry.add_preset(
        "retnet", _knobs("core:dot", "zoo:fixed_decay"),
        summary="RetNet: M_t = alpha_h M + theta v k^T, alpha_h = 1 - 2^(-5 - h) per head")
    registry.add_preset(
        "simple_gla", _knobs("core:dot", "core:decay"),
        summary="simple GLA / Lightning-style scalar gate: M_t = alpha_t M + theta v k^T")
    registry.add("retention", "decay_first", f"{_Z}.retention:build_decay_first",
                 summary="Gated DeltaNet's forgetting: decay by alpha_t, then the step from the "
                 "decayed memory (gradient at alpha_t M_{t-1})")
    registry.add_preset(
        "gated_deltanet", _knobs("core:l2", "zoo:decay_first"),
        summary="Gated DeltaNet: M_t = alpha M - theta (alpha M k - v) k^T (gradient at the decayed memory)")
    registry.add_preset(
        "deltanet", _knobs("core:l2", "core:none"),
        summary="DeltaNet (Schlag et al. 2021, Yang et al. 2024): M_t = M - theta (M k - v) k^T",
        layer=DELTANET_LAYER)
    # per-key decay (plugins/zoo/key_decay.py): GLA and KDA
    registry.add("retention", "key_decay", f"{_Z}.key_decay:build", capabilities=("linear",),
                 summary="per-key retain factor alpha_t: [B, T, H, Dk], M_t = M_{t-1} Diag(alpha_t) + ...")
    registry.add("retention", "key_decay_first", f"{_Z}.key_decay:build_first",
                 summary="KDA's forgetting: decay by Diag(alpha_t), then the step from the decayed memory")
    registry.add_preset(
        "gla", _knobs("core:dot", "zoo:key_decay"),
        summary="GLA (Yang et al. 2023): M_t = M Diag(alpha_t) + theta v k^T, alpha per key dimension")
    registry.add_preset(
        "kda", _knobs("core:l2", "zoo:key_decay_first"),
        summary="Kimi Delta Attention: M' = M Diag(alpha_t), M_t = M' - theta (M' k - v) k^T")
    # Longhorn (plugins/zoo/longhorn.py), RWKV-7 (plugins/zoo/rwkv7.py), Gated DeltaProduct
    registry.add("bias", "normalized_l2", f"{_Z}.longhorn:build",
                 summary="l2 weighted by 1 / (1 + theta |k|^2): Longhorn's / NLMS's normalised step")
    registry.add_preset(
        "longhorn", _knobs("zoo:normalized_l2", "core:none"),
        summary="Longhorn (Liu et al. 2024): M_t = M (I - eps k k^T) + eps v k^T, eps = theta / (1 + theta |k|^2)")
    registry.add("retention", "rwkv7_transition", f"{_Z}.rwkv7:build",
                 summary="RWKV-7's transition M (Diag(w) + a b^T), a = -kappa_hat, b = kappa_hat * iclr")
    registry.add_preset(
        "rwkv7", _knobs("core:dot", "zoo:rwkv7_transition"),
        summary="RWKV-7 (generalised delta rule): M_t = M (Diag(w) - kh (kh * iclr)^T) + theta v k^T")
    registry.add_preset(
        "gated_delta_product", {**_knobs("core:l2", "zoo:decay_first"), "steps_per_token": 2},
        summary="Gated DeltaProduct (Siems et al. 2025): decay once, then n = steps_per_token "
        "delta steps per token (keys, values, theta per step), read after the last")
