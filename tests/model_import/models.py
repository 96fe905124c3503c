"""Small random transformers hybrids, every weight moved off its initialisation, saved with
``save_pretrained``: what `atlas import` is tested on (tests/model_import/oracle.py runs them on
transformers' own PyTorch paths)."""

from __future__ import annotations

from pathlib import Path

import torch

from .oracle import torch_paths

VOCAB = 128  # above the 94 characters of examples/text_char.txt: the imports also train on it

_LINEAR = dict(linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4)
_SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2)

#: family -> (transformers module, config class, model class, config options off the defaults)
FAMILIES = {
    "qwen3_5_text": ("qwen3_5", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
                     dict(_SIZES, **_LINEAR, head_dim=8,
                          rope_parameters={"rope_type": "default", "rope_theta": 5000.0,
                                           "partial_rotary_factor": 0.5})),
    "olmo_hybrid": ("olmo_hybrid", "OlmoHybridConfig", "OlmoHybridForCausalLM",
                    dict(_SIZES, **dict(_LINEAR, linear_value_head_dim=16), tie_word_embeddings=True,
                         pad_token_id=None, eos_token_id=None)),
    "qwen3_next": ("qwen3_next", "Qwen3NextConfig", "Qwen3NextForCausalLM",
                   dict(_SIZES, **_LINEAR, head_dim=8, num_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=16, shared_expert_intermediate_size=24,
                        decoder_sparse_step=1, mlp_only_layers=[1])),
}


def hf_model(family: str, seed: int = 0, **over):
    """The family's transformers model (eval mode), perturbed off its init (zero-centred norms,
    decays and gates all matter), on transformers' PyTorch paths."""
    module, config_cls, model_cls, opts = FAMILIES[family]
    mod = torch_paths(module)
    cfg = getattr(mod, config_cls) if hasattr(mod, config_cls) else None
    if cfg is None:
        import transformers

        cfg = getattr(transformers, config_cls)
    torch.manual_seed(seed)
    model = getattr(mod, model_cls)(cfg(**{**opts, **over})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def save(model, path: Path, **kwargs) -> Path:
    model.save_pretrained(path, **kwargs)
    return path


def write_tokenizer(path: Path, vocab: int = 100) -> None:
    """A byte-level BPE tokenizer (``tokenizer.json``) of at most ``vocab`` ids, trained on a few lines."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["the memory of a model is trained online, token by token",
            "a hybrid mixes memory layers with softmax attention"] * 20
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet()[:60])
    tok.train_from_iterator(text, trainer)
    tok.save(str(path / "tokenizer.json"))
