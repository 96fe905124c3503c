"""fla's chunk ops on the CPU, for the backend tests: the entry points the ``fla`` backends call
(`atlas_plugins.fla_backend.mapping.OPS`) replaced by tests/fla_oracle's pure-PyTorch
`recurrence` (checked against fla-core's naive references there, and with an initial state in
test_stand_in.py).

Each stand-in keeps fla 0.6.0's signature and its preconditions as its Python wrapper asserts them
(read from fla/ops/<op>/chunk.py): chunk_delta_rule refuses float32 q; chunk_kda and chunk_gla
want a float32 initial state; chunk_kda's K <= 256 and gate shapes; chunk_gla's
``q.shape == k.shape == g.shape``; fla's ``scale`` default ``1/sqrt(K)``. Packed sequences
(``cu_seqlens``) are refused: the backends never pass them. Outputs come back in q's dtype, the
final state in float32, as fla's. Every call is logged (`CALLS`: op, dtypes, keywords) so tests can
tell a call that reached "fla" from one the PyTorch code ran.

`fla_ops_on_cpu` swaps them in inside `tests.fla_oracle.oracle.fla_on_cpu` (fla's layers on the
CPU) and turns on the backends' test hook `cpu_stand_in`, which makes them take CPU tensors.
"""

from __future__ import annotations

import contextlib
import importlib

import torch

from tests.fla_oracle import oracle

LABEL = "tests/fla_oracle stand-in"
CALLS: list[dict] = []


def _log(op, q, k, v, **tensors):
    CALLS.append({"op": op, "dtype": q.dtype, "k_dtype": k.dtype, "v_dtype": v.dtype,
                  **{f"{n}_dtype": (x.dtype if isinstance(x, torch.Tensor) else None) for n, x in tensors.items()},
                  "B": q.shape[0], "T": q.shape[1]})


def _no_varlen(cu_seqlens):
    if cu_seqlens is not None:
        raise NotImplementedError("the stand-in runs unpacked sequences (the backends never pass cu_seqlens)")


def _l2(q, k, on):
    return (oracle.l2norm(q), oracle.l2norm(k)) if on else (q, k)


def chunk_delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                     use_qk_l2norm_in_kernel=False, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
    assert q.dtype == k.dtype == v.dtype
    assert q.dtype != torch.float32, "ChunkDeltaRuleFunction does not support float32. Please use bfloat16."
    assert len(beta.shape) == 3, "beta must be of shape (batch size, num of head, seq len)."
    _no_varlen(cu_seqlens)
    _log("chunk_delta_rule", q, k, v, beta=beta, initial_state=initial_state)
    q, k = _l2(q, k, use_qk_l2norm_in_kernel)
    o, S = oracle.recurrence(q, k, v, beta, scale=scale, initial_state=initial_state,
                             output_final_state=output_final_state)
    return o.to(q.dtype), S


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                           allow_neg_eigval=False, state_v_first=False, cu_seqlens=None,
                           cu_seqlens_cpu=None, chunk_indices=None, cp_context=None, **kwargs):
    if q.shape[2] != k.shape[2]:
        raise ValueError("q and k must have the same number of heads")
    if use_beta_sigmoid_in_kernel or allow_neg_eigval or state_v_first or kwargs.get("use_gate_in_kernel"):
        raise NotImplementedError("the stand-in takes the gates as computed (the backends pass them so)")
    _no_varlen(cu_seqlens)
    _log("chunk_gated_delta_rule", q, k, v, g=g, beta=beta, initial_state=initial_state)
    q, k = _l2(q, k, use_qk_l2norm_in_kernel)
    o, S = oracle.recurrence(q, k, v, beta, g, scale=scale, initial_state=initial_state,
                             output_final_state=output_final_state)
    return o.to(q.dtype), S


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None,
              cu_seqlens_cpu=None, cp_context=None, use_graph=False, max_num_seqs=None, **kwargs):
    if initial_state is not None:
        assert initial_state.dtype == torch.float32, "initial_state must be in float32."
    if use_gate_in_kernel or use_beta_sigmoid_in_kernel or safe_gate or state_v_first:
        raise NotImplementedError("the stand-in takes the gates as computed (the backends pass them so)")
    B, T, H, K, HV = *q.shape, v.shape[2]
    assert q.shape == k.shape, f"q and k must have the same shape, got q={q.shape} vs k={k.shape}"
    assert K <= 256, f"Currently we only support key headdim <=256 for KDA, got {K}."
    assert g.shape == (B, T, HV, K), f"g must have shape [B, T, HV, K]={[B, T, HV, K]}, got {list(g.shape)}"
    assert beta.shape == (B, T, HV), f"beta must have shape [B, T, HV]={[B, T, HV]}, got {list(beta.shape)}"
    _no_varlen(cu_seqlens)
    _log("chunk_kda", q, k, v, g=g, beta=beta, initial_state=initial_state)
    q, k = _l2(q, k, use_qk_l2norm_in_kernel)
    o, S = oracle.recurrence(q, k, v, beta, gk=g, scale=scale, initial_state=initial_state,
                             output_final_state=output_final_state)
    return o.to(q.dtype), S


