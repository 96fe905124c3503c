"""`ComposedRule`: a rule composed from the MIRAS knobs (structure, bias, retention, algorithm,
feature map), its call (`MemoryInputs`: the call normalised for strategies) and its readable
reference loop. The call contract and the public names are `atlas_core.rule`'s; building one from
a spec is `atlas_core.rule_build.build_rule`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any, Mapping

import torch
from einops import rearrange

from . import input_checks
from .errors import Issue, SpecError, did_you_mean
from .forms.rule_form import RuleForm
from .knobs import Algorithm, Bias, FeatureMap, Retention, Structure
from .knobs.gates import declared_gates as _declared_gates
from .knobs.gates import merge_gates
from .rule_base import Rule

KNOB_KINDS = {
    "structure": "structure",
    "bias": "bias",
    "retention": "retention",
    "algorithm": "algorithm",
    "feature_map": "feature_map",
}
KNOB_DEFAULTS = {
    "structure": "core:linear",
    "bias": "core:l2",
    "retention": "core:none",
    "algorithm": "core:gd",
    "feature_map": "core:identity",
    "read": "after",
    "anchor": 1,
}
RULE_KEYS = tuple(KNOB_DEFAULTS) + ("steps_per_token", "use", "parallel")
MAX_ANCHOR = 1 << 20  # a block longer than any sequence a model will see is a spec mistake
MAX_STEPS = 64  # Householder steps per token: more is a spec mistake, not a rule
ANCHOR_POS = "anchor.pos"


def check_anchor(value: Any, path: str = "anchor") -> list[Issue]:
    """Problems with an ``anchor`` value (an int in 1 .. MAX_ANCHOR)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return [Issue(path, "must be a whole number of tokens >= 1", value,
                      "anchor = 1 is the per-token rule; anchor = 64 takes every gradient of a "
                      "64-token block at the block's start")]
    if not 1 <= value <= MAX_ANCHOR:
        return [Issue(path, f"must be between 1 and {MAX_ANCHOR}", value)]
    return []


def check_steps(value: Any, path: str = "steps_per_token") -> list[Issue]:
    """Problems with a ``steps_per_token`` value (an int in 1 .. MAX_STEPS)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_STEPS:
        return [Issue(path, f"must be a whole number of sub-steps between 1 and {MAX_STEPS}", value,
                      "steps_per_token = 1 is one step per token; Gated DeltaProduct uses 2 or 3")]
    return []


@dataclass
class MemoryInputs:
    """A composed rule's call, normalised: time-major per head, feature maps applied."""

    psi: torch.Tensor  # phi(q): [B, H, T, Dphi]
    phik: torch.Tensor  # phi(k): [B, H, T, Dphi]
    v: torch.Tensor  # [B, H, T, Dv]
    alpha: torch.Tensor  # retain factor: [B, H, T], or [B, H, T, Dphi] per key (alpha_shape "key")
    gamma: torch.Tensor  # per-token loss weight (the bias's `weight`; 1 without one): [B, H, T]
    gates: dict[str, torch.Tensor]  # every gate, [B, H, T] ([B, H, T, Dk] for a key gate)
    state: dict[str, torch.Tensor]  # full state, compute dtype
    out_dtype: torch.dtype = torch.float32

    @property
    def shape(self) -> tuple[int, int, int]:
        B, H, T, _ = self.v.shape
        return B, H, T

    def split(self, n: int) -> tuple["MemoryInputs", "MemoryInputs"]:
        """The first ``n`` tokens and the rest (both with this call's state: a strategy that
        runs the head first hands its final state to the tail with ``dataclasses.replace``)."""
        def cut(x, lo, hi):
            return x.narrow(2, lo, hi - lo)

        T = self.shape[2]
        parts = []
        for lo, hi in ((0, n), (n, T)):
            parts.append(replace(
                self, psi=cut(self.psi, lo, hi), phik=cut(self.phik, lo, hi), v=cut(self.v, lo, hi),
                alpha=cut(self.alpha, lo, hi), gamma=cut(self.gamma, lo, hi),
                gates={k: cut(g, lo, hi) for k, g in self.gates.items()},
            ))
        return parts[0], parts[1]


#: the attributes a rule's form is read from: replacing one recomputes `ComposedRule.form`
_FORM_INPUTS = frozenset(("structure", "bias", "retention", "algorithm", "feature_map", "anchor",
                          "read", "steps_per_token", "gates"))


