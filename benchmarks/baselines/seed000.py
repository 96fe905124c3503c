"""Baseline: the seed 000 ("Atlas-RNN") parallel algorithm, which materialises ``[BH, T, d, d]``.

Written from the seed's description (``../shared/seeds/000_*.txt``, "Parallelization via Efficient
Scalar Scan", ``efficient_forward``), in this project's conventions so that its output can be
checked against ``core:sequential``:

    pred  = S_ref phi_t                  every gradient at S_ref = S_0, the memory at the call's start
    g_t   = (pred_t - v_t) phi_t^T * w_t  [B, H, T, Dv, Dk]   (w_t = gamma_t * lag[0])
    g     = sliding_sum(g, c)            the Omega window over the last c per-token gradients
    Z_all = scalar_scan(eta, theta g, Z_0)      momentum (docs/math.md's core:momentum: theta inside Z;
                                                the seed writes lr outside, which differs when the
                                                learning rate changes per token)
    S_all = scalar_scan(alpha, -Z_all, S_0)     (gd: scalar_scan(alpha, -theta g, S_0))
    y_t   = S_t psi_t  (read "after")  or  S_{t-1} psi_t  (read "before", the seed's retrieval)

``scalar_scan`` (``h_t = a_t h_{t-1} + x_t``) is the recursive odd/even associative scan of the
seed's scan dependency (the JAX-style ``associative_scan``): O(log T) depth, about 2T combines.
Every [B, H, T, Dv, Dk] intermediate is materialised: at T = 8192, d = 64 one of them is 128 MiB
per (batch x head) in float32 — the memory cost docs/math.md's chunkwise forms avoid.

Equivalence: taking every gradient of a call at the call's start memory is the rule with one
anchor block per call: the case's rule rebuilt with ``anchor = MAX_ANCHOR`` (2^20 tokens, longer
than any call), run from the start of a block. That is the rule this subject runs and times, and
the benchmark's gate checks, in float64 before timing, that it equals ``core:sequential`` on that
rule. A call that starts inside a block or is longer than the anchor is refused (the seed has no
way to carry a block across calls), and so is a per-token rule (anchor = 1): the seed computes
another function there. Supported rules: linear memory, l2 bias, decay or no retention, gd or
momentum, a window with a constant lag weight (``gamma = "gate"`` or ``"uniform"``). The benchmark
measures it on the titans, omega16 and delta rules.
"""

from __future__ import annotations

import torch
from einops import einsum

from atlas_core.bench import Check, Subject, check_against_rule
from atlas_core.bench.cases import Case, Inputs


def _combine(left, right):
    """(a1, x1) then (a2, x2): h -> a2 (a1 h + x1) + x2."""
    a1, x1 = left
    a2, x2 = right
    return a1 * a2, a2.view(*a2.shape, *(1,) * (x2.dim() - a2.dim())) * x1 + x2


def _interleave(even, odd, dim):
    """even[0], odd[0], even[1], odd[1], ... along ``dim`` (len(even) = len(odd) or one more)."""
    n = even.shape[dim] + odd.shape[dim]
    if odd.shape[dim] < even.shape[dim]:
        odd = torch.cat([odd, torch.zeros_like(even.narrow(dim, 0, 1))], dim=dim)
    out = torch.stack([even, odd], dim=dim + 1).flatten(dim, dim + 1)
    return out.narrow(dim, 0, n)


