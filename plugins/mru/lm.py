"""``mru:mru_lm``: a GPT-2-style language model with MRU layers in place of attention (seed 002,
"MRU-LM").

Block (pre-norm, as GPT-2):  ``x = x + MRU(LN(x));  x = x + MLP(LN(x))``, MLP = Linear, GELU,
Linear with ``mlp_ratio * d_model`` hidden units. Token embeddings only: the MRU is order-aware
by itself (matrix products do not commute), so no position embedding limits the length. The
output head shares the embedding matrix unless ``tie_embeddings = false``.

Shapes: ``ids: [B, T]`` -> ``logits: [B, T, vocab_size]``. The carried state of `step` is a flat
dict ``{"layers.<i>.H": [B, heads, d_o, d_o]}``; `generate` (from `MemoryLM`) feeds the prompt
once and then one token at a time, carrying every layer's H, so decoding costs O(1) per token.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from atlas_core.params import size_field
from torch import nn

from atlas_core.errors import Issue, SpecError
from atlas_core.host.registry import Params
from atlas_core.model import MemoryLM

from .layer import MRULayer, matrix_order


class MRULMParams(Params):
    vocab_size: int = size_field(..., "vocab", ge=1, description="number of token ids")
    d_model: int = size_field(..., "width", ge=1, description="embedding size; d_model / heads must be a perfect square")
    depth: int = size_field(..., "depth", ge=1, description="number of blocks")
    heads: int = size_field(..., "heads", ge=1, description="MRU heads; each head is a sqrt(d_model/heads)-order matrix")
    mlp_ratio: float = size_field(4.0, "ratio", gt=0, description="MLP hidden size = mlp_ratio * d_model")
    tie_embeddings: bool = Field(True, description="share the embedding matrix with the output head")
    init_scale: float = Field(0.0, ge=0, description="std scale of W_in; 0 starts every X_t at I")


class MRUBlock(nn.Module):
    def __init__(self, d_model: int, heads: int, mlp_ratio: float, strategy: Any, init_scale: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.mru = MRULayer(d_model, heads, strategy=strategy, init_scale=init_scale)
        self.norm2 = nn.LayerNorm(d_model)
        hidden = max(1, int(round(mlp_ratio * d_model)))
        self.mlp = nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(), nn.Linear(hidden, d_model))

    def forward(self, x: torch.Tensor, state: dict | None, cu_seqlens=None):
        y, state = self.mru(self.norm1(x), state, cu_seqlens=cu_seqlens)
        x = x + y
        return x + self.mlp(self.norm2(x)), state


class MRULM(MemoryLM):
    def __init__(self, params: MRULMParams, strategy: Any = "mru:brent_kung") -> None:
        super().__init__()
        p = params
        matrix_order(p.d_model, p.heads)  # fail early, naming the sizes
        self.vocab_size, self.d_model, self.depth = p.vocab_size, p.d_model, p.depth
        self.embed = nn.Embedding(p.vocab_size, p.d_model)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.layers = nn.ModuleList(
            MRUBlock(p.d_model, p.heads, p.mlp_ratio, strategy, p.init_scale) for _ in range(p.depth)
        )
        self.norm = nn.LayerNorm(p.d_model)
        self.head = nn.Linear(p.d_model, p.vocab_size, bias=False)
        if p.tie_embeddings:
            self.head.weight = self.embed.weight

    packs_in_one_pass = True

    def fsdp_units(self) -> list[nn.Module]:
        return list(self.layers)

    def forward(self, ids: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """``logits [B, T, vocab]``; ``cu_seqlens``: ``ids: [1, T]`` holds packed documents, each
        computed as if alone (the MRU scan restarts at every boundary; the rest is per token)."""
        return self.step(ids, None, cu_seqlens=cu_seqlens)[0]

    def step(self, ids: torch.Tensor, state: dict | None = None, cu_seqlens=None):
        """``ids: [B, T]`` continuing from ``state`` (None at the start) -> (logits, state)."""
        self.check_ids(ids)
        if ids.shape[1] == 0:
            raise ValueError("ids must hold at least one token per sequence (got T=0)")
        state = dict(state or {})
        x = self.embed(ids)  # [B, T, d_model]
        new_state = {}
        for i, block in enumerate(self.layers):
            key = f"layers.{i}.H"
            x, s = block(x, {"H": state[key]} if key in state else None, cu_seqlens=cu_seqlens)
            new_state[key] = s["H"]
        return self.head(self.norm(x)), new_state


DEFAULT_STRATEGY = "mru:brent_kung"


def _strategy_from_spec(spec: Any) -> Any:
    """The scan strategy from the resolved spec's ``[memory]`` table (``use = "mru:mru"``,
    ``parallel = ...``); `DEFAULT_STRATEGY` when the model is built without a spec."""
    if spec is None:
        return DEFAULT_STRATEGY
    memory = spec.get("memory") if isinstance(spec, dict) else getattr(spec, "memory", None)
    memory = dict(memory or {})
    if not memory:
        return DEFAULT_STRATEGY
    use = memory.get("use")
    if use not in ("mru:mru", "mru"):
        # any other memory would be silently ignored: the MRU layer is the only mixer here
        raise SpecError(
            [Issue("memory.use", "mru:mru_lm runs the mru:mru rule in every layer", use,
                   'write [memory] use = "mru:mru" and parallel = "mru:brent_kung"')]
        )
    parallel = memory.get("parallel")
    return parallel if parallel not in (None, {}, "") else DEFAULT_STRATEGY


def _check_layer_table(spec: Any) -> None:
    """The ``[layer]`` table configures the core memory layer, which this model does not use; a
    changed option would be silently ignored, so it is an error."""
    if spec is None:
        return
    layer = spec.get("layer") if isinstance(spec, dict) else getattr(spec, "layer", None)
    if not layer:
        return
    from atlas_core.layer import LayerParams
    from atlas_core.params import plain

    defaults = plain(LayerParams())
    changed = sorted(k for k, v in plain(dict(layer)).items() if defaults.get(k, object()) != v)
    if changed:
        raise SpecError(
            [Issue(f"layer.{changed[0]}", "mru:mru_lm has no [layer] options (its MRU layer is "
                   "configured in [model])", dict(layer)[changed[0]],
                   "remove the [layer] table; see `atlas components show mru:mru_lm`")]
        )


def build(params: MRULMParams, ctx) -> MRULM:
    spec = ctx.options.get("spec") if ctx is not None else None
    _check_layer_table(spec)
    return MRULM(params, strategy=_strategy_from_spec(spec))
