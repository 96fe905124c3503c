"""`AtlasConfig`: the Hugging Face config of an atlas model.

It holds the resolved spec (``atlas_spec``, the plain-data form of `atlas_core.spec.Spec`, enough
to rebuild the model exactly) and, for a model trained on text, how text maps to ids
(``text_codec``: ``{"mode": "byte"}``, ``{"mode": "char", "vocab": [...]}`` or
``{"mode": "bpe", "tokenizer": "<tokenizer.json text>"}``, see `atlas_core.train.codec`). ``vocab_size`` and ``tie_word_embeddings`` mirror the spec so that
generic Hugging Face code reads them where it expects them.
"""

from __future__ import annotations

from typing import Any

from transformers.configuration_utils import PreTrainedConfig

MODEL_TYPE = "atlas_memory"


def codec_entry(codec: Any) -> dict[str, Any]:
    """A `TextCodec` as the ``task.text`` entry of a checkpoint's meta (what `TextCodec.from_task_meta`
    reads back): ``{"mode": "byte"}``, ``{"mode": "char", "vocab": [...]}`` or
    ``{"mode": "bpe", "tokenizer": "<tokenizer.json text>"}``."""
    entry: dict[str, Any] = {"mode": codec.mode}
    if codec.vocab is not None:
        entry["vocab"] = list(codec.vocab)
    if getattr(codec, "tokenizer_json", None):
        entry["tokenizer"] = codec.tokenizer_json
    return entry


class AtlasConfig(PreTrainedConfig):
    model_type = MODEL_TYPE

    # An explicit __init__ (not dataclass fields): the config classes of transformers 5.x are
    # plain classes in early releases and dataclasses later, and both accept this form.
    def __init__(self, atlas_spec: dict[str, Any] | None = None, atlas_spec_hash: str | None = None,
                 text_codec: dict[str, Any] | None = None, vocab_size: int | None = None,
                 tie_word_embeddings: bool = False, use_cache: bool = True, **kwargs: Any) -> None:
        if atlas_spec is not None:
            self.atlas_spec, self.atlas_spec_hash = atlas_spec, atlas_spec_hash
            spec = self.spec()  # validated here: a bad config.json is refused when it loads
            atlas_spec, atlas_spec_hash = spec.to_dict(), spec.spec_hash
            vocab_size = int(spec.model.get("vocab_size", 0)) or vocab_size
            tie_word_embeddings = bool(spec.model.get("tie_embeddings", tie_word_embeddings))
        self.atlas_spec, self.atlas_spec_hash = atlas_spec, atlas_spec_hash
        self.text_codec = text_codec
        if text_codec is not None:
            self.codec()  # a malformed entry is refused here, not when decoding
        super().__init__(tie_word_embeddings=tie_word_embeddings, use_cache=use_cache, **kwargs)
        # set again after the base class, which may reset attributes it also knows
        self.atlas_spec, self.atlas_spec_hash, self.text_codec = atlas_spec, atlas_spec_hash, text_codec
        self.vocab_size = vocab_size
        self.tie_word_embeddings, self.use_cache = tie_word_embeddings, use_cache

    @classmethod
    def from_spec(cls, spec: Any, *, text_codec: Any = None, **kwargs) -> "AtlasConfig":
        """The config of ``spec`` (a path, TOML text, dict or resolved `Spec`); ``text_codec`` a
        `TextCodec` or its dict form."""
        from atlas_core.spec import load_spec

        resolved = load_spec(spec)
        if text_codec is not None and not isinstance(text_codec, dict):
            text_codec = codec_entry(text_codec)
        return cls(atlas_spec=resolved.to_dict(), text_codec=text_codec, **kwargs)

    def spec(self):
        """The resolved `Spec` (validated by the installed components)."""
        from atlas_core.errors import SpecError
        from atlas_core.spec import load_spec

        if self.atlas_spec is None:
            raise ValueError("this AtlasConfig holds no spec (atlas_spec is None); build it with "
                             "AtlasConfig.from_spec(spec) or load an exported directory")
        try:
            spec = load_spec(self.atlas_spec)
        except SpecError as exc:
            raise ValueError(f"config atlas_spec does not load here: {exc}") from None
        if self.atlas_spec_hash is not None and spec.spec_hash != self.atlas_spec_hash:
            # an export of an earlier version: its stored tables unedited (their own hash is the
            # recorded one) and every value they state kept; fields it lacks take their defaults
            from atlas_core.spec.compat import content_hash, stated_changes

            changed = stated_changes(self.atlas_spec, spec.to_dict())
            if content_hash(self.atlas_spec) != self.atlas_spec_hash or changed:
                why = (f"the installed components resolve {', '.join(changed[:4])} otherwise" if changed
                       else "the file was edited")
                raise ValueError(
                    f"config atlas_spec resolves to spec_hash {spec.spec_hash}, the config says "
                    f"{self.atlas_spec_hash} ({why}); install the plugin versions it was exported with")
        return spec

    def codec(self):
        """The `TextCodec` (encode a prompt, decode ids), or None for a model without text."""
        from atlas_core.train.codec import TextCodec

        if self.text_codec is None:
            return None
        try:
            return TextCodec.from_task_meta({"text": self.text_codec})
        except ValueError as exc:
            raise ValueError(f"config text_codec: {exc}") from None
