"""One decoding step of each block of ``core:lm``, for ``x: [B, d]`` (one new token a row), with
the state in preallocated buffers (`atlas_core.decode.engine.Decoder` owns them).

- `MemoryStep`: a memory block whose rule is the delta rule family (a linear memory, the l2 error,
  gradient descent, no retention or a per-head decay before or after the gradient; identity
  feature map, one step a token, no rotary or feature map on q/k): its fused input projection,
  the short convolution on a rolling buffer, the gates the layer makes, then in place on the
  float32 memory ``M: [B, Hv, Dv, Dk]``::

      M <- alpha M                    (retention "before": the gradient at the decayed memory)
      M <- M - theta (M k - v) k^T    (the l2 error's gradient step)
      M <- alpha M                    (retention "after": the gradient at the previous memory)
      y  = M q                        (read after; read before: M before the step)

  The readable reference is the layer's own forward (`GenericMemoryStep`, tests compare them).
- `GenericMemoryStep`: any other memory layer: the layer's forward on one token with its state.
- `AttentionStep`: an attention block: the fused q/k/v/gate projection, q/k norms, rotary at each
  row's position, the key and value written into the row's cache slot, attention over the row's
  cached keys (a window keeps a ring of the last ``window`` keys).
- `MlpStep`: the block's MLP (SwiGLU's gate and up rows fused; GELU; routed experts as they are).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..attention import rope
from .fused import Fused, matvec
from .norm import Norm

#: the knobs of the delta family `MemoryStep` computes in place (each knob's default params)
FAST_KNOBS = {"structure": {"core:linear"}, "bias": {"core:l2"}, "algorithm": {"core:gd"},
              "feature_map": {"core:identity"},
              "retention": {"core:none": None, "core:decay": "after", "zoo:decay_first": "before"}}


def _knob(rule, name: str):
    value = rule.spec.get(name)
    if isinstance(value, dict):
        return value.get("use"), {k: v for k, v in value.items() if k != "use"}
    return value, {}


def fast_retention(layer) -> str | None | bool:
    """How `MemoryStep` runs ``layer``'s rule: ``"before"`` / ``"after"`` (where the decay is),
    None (no retention), or False when it does not compute this rule (`GenericMemoryStep` runs it)."""
    rule, p = layer.rule, layer.params
    form = getattr(rule, "form", None)
    if (form is None or not form.composed or form.steps_per_token != 1 or form.anchor != 1 or form.window != 1
            or p.qk_feature_map != "none" or p.rotary):
        return False
    for knob in ("structure", "bias", "algorithm", "feature_map", "retention"):
        name, params = _knob(rule, knob)
        if name not in FAST_KNOBS[knob] or params:
            return False
    return FAST_KNOBS["retention"][_knob(rule, "retention")[0]]


def memory_projections(L) -> tuple[list, dict]:
    """The linears of memory layer ``L`` that read its input, in the order `MemoryStep` fuses them
    (q, k, v, the gates, the output gate), and the bias masks (``{index: mask}``)."""
    mods, masks = [L.q_proj, L.k_proj, L.v_proj], {}
    if L.gate_names:
        masks[len(mods)] = L.gate_bias_mask
        mods.append(L.gate_proj)
    if L.output_gate != "none":
        mods.append(L.out_gate)
    return mods, masks


def fuse_weights(model) -> None:
    """Place the weights each decode step reads together (a memory layer's input projections, a
    SwiGLU's gate and up rows) in one matrix each, before the checkpoint is read into them: the
    decoder's `Fused` then finds them in place and copies nothing (no second copy of those
    weights, not even for a moment). The model computes what it computed."""
    from ..allocator import release_free
    from ..lm import AttentionBlock
    from ..mlp import SwiGLU

    for block in model.blocks:
        memory = None if isinstance(block, AttentionBlock) else getattr(block, "memory", None)
        if memory is not None and hasattr(memory, "q_proj"):
            Fused(*memory_projections(memory))
        mlp = getattr(block, "mlp", None)
        if isinstance(mlp, SwiGLU):
            Fused([mlp.gate, mlp.up])
        # the weights a fused matrix replaced go back to the kernel before the next block's are
        # allocated: glibc keeps freed tensors below 32 MiB, and a fused matrix above it is mapped
        # afresh, so without this the process would peak at the weights plus every replaced one
        release_free()


class MemoryStep:
    """A delta-family memory block, one token a row (module docstring), its activations in
    ``act`` (the decoder's residual dtype; default the weights'). Called as ``step(x)``."""

    def __init__(self, block, batch: int, act: torch.dtype | None = None) -> None:
        L = block.memory
        self.block, self.layer = block, L
        self.retention = fast_retention(L)
        self.read_before = L.rule.form.read == "before"
        self.proj = Fused(*memory_projections(L))
        self.H, self.Hv, self.G = L.heads, L.value_heads, L.groups
        self.Dk, self.Dv = L.d_rule_key, L.d_value
        self.gate_index = 3 if L.gate_names else None
        dev, act = L.q_proj.weight.device, act or L.q_proj.weight.dtype
        if L.use_conv:
            w = torch.cat([L.q_conv.weight, L.k_conv.weight, L.v_conv.weight])[:, 0]  # (C, K)
            self.conv_w = w.t().to(act).contiguous()  # (K, C)
            self.conv = torch.zeros(batch, w.shape[1], w.shape[0], dtype=act, device=dev)
            self.conv_sizes = [L.q_conv.weight.shape[0], L.k_conv.weight.shape[0], L.v_conv.weight.shape[0]]
        self.M = torch.zeros(batch, self.Hv, self.Dv, self.Dk, dtype=torch.promote_types(act, torch.float32),
                             device=dev)
        self.out_norm = Norm(L.out_norm, act) if L.params.output_norm else None
        self.kernel = self._kernel_plan(act)
        if self.kernel is not None and L.use_conv:  # the kernel keeps its window in float32
            self.conv, self.conv_w = self.conv.float(), self.conv_w.float()

    def _kernel_plan(self, act: torch.dtype) -> dict | None:
        """The compiled step's constants (``csrc/memory_step.cpp``), or None where it does not
        compute this layer (then `reference` runs): a CPU, a float32 memory, the sizes and the
        kinds of norm, activation and output gate it knows."""
        from . import cpu_kernel

        L = self.layer
        fn = cpu_kernel.memory_kernel() if self.M.device.type == "cpu" and self.M.dtype == torch.float32 else None
        if (fn is None or L.params.qkv_activation not in ("silu", "none")
                or L.output_gate not in ("none", "sigmoid", "silu") or any(g.shape != "head" for g in L.gate_decls)):
            return None
        sizes = [m.out_features for m in memory_projections(L)[0][:3]]
        if sizes != [self.H * self.Dk, self.H * self.Dk, self.Hv * self.Dv] or self.Hv % self.H:
            return None
        norm = self.out_norm  # its weight a copy in act (no second copy where act is float32)
        if norm is not None and not (norm.rms and norm.shape == (self.Dv,)):
            return None
        w = None if norm is None or norm.w is None else norm.w.float()
        eps = 0.0 if norm is None else norm.eps
        offsets = [0]
        for n in self.proj.sizes:
            offsets.append(offsets[-1] + n)
        return {"fn": fn, "norm": norm is not None, "norm_w": w, "norm_eps": float(eps),
                "gate_kind": {"none": 0, "sigmoid": 1, "silu": 2}[L.output_gate],
                "gate_at": offsets[-2], "gates_at": offsets[3] if self.gate_index is not None else None}

    def load(self, row: int, state: dict) -> None:
        """Row ``row`` of the buffers from a layer state of batch 1 (after a prefill)."""
        L = self.layer
        if L.use_conv:
            cache = torch.cat([state["conv.q"], state["conv.k"], state["conv.v"]], dim=-1)  # (1, K-1, C)
            self.conv[row, 0] = 0
            self.conv[row, 1:] = cache[0]
        self.M[row] = state["rule.M"][0]

    def state(self, row: int) -> dict:
        """Row ``row`` as the layer's state (batch 1)."""
        L, out = self.layer, {}
        if L.use_conv:
            act = L.q_proj.weight.dtype
            cq, ck, cv = self.conv[row : row + 1, 1:].to(act).split(self.conv_sizes, dim=-1)
            out.update({"conv.q": cq.clone(), "conv.k": ck.clone(), "conv.v": cv.clone()})
        out["rule.M"] = self.M[row : row + 1].clone()
        return out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The memory layer's output for ``x: [B, d]`` (normed), updating the buffers: the compiled
        step where it computes this layer, else `reference`."""
        return self.reference(x) if self.kernel is None else self.compiled(x)

    def compiled(self, x: torch.Tensor) -> torch.Tensor:
        """`reference` by ``csrc/memory_step.cpp`` in float32: the projection, then one call for
        the convolution, activation, q/k norms, the memory's update and read, the output norm and
        gate (the gates' own activations stay in PyTorch), then the output projection."""
        L, c, B = self.layer, self.kernel, x.shape[0]
        raw = self.proj.joined(x, torch.float32)
        gates = {}
        if c["gates_at"] is not None:
            gates = self._gates(raw[:, c["gates_at"] : c["gates_at"] + sum(L.gate_sizes)])
        theta = gates.get(L.rule.form.gate("step_size"))
        alpha = gates.get(L.rule.form.gate("retention")) if self.retention else None
        theta = None if theta is None else theta.reshape(B, self.Hv).contiguous()
        alpha = None if alpha is None else alpha.reshape(B, self.Hv).contiguous()
        y = torch.empty(B, self.Hv * self.Dv, dtype=torch.float32, device=x.device)
        width, K = raw.shape[1], (self.conv.shape[1] if L.use_conv else 0)
        ptr = lambda t: 0 if t is None else t.data_ptr()  # noqa: E731
        c["fn"](raw.data_ptr(), width, ptr(self.conv if K else None), ptr(self.conv_w if K else None), K,
                L.params.qkv_activation == "silu", self.H, self.Hv, self.Dk, self.Dv, bool(L.params.qk_norm),
                float(L.params.qk_norm_eps), float(L.q_scale), ptr(theta), ptr(alpha),
                {None: 0, "before": 1, "after": 2}[self.retention], self.read_before, self.M.data_ptr(),
                ptr(c["norm_w"]), c["norm_eps"], c["norm"], raw.data_ptr() + 4 * c["gate_at"], width,
                c["gate_kind"], y.data_ptr(), B)
        return matvec(L.o_proj.weight, y, dtype=x.dtype)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The step in PyTorch, in the activations' dtype (the readable form of `compiled`)."""
        L = self.layer
        parts = self.proj(x)
        qkv = torch.cat(parts[:3], dim=-1)
        if L.use_conv:
            self.conv[:, :-1] = self.conv[:, 1:].clone()
            self.conv[:, -1] = qkv
            qkv = (self.conv * self.conv_w).sum(1)
        q, k, v = qkv.split(self.conv_sizes if L.use_conv else [p.shape[-1] for p in parts[:3]], dim=-1)
        if L.params.qkv_activation == "silu":
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
        B = x.shape[0]
        q, k, v = q.view(B, self.H, -1), k.view(B, self.H, -1), v.view(B, self.Hv, -1)
        if L.params.qk_norm:
            from ..layer import l2_normalize

            q, k = l2_normalize(q, L.params.qk_norm_eps), l2_normalize(k, L.params.qk_norm_eps)
        if L.q_scale != 1.0:
            q = q * L.q_scale
        work = torch.promote_types(x.dtype, torch.float32)  # the memory's dtype (float32 at least)
        q, k, v = q.to(work), k.to(work), v.to(work)
        if self.G > 1:
            q, k = q.repeat_interleave(self.G, dim=1), k.repeat_interleave(self.G, dim=1)
        gates = self._gates(parts[self.gate_index]) if self.gate_index is not None else {}
        M = self.M
        theta = gates.get(L.rule.form.gate("step_size"))
        alpha = gates.get(L.rule.form.gate("retention")) if self.retention else None
        if self.read_before:
            y = (M @ q[..., None])[..., 0]
        if alpha is not None and self.retention == "before":
            M.mul_(alpha[..., None, None])
        err = (M @ k[..., None])[..., 0] - v  # (B, Hv, Dv): the l2 error's gradient is err k^T
        step = err if theta is None else err * theta[..., None]
        if alpha is not None and self.retention == "after":
            M.mul_(alpha[..., None, None])
        BH = M.shape[0] * M.shape[1]
        M.view(BH, self.Dv, self.Dk).baddbmm_(step.reshape(BH, self.Dv, 1), k.reshape(BH, 1, self.Dk), alpha=-1)
        if not self.read_before:
            y = (M @ q[..., None])[..., 0]
        y = y.to(x.dtype)
        if self.out_norm is not None:
            y = self.out_norm(y.contiguous())
        y = y.reshape(B, -1)
        if L.output_gate == "sigmoid":
            y = y * torch.sigmoid(parts[-1])
        elif L.output_gate == "silu":
            y = y * F.silu(parts[-1])
        return matvec(L.o_proj.weight, y)

    def _gates(self, raw: torch.Tensor) -> dict[str, torch.Tensor]:
        """The layer's gates from their fused pre-activations ``raw: [B, sum of gate rows]``."""
        L, out = self.layer, {}
        for gate, r, scale, form in zip(L.gate_decls, raw.split(L.gate_sizes, dim=-1), L.gate_scales, L.gate_forms):
            if gate.shape == "key":
                r = r.view(r.shape[0], L.value_heads, -1)
            out[gate.name] = L.gate_from_raw(gate, r, form, scale).to(self.M.dtype)
        return out


class GenericMemoryStep:
    """Any memory block: the layer's own forward on one token, its state a dict per batch. An
    anchored rule (Titans' mini-batches) keeps one block position for the whole batch, so its
    rows, whose prompts may differ in length, step one at a time."""

    def __init__(self, block, batch: int) -> None:
        self.block, self.layer = block, block.memory
        self.rows: list[dict | None] = [None] * batch
        self.st: dict | None = None
        self.per_row = batch > 1 and getattr(self.layer.rule.form, "anchor", 1) > 1

    def load(self, row: int, state: dict) -> None:
        self.rows[row] = state
        self.st = None

    def state(self, row: int) -> dict:
        if self.st is not None:
            return {k: t[row : row + 1] for k, t in self.st.items()}
        return self.rows[row]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's output for ``x: [B, d]``, the layer run in its weights' dtype, the
        output in ``x``'s."""
        act, x = x.dtype, x.to(next(self.layer.parameters()).dtype)
        if self.per_row:
            ys = []
            for r in range(x.shape[0]):
                y, self.rows[r] = self.layer(x[r : r + 1, None], self.rows[r])
                ys.append(y[:, 0])
            return torch.cat(ys).to(act)
        if self.st is None:  # the rows' states stacked into one batch (after a prefill)
            keys = self.rows[0].keys()
            self.st = {k: torch.cat([r[k] for r in self.rows]) for k in keys}
        y, self.st = self.layer(x[:, None], self.st)
        return y[:, 0].to(act)


class AttentionStep:
    """An attention block's attention, one token a row, over a preallocated key/value cache;
    activations and the cache in ``act`` (the decoder's residual dtype; default the weights')."""

    def __init__(self, block, batch: int, max_len: int, act: torch.dtype | None = None) -> None:
        a = block.attn
        self.block, self.attn = block, a
        self.G, self.H, self.D = a.kv_heads, a.heads, a.head_dim
        self.slots = a.window if a.window is not None else max_len
        W, dev = a.qkv.weight, a.qkv.weight.device
        act = act or W.dtype
        self.q_norm, self.k_norm = (Norm(a.q_norm, act), Norm(a.k_norm, act)) if a.qk_norm != "none" else (None, None)
        self.k = torch.zeros(batch, self.G, self.slots, self.D, dtype=act, device=dev)
        self.v = torch.zeros_like(self.k)
        self.pos = torch.zeros(batch, dtype=torch.long, device=dev)  # tokens seen, per row
        self.rows = torch.arange(batch, device=dev)

    def load(self, row: int, cache: dict) -> None:
        n = int(cache["pos"])
        k, v = cache["k"][0], cache["v"][0]  # (G, kept, D): the last kept tokens
        kept = k.shape[1]
        if kept > self.slots:
            raise ValueError(f"a prompt of {n} tokens does not fit the cache of {self.slots} (max_len)")
        idx = (torch.arange(n - kept, n) % self.slots) if self.attn.window is not None else torch.arange(kept)
        self.k[row, :, idx], self.v[row, :, idx] = k.to(self.k.dtype), v.to(self.v.dtype)
        self.pos[row] = n

    def state(self, row: int) -> dict:
        n, slots = int(self.pos[row]), self.slots
        if self.attn.window is None:
            keep = torch.arange(n)
        else:
            keep = torch.arange(max(0, n - (self.attn.window - 1)), n) % slots
        dtype = self.attn.qkv.weight.dtype  # as the block's own step carries it
        return {"k": self.k[row : row + 1, :, keep].to(dtype, copy=True),
                "v": self.v[row : row + 1, :, keep].to(dtype, copy=True), "pos": n}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        a, B = self.attn, x.shape[0]
        parts = matvec(a.qkv.weight, x, a.qkv.bias).split(a.split, dim=-1)
        q, k, v = (p.contiguous() for p in parts[:3])
        if a.qk_norm == "all":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.view(B, self.H, 1, self.D), k.view(B, self.G, 1, self.D), v.view(B, self.G, 1, self.D)
        if a.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        pos = self.pos[:, None]  # (B, 1)
        if a.rotary:
            q, k = rope(q, pos, a.base, a.rotary), rope(k, pos, a.base, a.rotary)
        slot = self.pos % self.slots
        self.k[self.rows, :, slot] = k[:, :, 0].to(self.k.dtype)
        self.v[self.rows, :, slot] = v[:, :, 0].to(self.v.dtype)
        self.pos += 1
        n = int(self.pos.max())
        used = min(n, self.slots)
        K, V = self.k[:, :, :used], self.v[:, :, :used]
        mask = None
        if B > 1 or a.window is not None:  # each row sees its own filled slots
            seen = torch.minimum(self.pos, torch.tensor(self.slots, device=x.device))
            mask = (torch.arange(used, device=x.device)[None, :] < seen[:, None])[:, None, None, :]
        gqa = {"enable_gqa": True} if self.G != self.H else {}
        o = F.scaled_dot_product_attention(q, K, V, attn_mask=mask, **gqa)  # (B, H, 1, D)
        o = o.reshape(B, -1)
        if a.gated:
            o = o * torch.sigmoid(parts[3])
        return matvec(a.out.weight, o, a.out.bias)


class MlpStep:
    """A block's MLP on ``x: [B, d]``: SwiGLU with its gate and up rows fused, GELU, or routed experts."""

    def __init__(self, mlp) -> None:
        from ..mlp import SwiGLU

        self.mlp = mlp
        self.swiglu = isinstance(mlp, SwiGLU)
        if self.swiglu:
            self.proj = Fused([mlp.gate, mlp.up])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            g, u = self.proj(x)
            return matvec(self.mlp.down.weight, F.silu(g) * u)
        dtype = next(self.mlp.parameters()).dtype  # GELU, experts: the module in its weights' dtype
        return self.mlp(x.to(dtype)).to(x.dtype)
