"""Deliberately broken components: each breaks one contract, and the kit must name the check.

Registered through ordinary plugin modules (see `conftest.plugin_module`), with factories given
as callables (these modules are not importable by a "module:attribute" string).
"""

from __future__ import annotations

import dataclasses

import torch

from atlas_core.components.l2 import L2Bias
from atlas_core.components.linear import LinearMemory
from atlas_core.knobs import Retention
from atlas_core.knobs.gates import ALPHA
from atlas_core.rule import ComposedRule
from atlas_core.strategies.chunkwise import Chunkwise, ChunkwiseParams


class NoRetentionChunkwise(Chunkwise):
    """A chunkwise path that forgets the retention inside chunks: differs from sequential."""

    name = "broken:chunkwise"

    def run_torch(self, rule, p):
        return super().run_torch(rule, dataclasses.replace(p, alpha=torch.ones_like(p.alpha)))


class ForgetfulChunkwise(Chunkwise):
    """A chunkwise path that ignores the state it is given (starts every call empty)."""

    name = "broken:forgetful"

    def run_torch(self, rule, p):
        B = p.v.shape[0]
        empty = rule.init_state(B, dtype=p.v.dtype, device=p.v.device)
        return super().run_torch(rule, dataclasses.replace(p, state=empty))


class PermissiveChunkwise(Chunkwise):
    """Accepts a per-token rule (anchor = 1) at any chunk size and runs it with every gradient of a
    chunk at the chunk's start: the old anchored approximation, another function than the rule's."""

    name = "broken:permissive"

    def supports(self, rule):
        if getattr(rule, "anchor", 1) == 1 and hasattr(rule, "structure"):
            return Chunkwise(ChunkwiseParams(chunk_size=1)).supports(rule)
        return super().supports(rule)


class UnalignedChunkwise(Chunkwise):
    """Chunkwise that starts a new chunk at every call, wherever the carried state says the call
    starts: right for one call from a block boundary, wrong for a call cut inside a chunk."""

    name = "broken:unaligned"

    def run(self, rule, inputs):
        return self.run_torch(rule, inputs)


class PeekingRule(ComposedRule):
    """A delta rule that writes v_{t+1} at token t: it reads the future."""

    def prepare(self, q, k, v, gates=None, state=None):
        inputs = super().prepare(q, k, v, gates=gates, state=state)
        inputs.v = torch.roll(inputs.v, shifts=-1, dims=2)  # [B, H, T, Dv]: token t sees t+1
        return inputs


class DetachedBias(L2Bias):
    """The l2 bias with the prediction detached: right forward, wrong backward."""

    def error(self, pred, v):
        return pred.detach() - v


class AscentBias(L2Bias):
    """Gradient ascent on the l2 loss: the memory grows without bound."""

    def error(self, pred, v):
        return -20.0 * (pred - v)


class SingularAlphaRetention(Retention):
    """A decay written as ``a (1 - a) / (1 - a)``: the retain factor everywhere but at alpha = 1,
    where it is 0 / 0 = NaN."""

    gates = (ALPHA,)

    def alpha(self, gates, like):
        a = gates["alpha"]
        return a * (1 - a) / (1 - a)


class SignSqrtRetention(Retention):
    """Keeps the memory, computed as ``sign(M) sqrt(M^2)``: the right value everywhere, but the
    gradient is NaN where a memory entry is exactly zero (0 / 0 in the derivative of sqrt)."""

    gates = (ALPHA,)
    linear = False

    def alpha(self, gates, like):
        return gates["alpha"]

    def pre(self, W):
        return {k: torch.sign(w) * torch.sqrt(w * w) for k, w in W.items()}


class Float32Bias(L2Bias):
    """The l2 bias computed in float32 whatever its inputs' dtype."""

    def error(self, pred, v):
        return (pred - v).float()


def _knobs(ctx):
    b = ctx.registry.build
    return (b("structure", "core:linear", path="s"), b("bias", "core:l2", path="b"),
            b("retention", "core:decay", path="r"), b("algorithm", "core:gd", path="a"),
            b("feature_map", "core:identity", path="f"))


def build_peeking_rule(params, ctx):
    return PeekingRule(*_knobs(ctx), spec={"use": "broken:peek"})