def chunk_gla(q, k, v, g, scale=None, initial_state=None, output_final_state=False, state_v_first=False,
              cu_seqlens=None, cu_seqlens_cpu=None):
    if initial_state is not None:
        assert initial_state.dtype == torch.float32, "initial_state must be in float32."
    assert q.shape == k.shape == g.shape, "q, k, g must have the same shape."
    assert v.shape == (*q.shape[:3], v.shape[-1]), "v must be of shape (batch size, seq len, num of head, head dim)."
    if state_v_first:
        raise NotImplementedError("the stand-in keeps fla's [K, V] state layout")
    _no_varlen(cu_seqlens)
    _log("chunk_gla", q, k, v, g=g, initial_state=initial_state)
    o, S = oracle.recurrence(q, k, v, gk=g, scale=scale, delta=False, initial_state=initial_state,
                             output_final_state=output_final_state)
    return o.to(q.dtype), S


def chunk_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state=False,
                     state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
    if state_v_first:
        raise NotImplementedError("the stand-in keeps fla's [K, V] state layout")
    _no_varlen(cu_seqlens)
    _log("chunk_simple_gla", q, k, v, g=g, initial_state=initial_state)
    if g_gamma is not None:  # a fixed log-decay per head
        g = g_gamma.float().expand(q.shape[:3]) if g is None else g + g_gamma.float()
    o, S = oracle.recurrence(q, k, v, g=g, scale=scale, delta=False, initial_state=initial_state,
                             output_final_state=output_final_state)
    return o.to(q.dtype), S


#: fla's entry point name -> its stand-in
STAND_INS = {f.__name__: f for f in (chunk_delta_rule, chunk_gated_delta_rule, chunk_kda, chunk_gla, chunk_simple_gla)}


@contextlib.contextmanager
def fla_ops_on_cpu(replace: dict | None = None):
    """Within the block, the fla backends' entry points are the stand-ins (``replace``: other
    functions for some of them, by fla's name) and the backends take CPU tensors. Yields `CALLS`,
    emptied first."""
    from atlas_plugins.fla_backend.availability import cpu_stand_in
    from atlas_plugins.fla_backend.mapping import OPS

    fns = {**STAND_INS, **(replace or {})}
    saved = []
    CALLS.clear()
    with oracle.fla_on_cpu(), cpu_stand_in(LABEL):
        try:
            for module, attr in OPS.values():
                owner = importlib.import_module(module)
                saved.append((owner, attr, getattr(owner, attr)))
                setattr(owner, attr, fns[attr])
            yield CALLS
        finally:
            for owner, attr, old in reversed(saved):
                setattr(owner, attr, old)
