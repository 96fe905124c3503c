"""Models: the base class every architecture's language model derives from, sampling
(`Sampling`, `sample_next`), and `build_model`.

An architecture is a registered component of kind ``arch`` whose factory receives its validated
params and ``ctx.options["spec"]`` (the resolved spec) and returns a `MemoryLM`.

`MemoryLM` contract, for ``ids: LongTensor [B, T]``:
- ``forward(ids) -> logits [B, T, vocab]``; ``forward(ids, cu_seqlens=cu)`` with ``ids: [1, T]``
  holding packed documents gives each document's logits as if it were alone (`atlas_core.varlen`;
  the base runs each document through ``step``, a model may run them in one pass);
- ``step(ids, state) -> (logits, state)``: continue from a carried state (None at the start);
  feeding a sequence in pieces with the carried state gives the logits of one full forward;
- ``generate(prompt_ids, max_new_tokens, ...)`` decodes incrementally through `step`;
- ``param_report() -> list[(name, count)]`` parameters per top-level block.

What training needs to know about a model is declared on its class and read, never probed:
`MemoryLM.packs_in_one_pass`, `MemoryLM.context_parallel` and `MemoryLM.fsdp_units`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen from last-position logits: ``greedy`` (or ``temperature`` 0)
    the most likely, else a draw at ``temperature`` among the ``top_k`` most likely and the
    smallest set of mass ``top_p``. `sample_next`, `MemoryLM.generate` and
    `atlas_core.decode.generate` take these fields as keywords."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    greedy: bool = False
    generator: torch.Generator | None = None

    @property
    def is_greedy(self) -> bool:
        """Whether the choice is the most likely token (``greedy``, or ``temperature`` 0)."""
        return self.greedy or self.temperature == 0

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """Next token ids ``[B]`` from last-position logits ``[B, vocab]``."""
        if self.is_greedy:
            return logits.argmax(dim=-1)
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 means greedy)")
        logits = logits.float() / self.temperature
        if self.top_k is not None:
            if self.top_k < 1:
                raise ValueError(f"top_k={self.top_k} must be >= 1")
            kth = torch.topk(logits, min(self.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p is not None:
            if not 0 < self.top_p <= 1:
                raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
            sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
            probs = sorted_logits.softmax(-1)
            # drop a token when the mass strictly before it already reaches top_p
            drop = probs.cumsum(-1) - probs >= self.top_p
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
        probs = logits.softmax(-1)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)


def sample_next(logits: torch.Tensor, **sampling: Any) -> torch.Tensor:
    """Next token ids ``[B]`` from last-position logits ``[B, vocab]``; ``sampling``: the fields
    of `Sampling` (``temperature``, ``top_k``, ``top_p``, ``greedy``, ``generator``)."""
    return Sampling(**sampling)(logits)


class MemoryLM(nn.Module):
    """Base class of language models built from specs."""

    spec: Any = None
    vocab_size: int
    #: ``forward(ids, cu_seqlens=cu)`` runs the packed documents in one pass (else the base class
    #: runs each document alone, equal lengths batched: the same logits, slower)
    packs_in_one_pass: ClassVar[bool] = False
    #: only its memory layers mix tokens, so context parallelism (`atlas_core.distributed.lm`,
    #: ``atlas train --context-parallel``) can split its sequences along time
    context_parallel: ClassVar[bool] = False

    def fsdp_units(self) -> list[nn.Module]:
        """The submodules FSDP shards one at a time before the root (``--shard fsdp``): its
        blocks; none by default (the root alone)."""
        return []

    def step(self, ids: torch.Tensor, state: Any = None):
        raise NotImplementedError

    def forward(self, ids: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        if cu_seqlens is not None:  # packed documents, each run alone (atlas_core/varlen.py)
            from .varlen import check_cu_seqlens, per_document

            self.check_ids(ids)
            cu = check_cu_seqlens(cu_seqlens, ids.shape[1], ids.shape[0])
            return per_document(lambda d: self.step(d, None)[0], ids, cu)
        logits, _ = self.step(ids, None)
        return logits

    def check_ids(self, ids: torch.Tensor) -> None:
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype not in (torch.long, torch.int32, torch.int64):
            shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise ValueError(f"ids must be an integer tensor [B, T], got {shape}")
        # the range check reads values (a host sync, and a graph break under torch.compile, whose
        # traced training step gets the trainer's own ids): checked in eager mode only
        if torch.compiler.is_compiling():
            return
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise ValueError(
                f"token ids must lie in [0, {self.vocab_size}); got min {int(ids.min())}, max {int(ids.max())}"
            )

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int = 64, **sampling: Any) -> torch.Tensor:
        """Incremental decoding with a carried state: ``[B, T] -> [B, T + max_new_tokens]``;
        ``sampling``: the fields of `Sampling` (``temperature``, ``top_k``, ``top_p``, ``greedy``,
        ``generator``)."""
        choose = Sampling(**sampling)
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 0")
        self.check_ids(prompt_ids)
        if prompt_ids.shape[1] == 0:
            raise ValueError("the prompt must hold at least one token")
        logits, state = self.step(prompt_ids, None)
        out = [prompt_ids]
        for _ in range(max_new_tokens):
            nxt = choose(logits[:, -1])
            out.append(nxt[:, None])
            logits, state = self.step(nxt[:, None], state)
        return torch.cat(out, dim=1)

    def param_report(self) -> list[tuple[str, int]]:
        """Parameters per top-level block; a shared (tied) tensor counts once, where first met."""
        rows, seen = [], set()

        def count(module: nn.Module) -> int:
            n = 0
            for p in module.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    n += p.numel()
            return n

        for name, child in self.named_children():
            if isinstance(child, nn.ModuleList):
                rows.extend((f"{name}.{i}", count(block)) for i, block in enumerate(child))
            else:
                rows.append((name, count(child)))
        own = sum(p.numel() for p in self._parameters.values() if p is not None and id(p) not in seen)
        if own:
            rows.append(("(own)", own))
        return rows

    def loss(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over targets != -100."""
        logits = self(ids)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)


def build_model(spec: Any, *, registry=None) -> MemoryLM:
    """Build a model from a spec path, a dict, a TOML string or a resolved `Spec`."""
    from .host.registry import BuildContext
    from .spec import load_spec

    if registry is None:
        from .host.manager import get_registry

        registry = get_registry()
    resolved = load_spec(spec, registry=registry)
    model_table = dict(resolved.model)
    arch = model_table.pop("arch")
    comp = registry.get("arch", arch, "model.arch")
    params = comp.validate(model_table, "model")
    model = comp.load_factory("model")(params, BuildContext(registry, "model", {"spec": resolved}))
    model.spec = resolved
    return model
