"""Which fla chunk op computes a rule, and the exact mapping of a call onto it.

Decided from the rule's declared form (`atlas_core.forms.RuleForm`, ``rule.form``), never by
running anything: every mapped rule is gd on the linear matrix memory ``M: [Dv, Dk]`` with a
one-token window, per-token (``anchor = 1``), read after the update, with a linear retention and
the l2 (delta) or dot (write-only) error. Per token t, with ``w_t = theta_t gamma_t lag_0`` (the
step size times the bias's token weight; 1 for ``core:l2`` / ``core:dot``):

=====  ==========  ==================  ==================================  ==========================
error  retention   gradient at          rule                                fla op (backend)
=====  ==========  ==================  ==================================  ==========================
l2     none        --                  M - w (M k - v) k^T                 chunk_delta_rule
l2     per head    decayed (retained)  M' = a M;  M' - w (M' k - v) k^T    chunk_gated_delta_rule
l2     per key     decayed (retained)  M' = M Diag(a); same                chunk_kda
dot    per head    either              a M + w v k^T                       chunk_simple_gla
dot    per key     either              M Diag(a) + w v k^T                 chunk_gla
=====  ==========  ==================  ==================================  ==========================

(zoo:deltanet and zoo:longhorn; zoo:gated_deltanet and zoo:gated_delta_product; zoo:kda;
zoo:simple_gla, zoo:retnet and zoo:linear_attention; zoo:gla.) The l2 error with the gradient at
``M_{t-1}`` under a decay (``core:decay`` / ``zoo:key_decay`` with ``core:l2``, Titans' order) is
another rule than fla's, which decays first: refused.

The call (``MemoryInputs``: ``psi, phik: [B, H, T, Dk]``, ``v: [B, H, T, Dv]``, gates ``[B, H, T]``
or ``[B, H, T, Dk]``, ``M: [B, H, Dv, Dk]``) maps onto fla's ``[B, T, H, ...]`` tensors as:

- ``q = psi`` as given, with ``scale = 1`` (fla's default would multiply q by ``1/sqrt(Dk)``;
  the memory layer owns any scaling); ``k = phik``, ``v = v``; no l2 norm in the kernel
  (``use_qk_l2norm_in_kernel = False``: the layer normalises before the rule);
- delta family: ``beta = w``; dot family (no beta in fla): ``k = w * phik`` (the write
  ``w v k^T = v (w k)^T``; exact, and a no-op at fla's usual ``w = 1``);
- ``g = log a`` per head (``[B, T, H]``) or per key (``[B, T, H, Dk]``), ``log`` floored at the
  dtype's smallest normal (`atlas_core.forms.decay.log_tiny`, as core:exact_chunk's key-decay
  form), float32; a rule without a retention gate passes no ``g`` (simple_gla) or ``g = 0``;
- ``initial_state = M^T`` (fla's ``S: [B, H, Dk, Dv]``), float32; the final state
  ``M = S^T``; ``output_final_state = True``;
- fla's ``o: [B, T, H, Dv]`` is ``y`` (``[B, H, T, Dv]`` after the transpose).

Operands (q, k, v, beta) go to fla in the call's own dtype when the inputs were bfloat16 or
float16 (``MemoryInputs.out_dtype``; fla's usual operands, accumulated in float32), else float32.
fla 0.6.0's ``chunk_delta_rule`` asserts that q is not float32, so a float32 delta-rule call runs
``chunk_gated_delta_rule`` with ``g = 0`` (``exp(0) = 1``: the same recurrence).

Packed sequences never reach a strategy (`atlas_core.varlen.packed_call` runs each document as a
call of its own), so ``cu_seqlens`` is never passed. Grouped value heads reach the rule already
repeated to the value heads (the memory layer repeats q and k), so fla's GVA is not used either.
"""

from __future__ import annotations

#: backend (op) -> (fla module, entry point); looked up at call time, so a test stand-in can
#: replace the entry point in its module (tests/fla_backend/stand_in.py)
OPS = {
    "delta_rule": ("fla.ops.delta_rule", "chunk_delta_rule"),
    "gated_delta_rule": ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
    "kda": ("fla.ops.kda", "chunk_kda"),
    "gla": ("fla.ops.gla", "chunk_gla"),
    "simple_gla": ("fla.ops.simple_gla", "chunk_simple_gla"),
}
#: the presets each op computes (for messages and docs; the decision is `op_for`'s)
PRESETS = {
    "delta_rule": ("zoo:deltanet", "zoo:longhorn"),
    "gated_delta_rule": ("zoo:gated_deltanet", "zoo:gated_delta_product"),
    "kda": ("zoo:kda",),
    "gla": ("zoo:gla",),
    "simple_gla": ("zoo:simple_gla", "zoo:retnet", "zoo:linear_attention"),
}
#: fla 0.6.0 asserts ``K <= 256`` (common/chunk_delta_h.py, kda/chunk.py)
MAX_KEY_DIM = 256
#: some of fla's kernels tile a head dim as ``next_power_of_2(D)`` without a floor of 16
#: (gla/chunk.py: ``BK = min(128, next_power_of_2(K))``), below tl.dot's smallest tile
MIN_HEAD_DIM = 16