def associative_scan(a: torch.Tensor, x: torch.Tensor, dim: int = 2):
    """Inclusive scan of ``h_t = a_t h_{t-1} + x_t`` (h_{-1} = 0) along ``dim``; a: [B, H, T]."""
    n = a.shape[dim]
    if n < 2:
        return a, x

    def sl(t, start, stop=None, step=1):
        idx = [slice(None)] * t.dim()
        idx[dim] = slice(start, stop, step)
        return t[tuple(idx)]

    reduced = _combine((sl(a, 0, -1, 2), sl(x, 0, -1, 2)), (sl(a, 1, None, 2), sl(x, 1, None, 2)))
    odd_a, odd_x = associative_scan(*reduced, dim=dim)
    if n % 2 == 0:
        even_a, even_x = _combine((sl(odd_a, 0, -1), sl(odd_x, 0, -1)), (sl(a, 2, None, 2), sl(x, 2, None, 2)))
    else:
        even_a, even_x = _combine((odd_a, odd_x), (sl(a, 2, None, 2), sl(x, 2, None, 2)))
    even_a = torch.cat([sl(a, 0, 1), even_a], dim=dim)
    even_x = torch.cat([sl(x, 0, 1), even_x], dim=dim)
    return _interleave(even_a, odd_a, dim), _interleave(even_x, odd_x, dim)


