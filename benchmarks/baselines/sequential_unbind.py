"""Baseline: the token-by-token loop of ``core:sequential`` with tokens taken apart by ``unbind``.

``ComposedRule.reference`` (what ``core:sequential`` runs) reads token t as a slice of the whole
sequence (``p.psi[:, :, t : t + 1]``, ``xk[:, :, t : t + c]``, ...). Autograd's backward of a slice
writes a zero gradient as large as the whole input before adding the token's part, so its backward
costs O(T) per token, O(T^2) in all: at T = 4096 that, not the arithmetic, dominates its fwd+bwd
time. This is the same loop (same knob calls, same order, so the same numbers) with every per-token
input cut once by ``unbind`` (window 1) or ``unfold`` (window c > 1), whose backward is one op: a
fair sequential baseline for speedups at long T. The benchmark's gate checks it against
``core:sequential`` (exact, float64) before timing it.
"""

from __future__ import annotations

import torch

from atlas_core.bench import Check, StrategySubject, Subject, check_against_rule
from atlas_core.bench.cases import Case, Inputs
from atlas_core.strategies.base import Strategy


def _tokens(x: torch.Tensor, c: int) -> list[torch.Tensor]:
    """Window-extended ``x: [B, H, (c-1) + T, ...]`` -> T tensors ``[B, H, c, ...]``."""
    if c == 1:
        return [t.unsqueeze(2) for t in x.unbind(2)]
    win = x.unfold(2, c, 1)  # [B, H, T, ..., c]
    if win.dim() > 4:
        win = win.movedim(-1, 3)
    return list(win.unbind(2))


def reference_unbind(rule, p):
    """``rule.reference(p)`` (anchor every token) with per-token inputs cut by unbind/unfold."""
    B, H, T = p.shape
    S, c = rule.structure, rule.window
    W = {k: p.state[k] for k in S.weight_shapes()}
    opt = {k: p.state[k] for k in rule.algorithm.init_opt(W)}
    xk, xv, xg = rule._extended(p)
    lag = rule.bias.lag_weights(p.v.dtype, p.v.device).flip(0)
    psi_t = [t.unsqueeze(2) for t in p.psi.unbind(2)]
    k_t, v_t, g_t = _tokens(xk, c), _tokens(xv, c), _tokens(xg, c)
    gates_t = {n: x.unbind(2) for n, x in p.gates.items()}
    alpha_t = p.alpha.unbind(2)
    ys = []
    for t in range(T):
        if rule.read == "before":
            ys.append(S.read(W, psi_t[t]))
        u = rule.bias.error(S.read(W, k_t[t]), v_t[t]) * (g_t[t] * lag).unsqueeze(-1)
        g = S.grad(W, k_t[t], u)
        W, opt = rule.algorithm.step(W, opt, g, alpha=alpha_t[t],
                                     gates={n: x[t] for n, x in gates_t.items()},
                                     retention=rule.retention)
        if rule.read == "after":
            ys.append(S.read(W, psi_t[t]))
    y = torch.cat(ys, dim=2) if ys else p.v.new_zeros(B, H, 0, S.d_out)
    return y, rule._final_state(W, opt, xk, xv, xg)


class SequentialUnbind(Strategy):
    name = "sequential loop (unbind)"

    def supports(self, rule) -> tuple[bool, str]:
        ok = all(hasattr(rule, a) for a in ("structure", "bias", "algorithm", "_extended"))
        return (True, "") if ok else (False, "a knob-composed rule")

    def run(self, rule, inputs):
        return reference_unbind(rule, inputs)


class SequentialUnbindSubject(StrategySubject):
    group = "baseline"
    is_sequential = True  # capped at the benchmark's seq_max like core:sequential

    def __init__(self, cases=("titans", "delta")) -> None:
        super().__init__(SequentialUnbind(), label="sequential loop (unbind)")
        self.cases = set(cases)

    def supports(self, case: Case) -> tuple[bool, str]:
        if case.name not in self.cases:
            return False, "measured on the titans and delta rules"
        return super().supports(case)

    def check(self, case: Case) -> Check:
        def run(rule, inp, strategy):
            return rule(inp.q, inp.k, inp.v, gates=inp.gates,
                        strategy=self.strategy if strategy is None else strategy)

        return check_against_rule(case, run, None, exact_only=True)

    def memory_estimate(self, case, sizes, T, train=True):
        return None


def subjects(config=None) -> list[Subject]:
    return [SequentialUnbindSubject()]
