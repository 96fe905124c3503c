"""`Decoder`: token-by-token decoding of a ``core:lm`` model (memory, attention and MLP blocks,
hybrids included) with nothing per token but the work.

    dec = Decoder(model, batch=2, max_len=4096)
    logits = dec.prefill([prompt_a, prompt_b])       # [B, vocab]: each prompt's last position
    logits = dec.step(next_ids)                      # [B, vocab], one token a row

- **Prefill** runs the model's own forward (``model.step``: the memory layers' strategies, chunked
  where the rule has a chunk form, and PyTorch's fused attention) on each prompt alone, in pieces
  of ``prefill_chunk`` tokens that carry the state (exact for any split: the strategy contract),
  so a long prompt needs bounded memory; only the last position's logits are computed. Each
  prompt's state is then written into its row of the buffers. A bfloat16 model on a CPU prefills
  with each block's weights widened to float32 while it runs (`atlas_core.decode.widen`: the
  CPU's float32 products are several times faster than its bfloat16 ones).
- **Denormals**: prefill and step run with float32 denormals flushed to zero on every thread
  (`atlas_core.decode.cpu_kernel.denormals_flushed`, restored after): a chunked memory's decay
  products fall below 1.2e-38, where the CPU's arithmetic takes a slow path (a Qwen3.5-shaped
  2,048-token prefill ran 1.37x slower before the chunked forms dropped negligible factors
  themselves, `atlas_core.forms.decay.decay_floor`; the flush catches what is left); a value that
  small changes nothing a float32 logit shows.
- **Decode** (`step`): per block one fused input projection, the state updated in place in
  buffers allocated once (the memory ``M``, the convolution's last inputs, the attention's key /
  value cache of ``max_len`` slots, or ``window`` slots), no validation, no registry or spec look-up,
  the head applied to the new position only (`atlas_core.decode.blocks`). Rows advance together;
  each row has its own position (prompts of different lengths decode in one batch, each exactly
  as alone).
- **Dtypes**: the model's weights' dtype (float32, or bfloat16 for half the bytes a token reads);
  the residual stream, the memory ``M``, the attention cache and the logits in float32 at least
  (``Decoder.act``): a bfloat16 weight is widened in the product's registers, and the activations
  are never rounded to bfloat16 (`atlas_core.decode.norm`). The layer itself runs its rule in
  float32 when its weights are half precision, so the state `state` returns is what it carries.

Every fast step has a readable reference: the model's own ``step`` on one token (tests compare the
logits of every position, and the state, in float64). A model this engine cannot run (another
architecture, a Titans hybrid with persistent tokens) is refused by `supports` with the reason;
`atlas_core.decode.generate` then decodes through ``model.step``.
"""

from __future__ import annotations

from typing import Any

import torch

from .blocks import AttentionStep, GenericMemoryStep, MemoryStep, MlpStep, fast_retention
from .cpu_kernel import denormals_flushed
from .fused import matvec
from .norm import Norm
from .widen import widened_blocks


def supports(model) -> tuple[bool, str]:
    """Whether `Decoder` runs ``model`` (and why not)."""
    from ..lm import AttentionBlock, LanguageModel, MemoryBlock

    if not isinstance(model, LanguageModel):
        return False, f"{type(model).__name__} is not core:lm's language model"
    for i, block in enumerate(model.blocks):
        if isinstance(block, AttentionBlock):
            if getattr(block, "persistent", None) is not None:
                return False, f"block {i} attends to persistent tokens (a Titans hybrid)"
        elif not isinstance(block, MemoryBlock):
            return False, f"block {i} is a {type(block).__name__}"
    return True, ""


