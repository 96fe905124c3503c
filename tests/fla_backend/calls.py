"""Random calls of the mapped presets, and running them through a backend or a strategy."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import atlas_core as ac
from atlas_core.backends import bind_backends
from atlas_core.strategies.base import resolve_strategy

B, H, D = 2, 2, 16
#: preset -> the fla backend that computes it
PRESETS = {
    "zoo:deltanet": "fla:delta_rule",
    "zoo:longhorn": "fla:delta_rule",
    "zoo:gated_deltanet": "fla:gated_delta_rule",
    "zoo:gated_delta_product": "fla:gated_delta_rule",
    "zoo:kda": "fla:kda",
    "zoo:gla": "fla:gla",
    "zoo:simple_gla": "fla:simple_gla",
    "zoo:retnet": "fla:simple_gla",
    "zoo:linear_attention": "fla:simple_gla",
}


def rule_of(preset, **keys):
    spec = {"use": preset, **keys} if keys else preset
    return ac.build_rule(spec, heads=H, d_key=D, d_value=D)


def call(rule, T, seed=0, dtype=torch.float32, B=B):
    """``(q, k, v, gates, state)``, leaves that require grad: unit keys, retain factors in
    (0.5, 1), write strengths in (0, 1), a small random initial memory."""
    g = torch.Generator().manual_seed(seed)
    n = rule.steps_per_token
    sub = (B, T, n, H) if n > 1 else (B, T, H)
    q = torch.randn(B, T, H, D, generator=g)
    k = F.normalize(torch.randn(*sub, D, generator=g), dim=-1)
    v = torch.randn(*sub, D, generator=g)
    retention = set(rule.form.retention_gates)
    gates = {}
    for gate in rule.gates:
        shape = (B, T, H) if gate.name in retention or n == 1 else sub
        shape = (*shape, D) if gate.shape == "key" else shape
        lo = 0.5 if gate.name in retention else 0.0
        gates[gate.name] = lo + (1 - lo) * torch.rand(*shape, generator=g)
    # a random memory; the other entries (a window's buffers, an anchor's position) as they start
    state = {key: 0.1 * torch.randn(x.shape, generator=g) if key == "M" else x
             for key, x in rule.init_state(B).items()}

    def leaf(x, dt=dtype):
        return x.to(dt).requires_grad_(True)

    return (leaf(q), leaf(k), leaf(v), {n_: leaf(x) for n_, x in gates.items()},
            {n_: leaf(x, torch.float32) if n_ == "M" else x for n_, x in state.items()})


def leaves(args):
    q, k, v, gates, state = args
    return [x for x in (q, k, v, *gates.values(), *state.values()) if x.requires_grad]


def through_backend(rule, strategy, backend, args):
    """The call run by ``backend`` under ``strategy``, as the strategy would hand it over: its
    verifier asked (it must accept), then its ``run``; returns the rule's ``(y, state)``."""
    q, k, v, gates, state = args
    strat = resolve_strategy(rule, strategy)
    p = rule.prepare(q, k, v, gates=gates, state=state)
    be = bind_backends(strat.name, backend).select(strat, rule, p)
    assert be is not None and be.name == backend
    return rule.finish(p, be.run(strat, rule, p))


def through(rule, strategy, args):
    q, k, v, gates, state = args
    return rule(q, k, v, gates=gates, state=state, strategy=strategy)


def split(args, sizes):
    """The call cut into consecutive calls of ``sizes`` tokens (state only for the first)."""
    q, k, v, gates, state = args
    out, t = [], 0
    for n in sizes:
        cut = slice(t, t + n)
        out.append((q[:, cut], k[:, cut], v[:, cut], {g: x[:, cut] for g, x in gates.items()}, state))
        t += n
    return out


def loss_and_grads(y, state, args):
    """A fixed weighted sum of the output and the final memory, and its gradients w.r.t. every leaf."""
    gen = torch.Generator().manual_seed(123)
    wy = torch.randn(y.shape, generator=gen).to(y.dtype)
    wm = torch.randn(state["M"].shape, generator=gen).to(state["M"].dtype)
    loss = (y * wy).float().sum() + (state["M"] * wm).float().sum()
    return torch.autograd.grad(loss, leaves(args), allow_unused=True, retain_graph=True)


def assert_same(a, b, args, rtol=1e-5, atol=1e-5, grad_tol=1e-4):
    """Outputs, final state and the gradients of one loss w.r.t. every input agree."""
    (ya, sa), (yb, sb) = a, b
    torch.testing.assert_close(ya, yb, rtol=rtol, atol=atol)
    assert set(sa) == set(sb)
    for key in sa:
        torch.testing.assert_close(sa[key], sb[key], rtol=rtol, atol=atol)
    ga, gb = loss_and_grads(ya, sa, args), loss_and_grads(yb, sb, args)
    for x, y in zip(ga, gb):
        assert (x is None) == (y is None)
        if x is not None:
            torch.testing.assert_close(x, y, rtol=grad_tol, atol=grad_tol)