def _check_tensor(name: str, x: Any, rank: int, layout: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor {layout}, got {type(x).__name__}")
    if x.dim() != rank:
        raise ValueError(f"{name} must have {rank} dimensions {layout}, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    return x


class ComposedRule(Rule):
    """A memory rule composed from structure, bias, retention, algorithm and feature map."""

    composed = True

    def __init__(
        self,
        structure: Structure,
        bias: Bias,
        retention: Retention,
        algorithm: Algorithm,
        feature_map: FeatureMap,
        read: str = "after",
        spec: Mapping[str, Any] | None = None,
        default_strategy: Any = "core:sequential",
        anchor: int = 1,
        steps_per_token: int = 1,
    ) -> None:
        super().__init__()
        if read not in ("after", "before"):
            raise SpecError([Issue("read", "must be 'after' or 'before'", read)])
        bad = check_anchor(anchor) + check_steps(steps_per_token)
        if bad:
            raise SpecError(bad)
        self.anchor = int(anchor)
        self.steps_per_token = int(steps_per_token)
        self.structure = structure
        self.feature_map = feature_map
        self.bias = bias
        self.retention = retention
        self.algorithm = algorithm
        self.read = read
        self.spec = dict(spec or {})
        self.default_strategy = default_strategy
        problems = []
        for knob_name in ("structure", "bias", "retention", "algorithm", "feature_map"):
            for msg in getattr(self, knob_name).check_composition(self) or []:
                problems.append(Issue(knob_name, msg, self.spec.get(knob_name)))
        try:
            self.gates = merge_gates((k, _declared_gates(getattr(self, k)))
                                     for k in ("retention", "algorithm", "bias"))
        except ValueError as exc:
            problems.append(Issue("", str(exc), None))
        if self.retention.gradient_at == "retained" and self.anchor != 1:
            problems.append(Issue(
                "anchor", f"retention {self.spec.get('retention')!r} takes the gradient at the decayed "
                "memory of each token, which an anchor block cannot share", self.anchor, "use anchor = 1"))
        if self.steps_per_token > 1 and self.retention.per_token_transition:
            problems.append(Issue(
                "steps_per_token", f"retention {self.spec.get('retention')!r} maps the memory by "
                "its own per-token transition, which the sub-steps of a token cannot share",
                self.steps_per_token, "use steps_per_token = 1 or a scalar-decay retention"))
        if problems:
            raise SpecError(problems)
        if self.steps_per_token > 1:  # the retention's gates stay per token, the others per step
            kept = {g.name for g in _declared_gates(self.retention)}
            self.step_gates = tuple(g.name for g in self.gates if g.name not in kept)
        self._gate_shapes = {g.name: g.shape for g in self.gates}
        self.form = RuleForm.of(self)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in _FORM_INPUTS and "form" in self.__dict__:  # a knob replaced after the build
            self.form = RuleForm.of(self)

    # -- sizes ----------------------------------------------------------------------------------
    @property
    def window(self) -> int:
        return int(self.bias.window)

    def bind(self, heads: int, d_key: int, d_value: int) -> "ComposedRule":
        """Fix the sizes; creates learned parameters of the feature map and structure."""
        if self.structure.bound:
            want = (self.structure.heads, self.feature_map.d_in, self.structure.d_out)
            if want != (heads, d_key, d_value):
                raise ValueError(
                    f"this rule is bound to heads={want[0]}, Dk={want[1]}, Dv={want[2]}; "
                    f"got heads={heads}, Dk={d_key}, Dv={d_value}"
                )
            return self
        self.feature_map.bind(d_key)
        self.structure.bind(heads, self.feature_map.out_dim(d_key), d_value)
        return self

    def state_keys(self) -> list[str]:
        W = list(self.structure.weight_shapes())
        keys = W + list(self.algorithm.init_opt({k: torch.empty(0) for k in W}))
        if self.window > 1:
            keys += ["window.k", "window.v", "window.gamma"]
        if self.anchor > 1:
            keys += [ANCHOR_POS] + [f"anchor.{k}" for k in W]
        return keys

    def single_step(self, inputs: "MemoryInputs") -> bool:
        return inputs.shape[2] == self.steps_per_token

    # -- anchoring ------------------------------------------------------------------------------
    def position(self, inputs: "MemoryInputs") -> int:
        """Tokens already run inside the current anchor block (0 with ``anchor = 1``)."""
        if self.anchor == 1:
            return 0
        pos = inputs.state[ANCHOR_POS]
        return int(pos[0]) if pos.numel() else 0

    def anchor_weights(self, inputs: "MemoryInputs", W: dict) -> dict:
        """The memory the first token of this call takes its gradient at: the block's anchor
        memory when the call starts inside a block, else the current memory."""
        if self.position(inputs) == 0:
            return W
        return {k: inputs.state[f"anchor.{k}"] for k in W}

    def anchor_state(self, inputs: "MemoryInputs", anchor: dict, W: dict) -> dict:
        """The anchor entries of the final state after this call: the position inside the block
        and the block's anchor memory (the current memory when the next token starts a block)."""
        if self.anchor == 1:
            return {}
        B, _, T = inputs.shape
        pos = (self.position(inputs) + T) % self.anchor
        held = anchor if pos else W
        out = {ANCHOR_POS: inputs.state[ANCHOR_POS].new_full((B,), float(pos))}
        out.update({f"anchor.{k}": w for k, w in held.items()})
        return out

    def init_state(self, batch: int, *, dtype=torch.float32, device=None) -> dict:
        """The state before the first token: memory at its initial value, zeros elsewhere."""
        if not self.structure.bound:
            raise ValueError(
                "the rule's sizes are not known yet: build it with build_rule(..., heads=H, "
                "d_key=Dk, d_value=Dv) or call it once before asking for its initial state"
            )
        device = torch.device(device) if device is not None else torch.device("cpu")
        W = self.retention.start(self.structure.init_state(batch, dtype=dtype, device=device))
        state = dict(W)
        state.update(self.algorithm.init_opt(W))
        c = self.window
        if c > 1:
            H, dphi, dv = self.structure.heads, self.structure.d_in, self.structure.d_out
            state["window.k"] = torch.zeros(batch, H, c - 1, dphi, dtype=dtype, device=device)
            state["window.v"] = torch.zeros(batch, H, c - 1, dv, dtype=dtype, device=device)
            # gamma 0 marks an empty slot: an empty slot contributes nothing
            state["window.gamma"] = torch.zeros(batch, H, c - 1, dtype=dtype, device=device)
        if self.anchor > 1:
            state[ANCHOR_POS] = torch.zeros(batch, dtype=dtype, device=device)
            state.update({f"anchor.{k}": w.clone() for k, w in W.items()})
        return state

    # -- the call -------------------------------------------------------------------------------
    def prepare(self, q, k, v, gates=None, state=None) -> MemoryInputs:
        input_checks.check_containers(gates, state)
        if self.steps_per_token > 1:  # one position per sub-step from here on
            q, k, v, gates = self._expand_steps(q, k, v, dict(gates or {}))
        layout = "[B, T, H, D]"
        q = _check_tensor("q", q, 4, layout)
        k = _check_tensor("k", k, 4, layout)
        v = _check_tensor("v", v, 4, layout)
        if q.shape != k.shape:
            raise ValueError(f"q and k must have the same shape [B, T, H, Dk]; got q {tuple(q.shape)}, k {tuple(k.shape)}")
        if v.shape[:3] != q.shape[:3]:
            raise ValueError(f"v must be [B, T, H, Dv] with the B, T, H of q {tuple(q.shape[:3])}; got v {tuple(v.shape)}")
        for name, x in (("k", k), ("v", v)):
            if x.dtype != q.dtype:
                raise ValueError(f"{name} has dtype {x.dtype} but q has {q.dtype}; pass one dtype")
            if x.device != q.device:
                raise ValueError(f"{name} is on {x.device} but q is on {q.device}; pass one device")
        B, T, H, Dk = q.shape
        Dv = v.shape[-1]
        if self.structure.bound:
            self.bind(H, Dk, Dv)  # refuses other sizes
        cdtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        gates = dict(gates or {})
        unknown = sorted(set(gates) - set(self.gate_names))
        if unknown:
            hint = did_you_mean(unknown[0], self.gate_names)
            raise ValueError(
                f"gates {unknown} are not used by this rule (it uses {list(self.gate_names) or 'none'})"
                + (f"; {hint}" if hint else "")
            )
        missing = [g for g in self.gate_names if g not in gates]
        if missing:
            raise ValueError(
                f"missing gates {missing}: this rule needs {list(self.gate_names)}, each [B, T, H] = "
                f"[{B}, {T}, {H}]" + "".join(
                    f"; {n!r} is declared per key: [B, T, H, Dk] = [{B}, {T}, {H}, {Dk}]"
                    for n in self.gate_names if self._gate_shapes[n] == "key")
            )
        gh, gc = {}, {}
        for name, g in gates.items():
            if self._gate_shapes[name] == "key":  # declared per key dimension
                g = _check_tensor(f"gates['{name}']", g, 4, "[B, T, H, Dk] (a key gate)")
                if tuple(g.shape) != (B, T, H, Dk):
                    raise ValueError(f"gates['{name}'] is declared per key (shape 'key'): it must be "
                                     f"[B, T, H, Dk] = [{B}, {T}, {H}, {Dk}], got {tuple(g.shape)}")
                layout = "b t h d -> b h t d"
            else:
                g = _check_tensor(f"gates['{name}']", g, 3, "[B, T, H]")
                if tuple(g.shape) != (B, T, H):
                    raise ValueError(f"gates['{name}'] must be [B, T, H] = [{B}, {T}, {H}], got {tuple(g.shape)}")
                layout = "b t h -> b h t"
            if g.device != q.device:
                raise ValueError(f"gates['{name}'] is on {g.device} but q is on {q.device}")
            gc[name] = g.to(cdtype)
            gh[name] = rearrange(gc[name], layout)
        if not self.structure.bound:  # bound only by a call whose inputs passed validation
            if state is not None:  # check the state on a bound copy first
                probe = copy.deepcopy(self).bind(H, Dk, Dv)
                probe._check_state(state, B, cdtype, q.device)
            self.bind(H, Dk, Dv)
        ones = torch.ones(B, H, T, dtype=cdtype, device=q.device)
        # a retention without gates keeps everything; the bias's per-token weight (None: 1)
        alpha = self._alpha(gates, ones) if self.form.retention_gated else ones
        if self.steps_per_token > 1:  # the retention acts once per token, at its first sub-step
            alpha = self._first_substep(alpha)
        qf = self.feature_map(q.to(cdtype))
        kf = self.feature_map(k.to(cdtype))
        if self.bias.weight_reads_key:  # e.g. Longhorn's 1 / (1 + theta |phi(k)|^2)
            weight = self.bias.weight(gc, ones.transpose(1, 2), key=kf)
        else:
            weight = self.bias.weight(gc, ones.transpose(1, 2))
        gamma = ones if weight is None else rearrange(weight.to(cdtype), "b t h -> b h t")
        st = self._check_state(state, B, cdtype, q.device)
        return MemoryInputs(
            psi=rearrange(qf, "b t h d -> b h t d"),
            phik=rearrange(kf, "b t h d -> b h t d"),
            v=rearrange(v.to(cdtype), "b t h d -> b h t d"),
            alpha=alpha,
            gamma=gamma,
            gates=gh,
            state=st,
            out_dtype=q.dtype,
        )

    def _alpha(self, gates: dict, ones: torch.Tensor) -> torch.Tensor:
        """The retention's factor, time-major: ``[B, H, T]``, or ``[B, H, T, Dk]`` per key."""
        a = self.retention.alpha(gates, ones.transpose(1, 2)).to(ones.dtype)
        if self.retention.alpha_shape == "key":
            if a.dim() != 4 or a.shape[:3] != ones.transpose(1, 2).shape:
                raise ValueError(f"retention {self.spec.get('retention')!r} declares a per-key retain "
                                 f"factor [B, T, H, Dk]; its alpha() returned shape {tuple(a.shape)}")
            return rearrange(a, "b t h d -> b h t d")
        return rearrange(a, "b t h -> b h t")

    # -- sub-steps (steps_per_token = n > 1) ---------------------------------------------------------
    def _substep(self) -> int:
        """The sub-step whose read is the token's output: the last ("after"), the first ("before")."""
        return self.steps_per_token - 1 if self.read == "after" else 0

    def _expand_steps(self, q, k, v, gates: dict):
        """The call as one position per sub-step: k, v and the per-step gates ``[B, T, n, ...]`` ->
        ``[B, T n, ...]``; q sits at the reading sub-step (zero elsewhere: those reads are dropped);
        a per-token gate sits at the first sub-step and is 1 at the others (the retention acts
        once per token)."""
        n = self.steps_per_token
        q = _check_tensor("q", q, 4, "[B, T, H, Dk]")
        B, T, H, Dk = q.shape
        missing = [g for g in self.gate_names if g not in gates]
        if missing:
            raise ValueError(
                f"missing gates {missing}: this rule needs {list(self.gate_names)}; with "
                f"steps_per_token = {n} the gates {list(self.step_gates)} are per sub-step "
                f"[B, T, n, H] = [{B}, {T}, {n}, {H}] and the others per token [B, T, H] "
                f"(a gate declared per key adds Dk = {Dk})")
        want = f"[B, T, n, H, D] with n = steps_per_token = {n} and the B, T, H of q {(B, T, H)}"
        for name, x in (("k", k), ("v", v)):
            x = _check_tensor(name, x, 5, want)
            if (x.shape[:4] != (B, T, n, H)) or (name == "k" and x.shape[-1] != Dk):
                raise ValueError(f"{name} must be {want}" + (f" and Dk = {Dk}" if name == "k" else "")
                                 + f"; got {tuple(x.shape)}")
        slots = [torch.zeros_like(q)] * n
        slots[self._substep()] = q
        out = {}
        for name, g in gates.items():
            if not isinstance(g, torch.Tensor) or name not in self._gate_shapes:
                out[name] = g  # the general checks name the problem
                continue
            extra = (Dk,) if self._gate_shapes[name] == "key" else ()
            if name in self.step_gates:
                if tuple(g.shape) != (B, T, n, H, *extra):
                    raise ValueError(f"gates['{name}'] is per sub-step: it must be [B, T, n, H"
                                     f"{', Dk' if extra else ''}] = {[B, T, n, H, *extra]}, got {tuple(g.shape)}")
                out[name] = g.flatten(1, 2)
            else:
                if tuple(g.shape) != (B, T, H, *extra):
                    raise ValueError(f"gates['{name}'] is per token (the retention's): it must be "
                                     f"{[B, T, H, *extra]}, got {tuple(g.shape)}")
                out[name] = torch.stack([g] + [torch.ones_like(g)] * (n - 1), dim=2).flatten(1, 2)
        return torch.stack(slots, dim=2).flatten(1, 2), k.flatten(1, 2), v.flatten(1, 2), out

    def _first_substep(self, alpha: torch.Tensor) -> torch.Tensor:
        """``alpha: [B, H, T n, ...]`` with every sub-step after the first set to 1."""
        n = self.steps_per_token
        a = alpha.unflatten(2, (-1, n))
        return torch.cat([a[:, :, :, :1], torch.ones_like(a[:, :, :, 1:])], dim=3).flatten(2, 3)

    def _check_state(self, state, B, dtype, device) -> dict:
        ref = self.init_state(B, dtype=dtype, device=device)
        if state is None:
            return ref
        if not isinstance(state, Mapping):
            raise ValueError(f"state must be a mapping of named tensors, got {type(state).__name__}")
        if set(state) != set(ref):
            raise ValueError(
                f"state has keys {sorted(state)} but this rule's state has {sorted(ref)}; "
                "pass the state returned by an earlier call of the same rule"
            )
        out = {}
        for key, want in ref.items():
            got = state[key]
            if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                raise ValueError(f"state['{key}'] must have shape {tuple(want.shape)}, got {shape}")
            if got.device != want.device:
                raise ValueError(f"state['{key}'] is on {got.device} but the inputs are on {want.device}")
            out[key] = got.to(dtype)
        if self.anchor > 1:
            pos = out[ANCHOR_POS]
            if pos.numel() and not bool((pos == pos[0]).all()):
                raise ValueError(
                    f"state['{ANCHOR_POS}'] must hold one position for the whole batch, got "
                    f"{pos.tolist()}; run the sequences of a batch together"
                )
        return out

    def finish(self, inputs: MemoryInputs, output):
        y, state = output
        if self.steps_per_token > 1:  # one output per token: the read at its reading sub-step
            y = y[:, :, self._substep()::self.steps_per_token]
        return rearrange(y, "b h t d -> b t h d").to(inputs.out_dtype), state

    # -- the reference ----------------------------------------------------------------------------
    def reference(self, inputs: MemoryInputs):
        """The token-by-token loop of docs/math.md: the rule's function, which every strategy
        must equal. With ``anchor = A`` every gradient inside a block of A tokens (blocks aligned
        to absolute positions, carried across calls by the state) is taken at the memory before
        the block."""
        p = inputs
        B, H, T = p.shape
        S, c, A = self.structure, self.window, self.anchor
        W = {k: p.state[k] for k in S.weight_shapes()}
        opt = {k: p.state[k] for k in self.algorithm.init_opt(W)}
        xk, xv, xg = self.extended_inputs(p)
        lag = self.bias.lag_weights(p.v.dtype, p.v.device).flip(0)  # oldest .. newest
        # Per-token pieces are cut once (unbind / unfold), not sliced inside the loop: the backward
        # of a slice writes a zero gradient as long as the whole sequence, T of them cost O(T^2).
        psi_t = p.psi.unsqueeze(3).unbind(2)  # token t: [B, H, 1, Dphi]
        xw_t, vw_t = (_windows(x, c, T) for x in (xk, xv))  # the window ending at t: [B, H, c, .]
        wts_t = (_windows(xg, c, T) * lag).unbind(2) if T else ()  # [B, H, c]
        alpha_t = p.alpha.unbind(2)
        gates_t = {n: x.unbind(2) for n, x in p.gates.items()}
        ys = []
        pos0 = self.position(p)
        anchor = self.anchor_weights(p, W)
        retained = self.retention.gradient_at == "retained"
        # a per-key factor is applied by the structure before the step, which then keeps all
        per_key = self.retention.alpha_shape == "key"
        # a retention's own transition (RWKV-7) gives the retained memory; the step then keeps all
        moved = self.retention.per_token_transition
        ones_t = p.v.new_ones(B, H)
        for t in range(T):
            if (pos0 + t) % A == 0:
                anchor = W
            if self.read == "before":
                ys.append(S.read(W, psi_t[t]))
            gates_now = {n: x[t] for n, x in gates_t.items()}
            if retained:  # decay first, then the step from the decayed memory (Gated DeltaNet)
                W = self.retention.transition(W, gates_now) if moved else S.retain(W, alpha_t[t])
                anchor = W
            u = self.bias.error(S.read(anchor, xw_t[t]), vw_t[t]) * wts_t[t].unsqueeze(-1)
            g = S.grad(anchor, xw_t[t], u)
            if moved and not retained:  # the gradient was taken at M_{t-1}
                W = self.retention.transition(W, gates_now)
            elif per_key and not retained:  # M Diag(alpha): the structure decays its key axis
                W = S.retain(W, alpha_t[t])
            W, opt = self.algorithm.step(
                W, opt, g, alpha=ones_t if retained or per_key or moved else alpha_t[t],
                gates=gates_now, retention=self.retention,
            )
            if self.read == "after":
                ys.append(S.read(W, psi_t[t]))
        y = torch.cat(ys, dim=2) if ys else p.v.new_zeros(B, H, 0, S.d_out)
        return y, self.final_state(W, opt, xk, xv, xg, self.anchor_state(p, anchor, W))

    # -- for strategies (public: docs/plugins.md#the-rule-methods-a-strategy-may-call) -------------
    def extended_inputs(self, p: MemoryInputs):
        """``(phi(k), v, gamma)`` with the carried window (the state's last c - 1 inputs of a
        windowed bias) prepended: ``[B, H, (c-1) + T, ...]``; the call's own for c = 1."""
        if self.window == 1:
            return p.phik, p.v, p.gamma
        st = p.state
        return (
            torch.cat([st["window.k"], p.phik], dim=2),
            torch.cat([st["window.v"], p.v], dim=2),
            torch.cat([st["window.gamma"], p.gamma], dim=2),
        )

    def final_state(self, W, opt, xk, xv, xg, anchored: dict | None = None) -> dict:
        """The state after a call: weights ``W``, optimiser state ``opt``, the last c - 1 window
        inputs of ``(xk, xv, xg)`` (from `extended_inputs`) and, for an anchored rule,
        ``anchored`` (from `anchor_state`)."""
        if self.anchor > 1 and anchored is None:
            raise RuntimeError("an anchored rule's final state needs its anchor entries (anchor_state)")
        state = dict(W)
        state.update(opt)
        state.update(anchored or {})
        c = self.window
        if c > 1:
            state["window.k"] = xk[:, :, -(c - 1) :]
            state["window.v"] = xv[:, :, -(c - 1) :]
            state["window.gamma"] = xg[:, :, -(c - 1) :]
        return state

    # the names these methods had before they were public (plugins may still call them)
    _extended = extended_inputs
    _final_state = final_state

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.spec.items())


def _windows(x: torch.Tensor, c: int, T: int):
    """The c-token windows of an extended sequence ``x: [B, H, c - 1 + T, ...]``: window t holds
    positions t .. t + c - 1 (token t last). A tuple of T tensors ``[B, H, c, ...]`` for feature
    tensors; for a ``[B, H, c - 1 + T]`` tensor one stacked ``[B, H, T, c]`` tensor."""
    if x.dim() == 3:
        return x.unfold(2, c, 1)
    if T == 0:
        return ()
    return x.unfold(2, c, 1).movedim(-1, 3).unbind(2)

