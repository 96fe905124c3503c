"""``core:lm``: the generic memory language model, and the pieces architectures share.

Block (pre-norm)::

    x = x + MemoryLayer(RMSNorm(x))        # blocks listed in memory_layers (default: all)
    x = x + MLP(RMSNorm(x))

A block that carries no memory is an MLP block. ``[model] layers`` names each block's kind instead
(a list of ``depth`` entries, or a pattern repeated to ``depth``): ``"memory"``, ``"mlp"`` or
``"attention"``, a softmax-attention block (`atlas_core.attention`, ``[model.attention]``)::

    x = x + Attention(RMSNorm(x)); x = x + MLP(RMSNorm(x))        # block_norm = "pre"
    x = x + RMSNorm(Attention(x)); x = x + RMSNorm(MLP(x))        # block_norm = "post" (OLMo)

so hybrids (Qwen3.5, Qwen3-Next, OLMo Hybrid, fla's ``attn`` layers: memory layers with softmax
attention every few blocks) are ``core:lm`` models. ``[model.moe]`` routes the MLP of its blocks
over experts (`atlas_core.moe`). Embedding -> blocks -> RMSNorm -> head (tied to the embedding
unless ``tie_embeddings = false``). This is Titans' LMM (Titans Sec 4, "LMM"), and the
model every memory rule (Omega, Atlas, MIRAS, the delta-rule family) is trained in; ``titans:lmm``
is another name for it. Architecture plugins (Titans' MAG, MAL, MAC) reuse:

- `LMParams`: the ``[model]`` params;
- `FeedForward`; `build_blocks` (a model's blocks, with or without memory, in order, every
  memory layer from one `MemoryRecipe` of the spec); `build_memory_layer` (a `MemoryLayer` from
  the spec, with the errors a spec can cause turned into `SpecError`s at ``memory``); `run_memory` (a memory layer over new tokens,
  continuing from its carried state: exact for every strategy and any split of the tokens);
- `LanguageModel`: embedding -> blocks -> final norm -> head, with ``step(ids, state)`` carrying
  one state per block (the `MemoryLM` base class gives ``generate``).

Shapes: ``ids: [B, T]``, hidden ``x: [B, T, d_model]``, ``logits: [B, T, vocab_size]``. Decoding
carries each memory layer's state (O(1) work per generated token: a one-token call runs the rule's
sequential step) and each attention block's key/value cache.
"""

from __future__ import annotations

from typing import Any, Callable, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator, model_validator
from .params import size_field
from torch import nn

from .attention import AttentionParams
from .errors import Issue, SpecError
from .host.registry import Params
from .layer import MemoryRecipe
from .model import MemoryLM
from .mlp import SwiGLU
from .moe import MoEParams


class LMParams(Params):
    vocab_size: int = size_field(..., "vocab", ge=2, description="number of token ids")
    d_model: int = size_field(..., "width", ge=1, description="embedding size")
    depth: int = size_field(2, "depth", ge=1, description="number of blocks")
    heads: int = size_field(4, "heads", ge=1, description="memory heads (d_key defaults to d_model / heads)")
    mlp_ratio: float = size_field(4.0, "ratio", gt=0, description="MLP hidden size = mlp_ratio * d_model "
                                  "(gelu); swiglu: fla's 256 * ceil(int(2/3 mlp_ratio d_model) / 256)")
    mlp: Literal["gelu", "swiglu"] = Field("gelu", description="'gelu': W_2 gelu(W_1 x + b_1) + b_2; "
                                           "'swiglu': W_d (silu(W_g x) * W_u x), no biases (fla's GatedMLP)")
    mlp_hidden: int | None = size_field(None, "width", ge=1, description="MLP hidden size (overrides mlp_ratio)")
    init_std: float | None = Field(None, gt=0, description="None: torch's default Linear init (embedding "
                                   "N(0, 0.02)); a number: every Linear and the embedding N(0, std), Linear "
                                   "biases 0 except the gates' (their declared init), as fla's models")
    memory_layers: list[int] | None = Field(
        None, description="block numbers (1-based) that carry memory; absent = every block"
    )
    tie_embeddings: bool = Field(True, description="share the embedding matrix with the head")
    norm_eps: float = Field(1e-6, gt=0, description="RMSNorm epsilon")

    @field_validator("memory_layers")
    @classmethod
    def _check_layers(cls, v: list[int] | None, info: ValidationInfo) -> list[int] | None:
        depth = info.data.get("depth")
        if v is None or depth is None:
            return v
        bad = [i for i in v if not 1 <= i <= depth]
        if bad:
            raise ValueError(f"block numbers {bad} are outside 1..depth={depth} (1-based)")
        if len(set(v)) != len(v):
            raise ValueError(f"block numbers {v} repeat")
        return sorted(v)

    def carries_memory(self, block: int) -> bool:
        """Whether block ``block`` (0-based index) carries memory."""
        return self.memory_layers is None or (block + 1) in self.memory_layers


