"""Entry module of the ``miras`` plugin: registers its components through the one hook.

Cheap to import (the conformance check ``check_entry_module_light`` holds it to that): no torch
here; factories and params models are named as ``"module:attribute"`` strings and imported when
a spec first uses them.

Reductions (checked by ``check_reductions``): each names params for which the component equals
another rule, in the format of docs/plugins.md ("Declaring reductions").
"""

from __future__ import annotations

from atlas_core import hookimpl

_P = "atlas_miras"


@hookimpl
def atlas_register(registry):
    add = registry.add
    add("bias", "lp", f"{_P}.lp:build", params=f"{_P}.lp:LpParams",
        summary="Moneta's lp bias: 1/p sum (e^2 + eps)^(p/2), gradient e (e^2 + eps)^((p-2)/2) phi(k)^T",
        check_cases=[{"params": {"p": 3.0}}, {"params": {"p": 1.5}}],
        reductions=[{"name": "p2_is_l2", "params": {"p": 2.0}, "equals": {"bias": "core:l2"}}])
    add("bias", "huber", f"{_P}.huber:build", params=f"{_P}.huber:HuberParams",
        summary="Yaad's Huber bias: gradient clip(e, -delta, delta) phi(k)^T (or the norm form)",
        check_cases=[{"params": {"delta": 0.5}}, {"params": {"delta": 0.5, "mode": "norm"}}],
        reductions=[
            {"name": "large_delta_is_l2", "params": {"delta": 1.0e6}, "equals": {"bias": "core:l2"}},
            {"name": "norm_large_delta_is_l2", "params": {"delta": 1.0e6, "mode": "norm"},
             "equals": {"bias": "core:l2"}},
        ])
    add("retention", "lq", f"{_P}.lq:build", params=f"{_P}.lq:LqParams",
        summary="Moneta's lq normalisation: A_t = alpha_t A_{t-1} - update; M_t = A_t / ||A_t||_q^(q-2)",
        check_cases=[{"params": {"q": 2.5}}, {"params": {"q": 4.0}}],
        reductions=[{"name": "q2_is_decay", "params": {"q": 2.0}, "equals": {"retention": "core:decay"}}])
    add("retention", "kl", f"{_P}.kl:build", params=f"{_P}.kl:KLParams",
        summary="Memora's KL retention: M_t = c softmax(alpha_t log(M_{t-1} / c) - update), rows on the simplex")
    registry.add_preset("moneta", {
        "structure": "core:linear",
        "bias": {"use": "miras:lp", "p": 3.0},
        "retention": {"use": "miras:lq", "q": 4.0},
        "algorithm": "core:gd",
        "feature_map": "core:identity",
    }, summary="Moneta: lp attentional bias (p = 3), lq retention (q = 4), gradient descent")
    registry.add_preset("yaad", {
        "structure": "core:linear",
        "bias": {"use": "miras:huber", "delta": 1.0},
        "retention": "core:decay",
        "algorithm": "core:gd",
        "feature_map": "core:identity",
    }, summary="Yaad: Huber attentional bias, decay (L2) retention, gradient descent")
    registry.add_preset("memora", {
        "structure": "core:linear",
        "bias": "core:l2",
        "retention": {"use": "miras:kl", "scale": 1.0},
        "algorithm": "core:gd",
        "feature_map": "core:identity",
    }, summary="Memora: l2 attentional bias, KL (softmax) retention, gradient descent")
