"""Context parallelism's ``relay`` mode (`atlas_core.distributed.context`): rank r waits for rank
r - 1's final state (point-to-point send / receive), runs its slice and sends its final state
on; the backward relays the gradient of each slice's initial state from the last rank back. Exact
for every rule (a deep memory, Muon, a bias other than l2); the slices run one after another."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .call import Call, add_grads, grads, leaf


def _send_state(tensors: list[torch.Tensor], call: Call, to: int) -> None:
    for t in tensors:
        dist.send(t.contiguous(), call.ranks[to], group=call.group)


def _recv_state(like: list[torch.Tensor], call: Call, frm: int) -> list[torch.Tensor]:
    out = []
    for t in like:
        buf = torch.empty_like(t)
        dist.recv(buf, call.ranks[frm], group=call.group)
        out.append(buf)
    return out


class Relay(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call: Call, *tensors):
        s0, q, k, v, gates, params = call.unpack(tensors)
        keys = call.state_keys
        init = [s0[key].detach() for key in keys]
        if call.rank > 0:
            init = _recv_state(init, call, call.rank - 1)
        with torch.enable_grad():
            s_in = [leaf(x) for x in init]
            xs = [leaf(x) for x in (q, k, v)]
            gs = {g: leaf(x) for g, x in gates.items()}
            y, out = call.run(*xs, gs, dict(zip(keys, s_in)))
        outs = [out[key] for key in keys]
        if call.rank + 1 < call.world:
            _send_state([o.detach() for o in outs], call, call.rank + 1)
        ctx.call, ctx.graph, ctx.leaves = call, (y, outs), (s_in, xs, gs, params)
        return (y.detach(), *[o.detach() for o in outs])

    @staticmethod
    def backward(ctx, gy, *gstate):
        call = ctx.call
        y, outs = ctx.graph
        s_in, xs, gs, params = ctx.leaves
        g_out = list(gstate)
        if call.rank + 1 < call.world:  # the gradient of the next slice's initial state
            later = _recv_state([o.detach() for o in outs], call, call.rank + 1)
            g_out = [add_grads(g, x) for g, x in zip(g_out, later)]
        x_leaves = [*xs, *[gs[g] for g in call.gate_names], *params]
        got = grads([y, *outs], [*s_in, *x_leaves], [gy, *g_out], retain=False)
        g_in, g_x = got[:len(s_in)], got[len(s_in):]
        if call.rank > 0:
            _send_state([g if g is not None else torch.zeros_like(s) for g, s in zip(g_in, s_in)],
                        call, call.rank - 1)
            g_in = [None] * len(s_in)
        ctx.graph = ctx.leaves = None
        return (None, *g_in, *g_x)