def op_for(f) -> tuple[str | None, str]:
    """``(op, "")`` for the fla op that computes a rule of form ``f`` exactly, or ``(None,
    reason)``."""
    if not f.composed:
        return None, "the rule is not knob-composed (fla's chunk ops compute linear-memory rules)"
    if not f.matrix_memory:
        return None, f"structure {f.name('structure')!r} is not the linear matrix memory"
    if f.update != "gd":
        return None, (f"algorithm {f.name('algorithm')!r} is not core:gd (fla's chunk ops take one "
                      "delta or write step per token, no momentum)")
    if f.anchored:
        return None, (f"the rule is anchored (anchor = {f.anchor}); fla's ops compute the per-token "
                      "rule (anchor = 1)")
    if f.windowed:
        return None, f"bias {f.name('bias')!r} has a window of {f.window} tokens (fla's ops: one)"
    if f.read != "after":
        return None, (f"read = {f.read!r}: fla's ops read the memory after the token's update "
                      "(o_t = S_t^T q_t)")
    if not f.retention_linear or f.per_token_transition:
        return None, f"retention {f.name('retention')!r} is not a linear decay"
    if f.error == "dot":
        return ("gla" if f.retention_shape == "key" else "simple_gla"), ""
    if f.error != "l2":
        return None, (f"bias {f.name('bias')!r}: fla's chunk ops compute the l2 (delta rule) and dot "
                      "(linear attention) errors")
    decayed = f.retention_gated or f.retention_shape == "key"
    if decayed and f.gradient_at != "retained":
        return None, (
            f"retention {f.name('retention')!r} with the l2 bias takes the gradient at M_(t-1) "
            "before the decay (Titans' order); fla's gated delta rule and KDA decay first "
            "(zoo:decay_first, zoo:key_decay_first): another rule")
    if f.retention_shape == "key":
        return "kda", ""
    return ("gated_delta_rule" if decayed else "delta_rule"), ""


def operand_dtype(p):
    """The dtype of q, k, v and beta handed to fla: the call's own half dtype, else float32."""
    import torch

    return p.out_dtype if p.out_dtype in (torch.bfloat16, torch.float16) else torch.float32


def fla_entry(op: str, dtype=None):
    """fla's entry point for ``op`` (imported now), and the op actually called: a float32
    delta-rule call goes to ``chunk_gated_delta_rule`` (see the module docstring)."""
    import importlib

    import torch

    if op == "delta_rule" and dtype == torch.float32:
        op = "gated_delta_rule"
    module, attr = OPS[op]
    return getattr(importlib.import_module(module), attr), op


def run_op(op: str, rule, p):
    """``(y [B, H, T, Dv], M [B, H, Dv, Dk])`` of the rule's call ``p`` computed by fla's ``op``
    (every step an autograd op, so gradients reach q, k, v, the gates and the initial state)."""
    import torch

    from atlas_core.forms.decay import log_tiny

    f = rule.form
    dt = operand_dtype(p)
    fn, called = fla_entry(op, dt)

    def t(x):  # [B, H, T, ...] -> [B, T, H, ...], fla's layout
        return x.transpose(1, 2).contiguous()

    lag0 = rule.bias.lag_weights(p.v.dtype, p.v.device)[0]
    w = p.gates[f.gate("step_size")] * p.gamma * lag0  # [B, H, T]
    q, k, v = t(p.psi).to(dt), t(p.phik), t(p.v).to(dt)
    s0 = p.state["M"].transpose(-1, -2).contiguous().float()  # S = M^T: [B, H, Dk, Dv]
    common = dict(scale=1.0, initial_state=s0, output_final_state=True)
    if op in ("gla", "simple_gla"):
        k = (k * t(w).unsqueeze(-1)).to(dt)  # the write w v k^T = v (w k)^T
        if op == "gla":
            o, S = fn(q, k, v, t(log_tiny(p.alpha)).float(), **common)
        else:
            g = t(log_tiny(p.alpha)).float() if f.retention_gated else None
            o, S = fn(q, k, v, g=g, **common)
    else:
        k, beta = k.to(dt), t(w).to(dt)
        if op == "delta_rule" and called == "delta_rule":
            o, S = fn(q, k, v, beta, use_qk_l2norm_in_kernel=False, **common)
        else:  # gated_delta_rule, kda, and a float32 delta rule (g = 0)
            if op == "delta_rule":
                g = q.new_zeros(q.shape[:3], dtype=torch.float32)
            else:
                g = t(log_tiny(p.alpha)).float()
            o, S = fn(q, k, v, g, beta, use_qk_l2norm_in_kernel=False, **common)
    y = o.transpose(1, 2).to(p.v.dtype)  # [B, H, T, Dv]
    M = S.transpose(-1, -2).to(p.state["M"].dtype)  # [B, H, Dv, Dk]
    return y, M