def scalar_scan(a: torch.Tensor, x: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    """``h_t = a_t h_{t-1} + x_t`` from ``h0``: a [B, H, T], x [B, H, T, d, d], h0 [B, H, d, d]."""
    cum_a, h = associative_scan(a, x, dim=2)
    return h + cum_a[..., None, None] * h0.unsqueeze(2)


def sliding_sum(g: torch.Tensor, window: int, T: int) -> torch.Tensor:
    """Sum over the last ``window`` entries along time (dim 2) of ``g: [B, H, (c-1) + T, ...]``."""
    cs = torch.cumsum(g, dim=2)
    zero = torch.zeros_like(cs[:, :, :1])
    cs = torch.cat([zero, cs], dim=2)
    return cs[:, :, window:] - cs[:, :, : cs.shape[2] - window][:, :, -T:]


def seed000_forward(rule, p):
    """The seed's algorithm on a rule's prepared inputs ``p`` (`atlas_core.rule.MemoryInputs`):
    returns ``(y [B, H, T, Dv], state)`` like a strategy. The call must be one anchor block: it
    starts at a block boundary and is no longer than the rule's anchor."""
    from atlas_core.errors import StrategyError

    B, H, T = p.shape
    A = getattr(rule, "anchor", 1)
    if rule.position(p) != 0 or T > A:
        raise StrategyError(
            f"seed000 takes every gradient of a call at the call's start memory: that is this rule "
            f"(anchor = {A}) only for a call that starts a block and has at most {A} tokens; this "
            f"call starts {rule.position(p)} tokens into a block and has {T}")
    c = rule.window
    S0 = p.state["M"]
    momentum = rule.algorithm.linear_form == "momentum"
    lag0 = rule.bias.lag_weights(p.v.dtype, p.v.device)[0]
    pred = einsum(S0, p.phik, "b h d e, b h t e -> b h t d")
    err = pred - p.v
    g = einsum(err, p.phik, "b h t i, b h t j -> b h t i j")  # [B, H, T, Dv, Dk]
    g = g * (p.gamma * lag0)[..., None, None]
    if c > 1:
        gamma_w, k_w, v_w = (p.state[f"window.{n}"] for n in ("gamma", "k", "v"))
        e_w = einsum(S0, k_w, "b h d e, b h t e -> b h t d") - v_w
        prev = einsum(e_w, k_w, "b h t i, b h t j -> b h t i j") * (gamma_w * lag0)[..., None, None]
        g = sliding_sum(torch.cat([prev, g], dim=2), c, T)
    theta = p.gates["theta"][..., None, None]
    if momentum:
        Z_all = scalar_scan(p.gates["eta"], theta * g, p.state["Z.M"])
        S_all = scalar_scan(p.alpha, -Z_all, S0)
        opt = {"Z.M": Z_all[:, :, -1]}
    else:
        S_all = scalar_scan(p.alpha, -theta * g, S0)
        opt = {}
    if rule.read == "after":
        y = einsum(S_all, p.psi, "b h t d e, b h t e -> b h t d")
    else:
        y0 = einsum(S0, p.psi[:, :, :1], "b h d e, b h t e -> b h t d")
        y = torch.cat([y0, einsum(S_all[:, :, :-1], p.psi[:, :, 1:], "b h t d e, b h t e -> b h t d")], 2)
    xk, xv, xg = rule._extended(p)
    W = {"M": S_all[:, :, -1]}
    anchored = rule.anchor_state(p, {"M": S0}, W) if A > 1 else None
    return y, rule._final_state(W, opt, xk, xv, xg, anchored)


class Seed000Strategy:
    """The algorithm as a strategy object (``rule(..., strategy=Seed000Strategy())``)."""

    name = "seed000"

    def supports(self, rule) -> tuple[bool, str]:
        from atlas_core.components.l2 import L2Bias

        if not getattr(rule, "structure", None) or not rule.structure.is_linear:
            return False, "the seed's closed-form gradient is for linear (matrix) memory"
        if getattr(rule, "anchor", 1) == 1:
            return False, ("the seed takes every gradient of a call at the call's start memory: the "
                           "rule with one anchor block per call, not the per-token rule (anchor = 1)")
        inner = getattr(rule.bias, "inner", rule.bias)
        if type(inner).error is not L2Bias.error:
            return False, "the seed's gradient is the l2 (delta-rule) one"
        if getattr(rule.algorithm, "linear_form", None) not in ("gd", "momentum"):
            return False, "the seed has gd and momentum only"
        lag = rule.bias.lag_weights(torch.float64, torch.device("cpu"))
        if not torch.all(lag == lag[0]):
            return False, "the seed's window is a plain sliding sum (a constant lag weight)"
        if not rule.retention.linear:
            return False, "the seed's retention is a scalar decay"
        return True, ""

    def run(self, rule, inputs):
        return seed000_forward(rule, inputs)


class Seed000Subject(Subject):
    """The seed's algorithm on the case's rule with one anchor block per call (``anchor``)."""

    group = "baseline"
    name = "seed000 (materialises [BH,T,d,d])"

    def __init__(self, cases=("titans", "omega16", "delta")) -> None:
        from atlas_core.rule import MAX_ANCHOR

        self.cases = set(cases)
        self.strategy = Seed000Strategy()
        self.anchor = MAX_ANCHOR  # every call of the benchmark is one block

    def supports(self, case: Case) -> tuple[bool, str]:
        if case.kind != "rule" or case.name not in self.cases:
            return False, "measured on the titans, omega16 and delta rules"
        return self.strategy.supports(case.rule(2, 8, 8, anchor=self.anchor))

    def forward(self, rule, inp: Inputs) -> torch.Tensor:
        return rule(inp.q, inp.k, inp.v, gates=inp.gates, strategy=self._strategy())[0]

    def _strategy(self):
        from atlas_core.strategies.base import Strategy

        s = Strategy()
        s.name, s.supports, s.run = self.name, self.strategy.supports, self.strategy.run
        return s

    def check(self, case: Case) -> Check:
        def run(rule, inp, strategy, state=None):
            s = self._strategy() if strategy is None else strategy
            return rule(inp.q, inp.k, inp.v, gates=inp.gates, state=state, strategy=s)

        # one call (a split call would start inside the block, which the seed refuses)
        return check_against_rule(case, run, None, anchor=self.anchor, split=False, T=37)

    def memory_estimate(self, case: Case, sizes: dict[str, int], T: int, train: bool = True) -> int:
        # measured with the benchmark's live-tensor counter at small T (float32):
        # about 11 (fwd+bwd) and 6 (fwd) tensors of [B, H, T, Dv, Dk]
        one = sizes["B"] * sizes["H"] * T * sizes["Dv"] * sizes["Dk"] * 4
        return int(one * (FACTOR_TRAIN if train else FACTOR_FWD))


FACTOR_TRAIN, FACTOR_FWD = 11.5, 6.5


def subjects(config=None) -> list[Subject]:
    return [Seed000Subject()]