class DyingMemory(LinearMemory):
    """A two-factor memory ``M = W_b W_a`` whose factors are the state and decay toward zero (the
    form a deep memory had before its state became an offset): zero is absorbing, since each
    factor's gradient is multiplied by the other."""

    is_linear = False

    def bind(self, heads, d_in, d_out):
        super().bind(heads, d_in, d_out)
        g = torch.Generator().manual_seed(0)
        self.start = {"Wa": torch.randn(heads, d_in, d_in, generator=g) / d_in ** 0.5,
                      "Wb": torch.randn(heads, d_out, d_in, generator=g) / d_in ** 0.5}

    def weight_shapes(self):
        return {"Wa": (self.d_in, self.d_in), "Wb": (self.d_out, self.d_in)}

    def init_state(self, batch, *, dtype, device):
        return {k: w.to(dtype=dtype, device=device).unsqueeze(0).expand(batch, *w.shape).clone()
                for k, w in self.start.items()}

    def read(self, W, x):
        return (x @ W["Wa"].transpose(-1, -2)) @ W["Wb"].transpose(-1, -2)

    def read_per_token(self, Wt, x):
        h = torch.einsum("bhnoi,bhni->bhno", Wt["Wa"], x)
        return torch.einsum("bhnoi,bhni->bhno", Wt["Wb"], h)

    def grad(self, W, x, u):
        _, pull = torch.func.vjp(lambda w: self.read(w, x), dict(W))
        return pull(u)[0]

    def grad_per_token(self, W, x, u):
        def one(x1, u1):
            return self.grad(W, x1.unsqueeze(2), u1.unsqueeze(2))
        return torch.func.vmap(one, in_dims=(2, 2), out_dims=2)(x, u)


class ExplodingMemory(LinearMemory):
    """A linear memory that climbs its loss 100 times too steeply (the gradient's sign flipped and
    scaled): it grows without bound even at the default retention. Not declared linear, so every
    strategy takes its gradients from `grad` (the linear fast paths use the closed form)."""

    is_linear = False

    def grad(self, W, x, u):
        return {k: -100.0 * g for k, g in super().grad(W, x, u).items()}

    def grad_per_token(self, W, x, u):
        return {k: -100.0 * g for k, g in super().grad_per_token(W, x, u).items()}


def register_broken(registry):
    registry.add("structure", "dying", lambda params, ctx: DyingMemory(),
                 summary="a two-factor memory decayed toward an absorbing zero (broken)")
    registry.add("structure", "exploding", lambda params, ctx: ExplodingMemory(),
                 summary="a linear memory that climbs its loss (broken)")
    registry.add("strategy", "chunkwise", lambda params, ctx: NoRetentionChunkwise(params),
                 params=ChunkwiseParams, summary="chunkwise without retention (broken)")
    registry.add("strategy", "forgetful", lambda params, ctx: ForgetfulChunkwise(params),
                 params=ChunkwiseParams, summary="chunkwise that drops the initial state (broken)")
    registry.add("strategy", "permissive", lambda params, ctx: PermissiveChunkwise(params),
                 params=ChunkwiseParams, summary="chunkwise that changes per-token rules (broken)")
    registry.add("strategy", "unaligned", lambda params, ctx: UnalignedChunkwise(params),
                 params=ChunkwiseParams, summary="chunkwise that ignores where a call starts (broken)")
    registry.add("rule", "peek", build_peeking_rule, summary="a rule that reads v_{t+1} (broken)")
    registry.add("bias", "detached", lambda params, ctx: DetachedBias(), summary="wrong backward (broken)")
    registry.add("bias", "ascent", lambda params, ctx: AscentBias(), summary="unstable (broken)")
    registry.add("retention", "singular_alpha", lambda params, ctx: SingularAlphaRetention(),
                 summary="a decay that is NaN at alpha = 1 (broken)")
    registry.add("retention", "sign_sqrt", lambda params, ctx: SignSqrtRetention(),
                 summary="a retention whose gradient is NaN at a zero memory entry (broken)")
    registry.add("bias", "float32", lambda params, ctx: Float32Bias(),
                 summary="an l2 bias that returns float32 for float64 inputs (broken)")
    registry.add("bias", "false_claim", lambda params, ctx: L2Bias(), summary="a reduction that is false",
                 reductions=[{"name": "is_dot", "equals": {"bias": "core:dot"}}])
    registry.add("bias", "malformed", lambda params, ctx: L2Bias(), summary="a malformed reduction",
                 reductions=[{"name": "typo", "equal": {"bias": "core:l2"}}])