class Decoder:
    """Decoding state and steps of one batch of rows (module docstring)."""

    def __init__(self, model, *, batch: int = 1, max_len: int = 4096, prefill_chunk: int = 2048) -> None:
        ok, why = supports(model)
        if not ok:
            raise ValueError(f"the decoder does not run this model: {why}")
        from ..lm import AttentionBlock

        self.model, self.batch, self.max_len, self.prefill_chunk = model.eval(), batch, max_len, prefill_chunk
        # the residual stream's dtype: float32 at least (the weights' own where wider)
        self.act = act = torch.promote_types(model.embed.weight.dtype, torch.float32)
        self.steps: list[Any] = []
        self.norms: list[tuple[Norm | None, Norm]] = []  # each block's (mixer's, MLP's) norm
        for block in model.blocks:
            if isinstance(block, AttentionBlock):
                mixer, norm = AttentionStep(block, batch, max_len, act), block.norm_attn
            elif block.memory is None:
                mixer, norm = None, None
            elif fast_retention(block.memory) is not False:
                mixer, norm = MemoryStep(block, batch, act), block.norm_mem
            else:
                mixer, norm = GenericMemoryStep(block, batch), block.norm_mem
            self.steps.append((block, mixer, MlpStep(block.mlp)))
            self.norms.append((None if norm is None else Norm(norm, act), Norm(block.norm_mlp, act)))
        self.final_norm = Norm(model.norm, act)
        self.lengths = [0] * batch
        # an attention block without a window holds max_len keys a row
        self.bounded = any(isinstance(m, AttentionStep) and m.attn.window is None for _, m, _ in self.steps)

    # -- prefill -------------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, prompts: list[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """Run each prompt (a 1-D tensor of ids, or the rows of ``[B, T]``) alone and write its state
        into its row; ``[B, vocab]``: the logits of each prompt's last position."""
        rows = list(prompts) if isinstance(prompts, (list, tuple)) else list(prompts.unbind(0))
        if len(rows) != self.batch:
            raise ValueError(f"{len(rows)} prompts for a decoder of batch {self.batch}")
        out = []
        for r, ids in enumerate(rows):
            ids = ids.reshape(1, -1).to(self.model.embed.weight.device)
            if ids.shape[1] == 0:
                raise ValueError(f"prompt {r} is empty; give at least one token")
            if ids.shape[1] >= self.max_len:
                raise ValueError(f"prompt {r} has {ids.shape[1]} tokens, the decoder holds {self.max_len} "
                                 "(max_len)")
            state = None
            with widened_blocks(self.model), denormals_flushed():
                for s in range(0, ids.shape[1], self.prefill_chunk):
                    logits, state = self.model.step(ids[:, s : s + self.prefill_chunk], state, last=True)
            self.load(r, state)
            self.lengths[r] = ids.shape[1]
            out.append(logits[0, -1].to(self.act))
        return torch.stack(out)

    def load(self, row: int, state: dict) -> None:
        """Row ``row`` of the buffers from ``model.step``'s state of batch 1."""
        for (block, mixer, _), st in zip(self.steps, state["blocks"]):
            if mixer is not None:
                mixer.load(row, st)

    def state(self, row: int) -> dict:
        """Row ``row``'s state as ``model.step`` carries it (batch 1)."""
        return {"blocks": [mixer.state(row) if mixer is not None else None for _, mixer, _ in self.steps]}

    # -- one token -----------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids: [B]`` (one new token a row) -> ``[B, vocab]`` logits of the new position."""
        if any(n >= self.max_len for n in self.lengths) and self.bounded:
            raise ValueError(f"a row reached max_len={self.max_len} tokens: the attention cache is full")
        with denormals_flushed():
            return self._step(ids)

    def _step(self, ids: torch.Tensor) -> torch.Tensor:
        model = self.model
        x = model.embed(ids).to(self.act)  # the residual stream (a fresh tensor: updated in place)
        pending = None  # the last block output not yet added to x: added with the next norm
        for (block, mixer, mlp), (n_mix, n_mlp) in zip(self.steps, self.norms):
            post = getattr(block, "post", False)
            if post and pending is not None:
                x += pending
                pending = None
            if mixer is not None:
                if post:
                    n_mix.add_normed(x, mixer(x))
                else:
                    pending = mixer(n_mix(x, pending))
            if post:
                n_mlp.add_normed(x, mlp(x))
            else:
                pending = mlp(n_mlp(x, pending))
        self.lengths = [n + 1 for n in self.lengths]
        return matvec(model.head.weight, self.final_norm(x, pending))


__all__ = ["Decoder", "supports"]
