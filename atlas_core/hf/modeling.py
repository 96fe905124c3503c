"""`AtlasForCausalLM`: any architecture built from a spec, as a Hugging Face causal LM.

The wrapped model is ``self.model``, the `atlas_core.model.MemoryLM` that
``atlas_core.build_model(config.spec())`` returns, so the weights are the native state dict under
``model.``. ``forward`` gives the native logits; with ``use_cache`` (which ``generate`` passes) it
runs the native ``step`` and carries the state in an `AtlasMemoryCache`. ``generate`` feeds the
prompt once, then one token per step (`prepare_inputs_for_generation` passes only the ids the
cache has not consumed), exactly as ``MemoryLM.generate`` does.

The cache travels under the name the installed ``transformers`` uses (`CACHE_NAME`):
``past_key_values`` up to 5.23, ``cache`` from 5.24 on (the old name is deprecated there).
``forward`` accepts either keyword on every version.

Supported decoding: greedy and sampling (with any logits processors), batches of prompts of one
length. Not supported: padding (a zero in ``attention_mask``: the memory would absorb the pad
tokens), ``inputs_embeds``, beam search and assisted decoding (the state cannot be reordered or
rolled back).

With labels, the loss is the next-token cross-entropy, plus a routed-expert model's
load-balancing term in training mode when its spec sets ``[model.moe] aux_loss`` (`atlas_core.moe`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from transformers.generation import GenerationMixin
from transformers.generation.configuration_utils import GenerationMode
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.modeling_utils import PreTrainedModel

from ..moe import take_balance_loss
from .cache import AtlasMemoryCache
from .config import AtlasConfig

#: The keyword and output field that carry the cache in the installed transformers.
CACHE_NAME = ("cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}
              else "past_key_values")


def _ties(module: torch.nn.Module) -> dict[str, str]:
    """``{name: first name}`` for every parameter shared under several names (e.g. a head tied to
    the embedding), with the ``model.`` prefix of the wrapper."""
    first: dict[int, str] = {}
    ties = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) in first:
            ties[f"model.{name}"] = f"model.{first[id(p)]}"
        else:
            first[id(p)] = name
    return ties


class AtlasForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = AtlasConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _is_stateful = True
    _supported_generation_modes = (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE)
    _no_split_modules: list[str] = []

    def __init__(self, config: AtlasConfig, native: torch.nn.Module | None = None) -> None:
        super().__init__(config)
        if native is None:
            from atlas_core.model import build_model

            native = build_model(config.spec())
        self.model = native
        # Buffers that are not saved with the weights (e.g. fixed coefficients of a feature map):
        # from_pretrained replaces them with empty tensors; `_restore_buffers` puts back these
        # values, computed when the native model was built.
        self._atlas_buffers = {
            id(mod): {name: buf.detach().clone() for name, buf in mod._buffers.items()
                      if buf is not None and name in mod._non_persistent_buffers_set}
            for mod in native.modules() if mod._non_persistent_buffers_set
        }
        ties = _ties(native)
        # The native model ties its own weights when it is built; declaring the ties lets
        # save_pretrained store a shared tensor once and from_pretrained restore the sharing.
        self._tied_weights_keys = ties
        self.config.tie_word_embeddings = bool(ties)
        self.post_init()

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def get_init_context(cls, *args, **kwargs):
        """Hugging Face builds models on the meta device before loading the weights; atlas models
        compute some buffers in ``__init__`` (not saved with the weights), so they are built for
        real (the weights are then overwritten by the loaded ones)."""
        contexts = super().get_init_context(*args, **kwargs)
        return [c for c in contexts if not (isinstance(c, torch.device) and c.type == "meta")]

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Nothing: every atlas module initialises itself when it is built (the generic Hugging
        Face initialisation would overwrite gate biases, persistent tokens, ...);
        `from_pretrained` refuses a directory that lacks any weight and restores the unsaved
        buffers itself."""

    @torch.no_grad()
    def _restore_buffers(self) -> None:
        """Put back the unsaved buffers' build-time values (loading replaces them)."""
        for mod in self.model.modules():
            for name, value in self._atlas_buffers.get(id(mod), {}).items():
                buf = mod._buffers.get(name)
                if buf is not None:
                    mod._buffers[name] = value.to(device=buf.device, dtype=buf.dtype)

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any):
        """``PreTrainedModel.from_pretrained``, refusing weights that do not fit the spec: a
        missing weight would otherwise be left uninitialised, an unexpected one ignored."""
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        missing = sorted(set(info.get("missing_keys", ())) - set(model._tied_weights_keys))
        unexpected = sorted(info.get("unexpected_keys", ()))
        mismatched = [str(m[0]) if isinstance(m, (tuple, list)) else str(m)
                      for m in info.get("mismatched_keys", ())]
        if missing or unexpected or mismatched:
            where = args[0] if args else kwargs.get("pretrained_model_name_or_path")
            parts = [f"{label} {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
                     for label, keys in (("missing", missing), ("unexpected", unexpected),
                                         ("shape mismatch", mismatched)) if keys]
            raise ValueError(f"{where}: the weights do not fit the spec in its config.json "
                             f"({'; '.join(parts)}); export the checkpoint again with atlas export-hf")
        model._restore_buffers()
        return (model, info) if want_info else model

    def save_pretrained(self, save_directory: Any, *args: Any, **kwargs: Any) -> Any:
        """``PreTrainedModel.save_pretrained``, plus the remote code (`remote_code`: two small
        modules that import the installed ``atlas_core``) named in ``config.json``'s
        ``auto_map``: every directory an atlas model is saved to loads with
        ``trust_remote_code=True`` in a process that never imported ``atlas_core`` itself."""
        from pathlib import Path

        from .remote_code import AUTO_MAP, sources

        self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), **AUTO_MAP}
        out = super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            for name, text in sources().items():
                (Path(save_directory) / name).write_text(text, encoding="utf-8")
        return out

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the cache is an AtlasMemoryCache, made by forward

    def get_input_embeddings(self) -> torch.nn.Module:
        return self._native_part("embed")

    def get_output_embeddings(self) -> torch.nn.Module:
        return self._native_part("head")

    def _native_part(self, name: str) -> torch.nn.Module:
        part = getattr(self.model, name, None)
        if not isinstance(part, torch.nn.Module):
            raise NotImplementedError(f"{type(self.model).__name__} has no '{name}' module (the "
                                      "architectures of atlas_core name their embedding 'embed' "
                                      "and their output layer 'head')")
        return part

    # -- running -----------------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: AtlasMemoryCache | None = None,
        use_cache: bool | None = None,
        labels: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        return_dict: bool | None = None,
        past_key_values: AtlasMemoryCache | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """``input_ids [B, T] -> logits [B, T, vocab]``. With ``use_cache`` (default: when a cache
        is given) the ids continue the sequence the cache holds, and the returned cache (the same
        object, updated; the output's field `CACHE_NAME`) holds the state after them. The cache
        may be passed as ``cache`` or ``past_key_values``.
        ``labels``: the HF convention (``labels = input_ids`` trains next-token prediction;
        -100 is ignored)."""
        given = _one_cache(cache, past_key_values)
        if inputs_embeds is not None:
            raise ValueError("inputs_embeds is not supported: pass input_ids (the memory layers "
                             "read the model's own embedding)")
        if input_ids is None:
            raise ValueError("input_ids is required")
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise ValueError(
                "attention_mask has zeros (padding), which atlas models do not support: the memory "
                "state would absorb the pad tokens; generate prompts of different lengths one at a "
                "time (or in groups of equal length)")
        if given is not None and not isinstance(given, AtlasMemoryCache):
            raise TypeError(f"{CACHE_NAME} must be an AtlasMemoryCache (from an earlier call of "
                            f"this model), not {type(given).__name__}")
        if use_cache is None:
            use_cache = given is not None
        cache = None
        if use_cache:
            cache = given if given is not None else AtlasMemoryCache()
            logits, state = self.model.step(input_ids, cache.state)
            cache.update(state, input_ids.shape[1])
        else:
            if given is not None:
                raise ValueError("use_cache=False with a cache: the ids would restart the "
                                 "sequence; drop the cache or set use_cache=True")
            logits = self.model(input_ids)
        loss = None
        if labels is not None:
            shifted = logits[:, :-1].flatten(0, 1).float()
            loss = F.cross_entropy(shifted, labels[:, 1:].flatten().to(shifted.device), ignore_index=-100)
        balance = take_balance_loss(self.model)  # a training forward with [model.moe] aux_loss > 0
        if loss is not None and balance is not None:
            loss = loss + balance.to(loss.dtype)
        out = CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_NAME: cache})
        return out if return_dict is not False else out.to_tuple()

    def generate(self, inputs: torch.Tensor | None = None, generation_config: Any = None, **kwargs: Any):
        """Hugging Face ``generate`` (greedy or sampling); beam search is refused up front."""
        beams = kwargs.get("num_beams", getattr(generation_config or self.generation_config, "num_beams", 1))
        if beams is not None and beams > 1:
            raise ValueError(f"num_beams={beams}: beam search is not supported by atlas models (the "
                             "memory state is not reordered between beams); use greedy decoding "
                             "(do_sample=False) or sampling (do_sample=True)")
        return super().generate(inputs, generation_config=generation_config, **kwargs)

    def prepare_inputs_for_generation(
        self,
        input_ids: torch.LongTensor,
        next_sequence_length: int | None = None,
        cache: AtlasMemoryCache | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = True,
        past_key_values: AtlasMemoryCache | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Only the ids the cache has not consumed: the whole prompt first, then one token.
        The slice is counted from the cache itself (``next_sequence_length``, which newer
        releases pass, is the same count there)."""
        if inputs_embeds is not None:
            raise ValueError("generate(inputs_embeds=...) is not supported: pass input_ids")
        cache = _one_cache(cache, past_key_values)
        seen = cache.get_seq_length() if cache is not None else 0
        if use_cache is False:
            seen = 0
        inputs = {
            "input_ids": input_ids[:, seen:].contiguous(),
            CACHE_NAME: cache,
            "attention_mask": attention_mask,
            "use_cache": use_cache,
        }
        if inputs["input_ids"].device != self.device and self.device.type != "meta":
            inputs["input_ids"] = inputs["input_ids"].to(self.device)
        return inputs


def _one_cache(cache: Any, past_key_values: Any) -> Any:
    """The cache given under either name (``cache`` in newer transformers, ``past_key_values``
    in older ones); both at once is refused."""
    if cache is not None and past_key_values is not None and cache is not past_key_values:
        raise ValueError("both cache and past_key_values were given: pass the AtlasMemoryCache once "
                         "(as cache, or past_key_values in transformers before 5.24)")
    return cache if cache is not None else past_key_values
