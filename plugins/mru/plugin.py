"""The MRU plugin: registers the ``mru:*`` components through the `atlas_register` hook.

- rule ``mru:mru``: ``H_t = H_{t-1} X_t`` over per-token square matrices (standalone rule);
- strategies ``mru:hillis_steele``, ``mru:brent_kung``, ``mru:sklansky``: exact parallel scans
  with a closed-form backward; they run only ``mru:mru`` (``core:sequential`` runs its loop);
- architecture ``mru:mru_lm``: a GPT-2-style LM with MRU layers in place of attention.

Cheap to import: no torch here; factories and params models are ``"module:attribute"`` strings.
"""

from __future__ import annotations

from atlas_core.host.hookspecs import hookimpl

_M = "atlas_plugins.mru"


@hookimpl
def atlas_register(registry):
    add = registry.add
    add("rule", "mru", f"{_M}.rule:build",
        summary="Matrix Recurrent Unit: H_t = H_{t-1} X_t, X: [B, T, H, d, d], state H: [B, H, d, d]",
        capabilities=("standalone", "matrix_product"))
    # priorities rank the scans for "auto" (measured in docs/mru.md); all are exact, and they
    # refuse every rule but mru:mru, so "auto" never picks them for a composed memory rule.
    # The conformance kit runs each on the MRU rule (its default composition would be refused).
    on_mru = [{"rule": "mru:mru"}]
    add("strategy", "brent_kung", f"{_M}.strategies:build_brent_kung",
        summary="MRU product scan, Brent-Kung: <= 2 log2 T steps, < 2T products, closed-form backward",
        capabilities=("mru",), priority=30, check_cases=on_mru)
    add("strategy", "sklansky", f"{_M}.strategies:build_sklansky",
        summary="MRU product scan, Sklansky: ceil(log2 T) steps, T/2 log2 T products, closed-form backward",
        capabilities=("mru",), priority=25, check_cases=on_mru)
    add("strategy", "hillis_steele", f"{_M}.strategies:build_hillis_steele",
        summary="MRU product scan, Hillis-Steele: ceil(log2 T) steps, T log2 T products, closed-form backward",
        capabilities=("mru",), priority=20, check_cases=on_mru)
    add("arch", "mru_lm", f"{_M}.lm:build", params=f"{_M}.lm:MRULMParams",
        summary="MRU-LM: GPT-2-style blocks with MRU layers in place of attention (seed 002)",
        check_cases=[{"params": {"vocab_size": 32, "d_model": 8, "depth": 1, "heads": 2}}])