BlockKind = Literal["memory", "attention", "mlp"]


class CoreLMParams(LMParams):
    """``core:lm``'s ``[model]``: `LMParams` plus block kinds, attention and routed experts."""

    layers: list[BlockKind] | None = Field(
        None, description="each block's kind, 'memory', 'attention' or 'mlp': depth entries, or a pattern "
        "repeated to depth (e.g. ['memory', 'memory', 'memory', 'attention']); absent = memory_layers")
    attention: AttentionParams | None = Field(None, description="the attention blocks (model.layers)")
    moe: MoEParams | None = Field(None, description="routed experts in place of the MLP of its blocks")

    @model_validator(mode="before")
    @classmethod
    def _expand(cls, data: Any) -> Any:
        """A pattern of layers repeated to depth; attention's defaults when a block is one."""
        if not isinstance(data, dict) or not isinstance(data.get("layers"), (list, tuple)):
            return data
        data, layers = dict(data), list(data["layers"])
        depth = data.get("depth", cls.model_fields["depth"].default)
        if layers and isinstance(depth, int) and 0 < len(layers) < depth and depth % len(layers) == 0:
            data["layers"] = layers * (depth // len(layers))
        if "attention" in layers and data.get("attention") is None:
            data["attention"] = {}
        return data

    # field validators (not one model validator), so that each error's path names its field
    # (model.layers, model.attention, model.moe) and its value is that field's, not the whole table
    @field_validator("layers")
    @classmethod
    def _check_kinds(cls, v: list[str] | None, info: ValidationInfo) -> list[str] | None:
        depth = info.data.get("depth")
        if v is not None and depth is not None and len(v) != depth:
            raise ValueError(f"layers has {len(v)} entries for depth={depth}: list one kind per block, "
                             "or a pattern whose length divides depth")
        if v is not None and info.data.get("memory_layers") is not None:
            raise ValueError("set layers or memory_layers, not both (layers names every block's kind)")
        return v

    @field_validator("attention")
    @classmethod
    def _check_attention(cls, v: AttentionParams | None, info: ValidationInfo) -> AttentionParams | None:
        if v is not None and "layers" in info.data and "attention" not in (info.data["layers"] or ()):
            raise ValueError("attention is set and no block is an attention block: name them in layers "
                             "(e.g. layers = ['memory', 'memory', 'memory', 'attention'])")
        return v

    @field_validator("moe")
    @classmethod
    def _check_moe(cls, v: MoEParams | None, info: ValidationInfo) -> MoEParams | None:
        depth = info.data.get("depth")
        if v is None or v.blocks is None or depth is None:
            return v
        bad = [b for b in v.blocks if not 1 <= b <= depth]
        if bad:
            raise ValueError(f"moe.blocks {bad} are outside 1..depth={depth} (1-based)")
        return v

    def kinds(self) -> list[str]:
        """Every block's kind, in order."""
        if self.layers is not None:
            return list(self.layers)
        return ["memory" if self.carries_memory(i) else "mlp" for i in range(self.depth)]

    def routed(self, block: int) -> bool:
        """Whether block ``block`` (0-based) has routed experts in place of its MLP."""
        return self.moe is not None and (self.moe.blocks is None or block + 1 in self.moe.blocks)


class FeedForward(nn.Module):
    """``x -> W_2 gelu(W_1 x)``: ``[B, T, d] -> [B, T, d]``."""

    def __init__(self, d_model: int, ratio: float, hidden: int | None = None) -> None:
        super().__init__()
        hidden = hidden or max(1, int(round(ratio * d_model)))
        self.up = nn.Linear(d_model, hidden)
        self.down = nn.Linear(hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.gelu(self.up(x)))


def swiglu_hidden(d_model: int, ratio: float) -> int:
    """fla's GatedMLP intermediate size: ``int(d_model * ratio * 2/3)`` rounded up to a multiple of 256."""
    hidden = int(d_model * ratio * 2 / 3)
    return 256 * ((hidden + 255) // 256)


def make_mlp(p: "LMParams") -> nn.Module:
    """The block MLP ``[model] mlp`` names."""
    if p.mlp == "swiglu":
        return SwiGLU(p.d_model, p.mlp_hidden or swiglu_hidden(p.d_model, p.mlp_ratio))
    return FeedForward(p.d_model, p.mlp_ratio, p.mlp_hidden)


def normal_init(model: nn.Module, std: float) -> None:
    """fla's initialisation: every Linear weight and embedding N(0, std), Linear biases 0, except
    the memory layers' gate projections' biases (their declared initial values)."""
    from .layer import MemoryLayer

    keep = {id(m.gate_proj.bias) for m in model.modules() if isinstance(m, MemoryLayer) and m.gate_names}
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                m.weight.normal_(0.0, std)
            if isinstance(m, nn.Linear) and m.bias is not None and id(m.bias) not in keep:
                m.bias.zero_()


def build_memory_layer(spec: Any, d_model: int, heads: int, *, arch: str = "core:lm", read_only: bool = False,
                       registry: Any = None):
    """A `MemoryLayer` for one block, from the spec's ``[memory]`` and ``[layer]`` tables (or
    from a `MemoryRecipe` of them, which a model builds once for all its layers: `build_blocks`).

    ``read_only``: the architecture also queries the memory without updating it (MAC's
    retrieval), which needs a knob-composed rule (a structure to read and a feature map).
    ``registry``: where the rule and its strategy are looked up (the build context's; the
    process-wide registry when None). The layer resolves its strategy once when it is built and
    keeps the bound runner, so running the model never looks it up again."""
    from atlas_core.errors import StrategyError

    try:
        recipe = spec if isinstance(spec, MemoryRecipe) else MemoryRecipe(spec, registry)
        layer = recipe.layer(d_model, heads)
    except SpecError as exc:  # e.g. a structure refusing its sizes: point into [memory]
        if all(i.path.startswith(("memory", "layer")) for i in exc.issues):
            raise
        raise SpecError([i if i.path.startswith(("memory", "layer")) else
                         Issue(f"memory.{i.path}" if i.path else "memory", i.message, i.value, i.hint)
                         for i in exc.issues]) from None
    except StrategyError as exc:
        raise SpecError([Issue("memory.parallel", str(exc))]) from None
    except ValueError as exc:
        raise SpecError([Issue("memory", f"{arch} cannot host this memory: {exc}")]) from None
    rule = layer.rule
    name = rule.spec.get("use") or "this rule"
    if not rule.takes_qkv:
        raise SpecError([Issue(
            "memory", f"{arch} cannot host {name}: a memory layer feeds rules q, k, v and gates, "
            "and this rule takes another input (it brings its own layer)", name,
            "use a knob-composed rule or preset (e.g. titans:titans)")])
    if read_only and not rule.composed:
        raise SpecError([Issue(
            "memory", f"{arch} retrieves from the committed memory with a read-only query, which "
            f"needs a knob-composed rule (structure + feature map); {name} is standalone", name)])
    return layer


def build_blocks(p: "LMParams", ctx, memory_block: Callable[[Any], nn.Module],
                 other_block: Callable[[], nn.Module], *, arch: str,
                 read_only: bool = False) -> list[nn.Module]:
    """The ``p.depth`` blocks of a model, in order: ``memory_block(layer)`` for a block that
    carries memory (``[model] memory_layers``; its `MemoryLayer` is built first, then the block),
    ``other_block()`` for one that does not. Every memory layer comes from one `MemoryRecipe` of
    the resolved spec in ``ctx`` (`spec_of`)."""
    recipe = MemoryRecipe(spec_of(ctx), ctx.registry)
    blocks = []
    for i in range(p.depth):
        if p.carries_memory(i):
            mem = build_memory_layer(recipe, p.d_model, p.heads, arch=arch, read_only=read_only,
                                     registry=ctx.registry)
            blocks.append(memory_block(mem))
        else:
            blocks.append(other_block())
    return blocks


def run_memory(layer, x: torch.Tensor, st: dict | None, *, keep_state: bool, cu_seqlens=None):
    """The memory layer over new tokens ``x: [B, n, d]``, continuing from the layer state ``st``.

    Every strategy equals the sequential rule for any split of a sequence into calls (the state
    carries the anchor block's position and memory), so decoding simply continues from the state;
    a one-token step runs the rule's sequential step. Returns ``(y [B, n, d], state or None)``.
    ``cu_seqlens``: ``x`` holds packed documents (batch 1; `atlas_core.varlen`)."""
    y, new = layer(x, st) if cu_seqlens is None else layer(x, st, cu_seqlens=cu_seqlens)
    return y, (new if keep_state else None)


class MemoryBlock(nn.Module):
    """Pre-norm block: ``x + MemoryLayer(RMSNorm(x))`` (when it carries memory), then
    ``x + MLP(RMSNorm(x))``. ``forward(x, state, keep_state) -> (x, state)``; with
    ``cu_seqlens`` the memory layer runs packed documents (the rest is per token)."""

    def __init__(self, d_model: int, mlp_ratio: float, eps: float, memory, mlp: nn.Module | None = None) -> None:
        super().__init__()
        self.memory = memory
        if memory is not None:
            self.norm_mem = nn.RMSNorm(d_model, eps=eps)
        self.norm_mlp = nn.RMSNorm(d_model, eps=eps)
        self.mlp = mlp if mlp is not None else FeedForward(d_model, mlp_ratio)

    def forward(self, x: torch.Tensor, state, keep_state: bool, cu_seqlens=None):
        if self.memory is not None:
            y, state = run_memory(self.memory, self.norm_mem(x), state, keep_state=keep_state,
                                  cu_seqlens=cu_seqlens)
            x = x + y
        return x + self.mlp(self.norm_mlp(x)), state


class AttentionBlock(nn.Module):
    """``x + Attention(RMSNorm(x))`` then ``x + MLP(RMSNorm(x))`` (``post``: ``x + RMSNorm(Attention(x))``
    then ``x + RMSNorm(MLP(x))``), the attention `atlas_core.attention.SoftmaxAttention`; with
    ``persistent`` > 0 learned tokens prefix every attention (Titans' hybrids). ``forward(x, state,
    keep_state) -> (x, state)``, the state the attention's key/value cache."""

    def __init__(self, d_model: int, attn: nn.Module, eps: float, mlp: nn.Module, *, post: bool = False,
                 persistent: int | None = None) -> None:
        super().__init__()
        if persistent is not None:
            self.persistent = nn.Parameter(0.02 * torch.randn(persistent, d_model))
        self.norm_attn = nn.RMSNorm(d_model, eps=eps)
        self.attn = attn
        self.norm_mlp = nn.RMSNorm(d_model, eps=eps)
        self.mlp = mlp
        self.post = post

    def forward(self, x: torch.Tensor, state, keep_state: bool, cu_seqlens=None):
        prefix = getattr(self, "persistent", None)
        h = x if self.post else self.norm_attn(x)
        if cu_seqlens is not None:  # packed documents, each from the start (no state)
            from .varlen import check_cu_seqlens

            y = self.attn.packed(h, check_cu_seqlens(cu_seqlens, x.shape[1], x.shape[0]), prefix)
            state = None
        else:
            y, state = self.attn(h, state, prefix=prefix, keep_state=keep_state)
        if self.post:
            x = x + self.norm_attn(y)
            return x + self.norm_mlp(self.mlp(x)), state
        x = x + y
        return x + self.mlp(self.norm_mlp(x)), state


class LanguageModel(MemoryLM):
    """Embedding, blocks (each ``forward(x, state, keep_state) -> (x, state)``), final norm, head.

    ``step(ids, state)`` continues from the carried state ``{"blocks": [...]}`` (None at the start).
    Every block takes ``cu_seqlens`` (packed documents in one pass); a subclass whose blocks do not
    sets `packs_in_one_pass` False, one whose blocks mix tokens otherwise than through their
    memory layers (attention) sets `context_parallel` False (a model with attention blocks sets it
    on itself)."""

    packs_in_one_pass = True
    context_parallel = True

    def __init__(self, params: LMParams, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.params = params
        self.vocab_size = params.vocab_size
        self.embed = nn.Embedding(params.vocab_size, params.d_model)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.blocks = nn.ModuleList(blocks)
        if any(isinstance(b, AttentionBlock) for b in blocks):  # attention mixes tokens across time
            self.context_parallel = False
        self.norm = nn.RMSNorm(params.d_model, eps=params.norm_eps)
        self.head = nn.Linear(params.d_model, params.vocab_size, bias=False)
        if getattr(params, "init_std", None) is not None:
            normal_init(self, params.init_std)
        if params.tie_embeddings:
            self.head.weight = self.embed.weight

    def _run(self, ids: torch.Tensor, state: Any, keep_state: bool, cu_seqlens=None, last: bool = False):
        self.check_ids(ids)
        if state is not None and (not isinstance(state, dict) or len(state.get("blocks", ())) != len(self.blocks)):
            raise ValueError("state must be the state returned by an earlier step() of this model")
        states = state["blocks"] if state is not None else [None] * len(self.blocks)
        x = self.embed(ids)
        new = []
        packed = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
        for block, st in zip(self.blocks, states):
            x, st = block(x, st, keep_state, **packed)
            new.append(st)
        logits = self.head(self.norm(x[:, -1:] if last else x))
        return logits, ({"blocks": new} if keep_state else None)

    def step(self, ids: torch.Tensor, state: Any = None, *, last: bool = False):
        """``(logits, state)`` continuing from ``state``; ``last``: the logits of the last position
        only (``[B, 1, vocab]``: a prompt's prefill need not compute the rest)."""
        return self._run(ids, state, keep_state=True, last=last)

    def fsdp_units(self) -> list[nn.Module]:
        return list(self.blocks)

    def forward(self, ids: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """``logits [B, T, vocab]``. ``cu_seqlens``: ``ids: [1, T]`` holds packed documents
        (`atlas_core.varlen`), each computed as if alone; blocks that take ``cu_seqlens`` (class
        `packs_in_one_pass`) run them in one pass, other models run each document separately."""
        if cu_seqlens is None:
            return self._run(ids, None, keep_state=False)[0]
        from .varlen import check_cu_seqlens, per_document

        self.check_ids(ids)
        cu = check_cu_seqlens(cu_seqlens, ids.shape[1], ids.shape[0])
        if self.packs_in_one_pass:
            return self._run(ids, None, keep_state=False, cu_seqlens=cu_seqlens)[0]
        return per_document(lambda d: self._run(d, None, keep_state=False)[0], ids, cu)


def spec_of(ctx) -> Any:
    spec = ctx.options.get("spec") if ctx is not None else None
    if spec is None:
        raise SpecError([Issue("model", "an architecture is built from a whole spec; use "
                               "atlas_core.build_model(spec)")])
    return spec


def block_mlp(p: "LMParams", block: int) -> nn.Module:
    """Block ``block``'s (0-based) MLP: routed experts where ``[model.moe]`` lists it, else `make_mlp`."""
    if isinstance(p, CoreLMParams) and p.routed(block):
        from .moe import SparseMoE

        return SparseMoE(p.d_model, p.moe)
    return make_mlp(p)


def attention_block(p: CoreLMParams, mlp: nn.Module) -> AttentionBlock:
    """An attention block of ``core:lm`` from ``[model.attention]`` (a `SpecError` for sizes it refuses)."""
    from .attention import attention_from_params

    try:
        attn = attention_from_params(p.attention, p.d_model, p.heads, p.norm_eps)
    except ValueError as exc:
        raise SpecError([Issue("model.attention", str(exc))]) from None
    return AttentionBlock(p.d_model, attn, p.norm_eps, mlp, post=p.attention.block_norm == "post")


def build(params: LMParams, ctx) -> LanguageModel:
    """The ``core:lm`` factory (also registered as ``titans:lmm``)."""
    p = params
    arch = ctx.options.get("arch", "core:lm") if ctx is not None else "core:lm"
    kinds = p.kinds() if isinstance(p, CoreLMParams) else [
        "memory" if p.carries_memory(i) else "mlp" for i in range(p.depth)]
    recipe = MemoryRecipe(spec_of(ctx), ctx.registry) if "memory" in kinds else None
    blocks: list[nn.Module] = []
    for i, kind in enumerate(kinds):
        if kind == "attention":
            blocks.append(attention_block(p, block_mlp(p, i)))
            continue
        mem = (build_memory_layer(recipe, p.d_model, p.heads, arch=arch, registry=ctx.registry)
               if kind == "memory" else None)
        blocks.append(MemoryBlock(p.d_model, p.mlp_ratio, p.norm_eps, mem, block_mlp(p, i)))
    return LanguageModel(p, blocks)
