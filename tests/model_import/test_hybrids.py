"""``atlas import`` of transformers' hybrids (Qwen3.5, OLMo Hybrid, Qwen3-Next): each family built
small, every weight moved off its init, saved with ``save_pretrained``, imported, gives
transformers' logits (its own PyTorch paths: tests/model_import/oracle.py) within 1e-4 relative
in float32; decodes token by token as its full forward; ``atlas generate --greedy`` continues a
prompt as transformers' ``generate``; ``atlas export-hf`` of the import loads with
``AutoModelForCausalLM`` and gives the same logits and continuation."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import atlas_core as ac
from atlas_cli.main import make_app
from atlas_core.errors import SpecError
from atlas_core.model_import import import_checkpoint

from .models import FAMILIES, VOCAB, hf_model, save, write_tokenizer
from .oracle import torch_paths, uses_torch_paths

PROMPT = [3, 17, 5, 9, 44]


def invoke(*args):
    return CliRunner().invoke(make_app(), [str(a) for a in args])


def close(got, want):
    assert want.abs().max() > 0.1  # not a degenerate model
    assert ((got - want).norm() / want.norm()).item() < 1e-4
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def hf_greedy(model, ids, n):
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=n, do_sample=False, min_new_tokens=n,
                              pad_token_id=0)[0, ids.shape[1]:].tolist()


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def imported(request, tmp_path_factory):
    family = request.param
    model = hf_model(family)
    src = save(model, tmp_path_factory.mktemp(f"hf-{family}") / "src")
    out = tmp_path_factory.mktemp(f"atlas-{family}") / "run"
    result = invoke("--format", "json", "import", src, out)
    assert result.exit_code == 0, result.output
    return family, model, src, out, json.loads(result.output)


def test_oracle_is_transformers_own_pytorch_code():
    for module in ("qwen3_5", "qwen3_next", "olmo_hybrid"):
        assert uses_torch_paths(torch_paths(module)), module


def test_logits_equal_transformers(imported):
    family, model, _, out, summary = imported
    atlas = ac.load(out)
    kinds = atlas.spec.model["layers"]
    assert summary["family"] == family and kinds.count("attention") == 1 and kinds.count("memory") == 3
    assert atlas.spec.layer["value_heads"] == 4 and atlas.spec.model["heads"] == 2
    ids = torch.randint(0, VOCAB, (2, 23), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
        close(atlas(ids), want)
        # split into calls that carry the state (attention through its KV cache)
        first, state = atlas.step(ids[:, :10])
        rest, _ = atlas.step(ids[:, 10:], state)
    close(torch.cat([first, rest], 1), want)


def test_step_decode_equals_full_forward(imported):
    """Every position's logits, one token a call, equal the full forward's."""
    _, _, _, out, _ = imported
    atlas = ac.load(out).double()
    ids = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = atlas(ids)
        state, steps = None, []
        for t in range(ids.shape[1]):
            logits, state = atlas.step(ids[:, t : t + 1], state)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-9, atol=1e-9)


def test_strategies_do_not_change_the_import(imported):
    """The imported memory rule under the sequential loop and under the chunked strategy 'auto'
    picks: the same logits."""
    _, _, _, out, _ = imported
    atlas = ac.load(out)
    spec = atlas.spec.to_dict()
    spec["memory"]["parallel"] = "core:sequential"
    seq = ac.build_model(spec)
    seq.load_state_dict(atlas.state_dict())
    ids = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(seq(ids), atlas(ids), rtol=1e-4, atol=1e-4)


def test_generate_continues_as_transformers(imported):
    _, model, _, out, _ = imported
    result = invoke("--format", "json", "generate", out, "--prompt-ids", " ".join(map(str, PROMPT)),
                    "--greedy", "--max-new-tokens", "8", "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["ids"][-8:] == hf_greedy(model, torch.tensor([PROMPT]), 8)


def test_export_hf_loads_with_auto_model(imported, tmp_path):
    import transformers

    _, model, _, out, _ = imported
    result = invoke("export-hf", out, tmp_path / "hf")
    assert result.exit_code == 0, result.output
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        close(hf(ids).logits, model(ids).logits)
    # transformers' decoding through the export carries the memory states and the KV caches
    assert hf_greedy(hf, torch.tensor([PROMPT]), 6) == hf_greedy(model, torch.tensor([PROMPT]), 6)


def test_tokenizer_is_copied_and_used(tmp_path):
    """A tokenizer beside the weights is copied into the run: text prompts and text evaluation."""
    src = save(hf_model("qwen3_5_text", seed=13), tmp_path / "src")
    write_tokenizer(src)
    out = tmp_path / "run"
    summary = import_checkpoint(src, out)
    assert summary["tokenizer"] == str(out / "tokenizer")
    assert (out / "tokenizer" / "tokenizer.json").read_text() == (src / "tokenizer.json").read_text()
    result = invoke("--format", "json", "generate", out, "--prompt", "the memory", "--greedy",
                    "--max-new-tokens", "4", "--device", "cpu")
    assert result.exit_code == 0, result.output
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    got = json.loads(result.output)
    assert got["prompt"] == "the memory" and got["prompt_ids"] == tok.encode("the memory").ids
    assert len(got["ids"]) == 4 and got["text"] == tok.decode(got["ids"], skip_special_tokens=False)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the memory of a model is trained online, token by token.\n" * 40)
    result = invoke("--format", "json", "eval", out, "--task", f'{{use = "text", path = "{corpus}", seq_len = 16}}',
                    "--batches", "1", "--batch-size", "2", "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["loss"] > 0


def test_sharded_bf16_checkpoint(tmp_path):
    """Shards listed in model.safetensors.index.json, bf16 weights: read, the logits of the bf16
    weights run in float32."""
    model = hf_model("qwen3_5_text", seed=3).to(torch.bfloat16)
    src = save(model, tmp_path / "src", max_shard_size="20KB")
    assert (src / "model.safetensors.index.json").is_file() and len(list(src.glob("*.safetensors"))) > 1
    import_checkpoint(src, tmp_path / "out")
    ids = torch.randint(0, VOCAB, (1, 17), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        close(ac.load(tmp_path / "out")(ids), model.float()(ids).logits)


def test_composite_qwen3_5_imports_its_text_model(tmp_path):
    """``qwen3_5`` (text and vision): the text model is imported, the vision tower dropped with a note."""
    import transformers

    mod = torch_paths("qwen3_5")
    text = dict(FAMILIES["qwen3_5_text"][3])
    vision = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=32,
                  patch_size=4, temporal_patch_size=1, spatial_merge_size=1)
    torch.manual_seed(7)
    cfg = transformers.Qwen3_5Config(text_config=text, vision_config=vision)
    model = mod.Qwen3_5ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    src = save(model, tmp_path / "src")
    summary = import_checkpoint(src, tmp_path / "out")
    assert summary["family"] == "qwen3_5" and any("vision" in n for n in summary["notes"])
    ids = torch.randint(0, VOCAB, (2, 15), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        close(ac.load(tmp_path / "out")(ids), model(input_ids=ids).logits)


def test_olmo_without_rotary(tmp_path):
    """OLMo Hybrid's released checkpoints use no positions in attention (no rope_theta)."""
    model = hf_model("olmo_hybrid", seed=9, rope_parameters={"rope_type": "default", "rope_theta": None})
    assert model.model.rotary_emb is None
    src = save(model, tmp_path / "src")
    import_checkpoint(src, tmp_path / "out")
    atlas = ac.load(tmp_path / "out")
    assert atlas.spec.model["attention"]["rotary"] is False
    ids = torch.randint(0, VOCAB, (1, 14), generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        close(atlas(ids), model(ids).logits)


def test_refusals_are_named_and_write_nothing(tmp_path):
    src = save(hf_model("qwen3_5_text", seed=11), tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    for change, path in (({"model_type": "kimi_linear"}, "latent attention"),
                         ({"model_type": "llama"}, "not a model family"),
                         ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
                          "config.rope_parameters.rope_type"),
                         ({"hidden_act": "gelu"}, "config.hidden_act"),
                         ({"linear_num_value_heads": 3}, "config.linear_num_value_heads")):
        (src / "config.json").write_text(json.dumps({**cfg, **change}))
        with pytest.raises(SpecError, match=path):
            import_checkpoint(src, tmp_path / "out")
        assert not (tmp_path / "out").exists()
    (src / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("keep")
    result = invoke("import", src, tmp_path / "busy")
    assert result.exit_code == 1 and "not empty" in result.output and "Traceback" not in result.output


def test_missing_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    src = save(hf_model("qwen3_5_text", seed=12), tmp_path / "src")
    tensors = load_file(str(src / "model.safetensors"))
    del tensors["model.layers.3.self_attn.k_norm.weight"]
    save_file(tensors, str(src / "model.safetensors"))
    with pytest.raises(SpecError, match="k_norm"):
        import_checkpoint(src, tmp_path / "out")


def test_qwen3_next_training_loss_with_router_logits_equals_transformers(tmp_path):
    """With ``output_router_logits`` transformers' training loss adds ``router_aux_loss_coef``
    times the load-balancing loss: the import carries the coefficient (``[model.moe] aux_loss``)
    and atlas's training objective (cross-entropy plus the balance term) equals transformers'
    loss. Without ``output_router_logits`` (its default) transformers adds nothing, nor does the
    import."""
    import torch.nn.functional as F

    from atlas_core.moe import take_balance_loss

    model = hf_model("qwen3_next", seed=4, output_router_logits=True, router_aux_loss_coef=0.02)
    import_checkpoint(save(model, tmp_path / "src"), tmp_path / "out")
    atlas = ac.load(tmp_path / "out")
    assert atlas.spec.model["moe"]["aux_loss"] == 0.02
    ids = torch.randint(0, VOCAB, (2, 19), generator=torch.Generator().manual_seed(7))
    want = model.train()(ids, labels=ids).loss
    logits = atlas.train()(ids)
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    balance = take_balance_loss(atlas)
    assert balance is not None and abs(ce.item() - want.item()) > 1e-3 * want.item()  # the term shows
    assert abs((ce + balance).item() - want.item()) < 1e-5 * want.item()
    # the Hugging Face export's loss with labels in training mode (what HF's Trainer and PEFT use)
    import transformers

    assert invoke("export-hf", tmp_path / "out", tmp_path / "hf").exit_code == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").train()
    assert abs(hf(ids, labels=ids).loss.item() - want.item()) < 1e-5 * want.item()

    plain = hf_model("qwen3_next", seed=4)
    assert not plain.config.output_router_logits
    import_checkpoint(save(plain, tmp_path / "src-plain"), tmp_path / "out-plain")
    assert ac.load(tmp_path / "out-plain").spec.model["moe"]["aux_loss"] == 0.0
