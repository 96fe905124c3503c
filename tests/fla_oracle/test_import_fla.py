"""``atlas import-fla``: each fla family, randomly initialised and perturbed off its init, saved with
``save_pretrained``, imported, gives fla's logits (run on the CPU oracle, tests/fla_oracle/oracle.py)
within 1e-4 relative in float32; generates through ``atlas generate`` as fla's model continues the
prompt; ``atlas eval`` and ``atlas export-hf`` + ``AutoModelForCausalLM`` take it. Options the
import cannot express are refused by name."""

from __future__ import annotations

import json

import pytest

fm = pytest.importorskip("fla.models", reason="flash-linear-attention is in the test extra")

import torch  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

import atlas_core as ac  # noqa: E402
from atlas_cli.main import make_app  # noqa: E402
from atlas_core.errors import SpecError  # noqa: E402
from atlas_core.fla_import import import_fla  # noqa: E402

from .oracle import build, fla_on_cpu  # noqa: E402

VOCAB = 50
#: family -> (config class, model class, options off the config's defaults, so every mapped
#: option is exercised: output gates, allow_neg_eigval, several Householder steps, forget gate)
FAMILIES = {
    "delta_net": ("DeltaNet", {"use_gate": True, "allow_neg_eigval": True}),
    "gated_deltanet": ("GatedDeltaNet", {"head_dim": 8}),
    "gated_deltaproduct": ("GatedDeltaProduct", {"head_dim": 8, "num_householder": 2, "use_forget_gate": True,
                                                 "allow_neg_eigval": True}),
    "kda": ("KDA", {"head_dim": 8}),
    "gla": ("GLA", {"use_short_conv": True}),
    "retnet": ("RetNet", {}),
    "linear_attn": ("LinearAttention", {}),
}
#: the strategy each family is also checked under (chunked, 8 tokens a chunk)
CHUNKED = {"gla": "core:chunkwise", "retnet": "core:chunkwise", "linear_attn": "core:chunkwise"}


def invoke(*args):
    return CliRunner().invoke(make_app(), [str(a) for a in args])


def fla_model(family: str, seed: int = 0, **over):
    """A small fla model of ``family`` (``over``: config options, sizes included), built inside the
    CPU oracle (fla's ``Attention``, a hybrid's ``attn`` layers, needs flash-attn to be built)."""
    name, opts = FAMILIES[family]
    torch.manual_seed(seed)
    sizes = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_heads": 2}
    cfg = getattr(fm, f"{name}Config")(**{**sizes, **opts, **over})
    model = build(getattr(fm, f"{name}ForCausalLM"), cfg).eval()
    with torch.no_grad():  # off the init: every norm weight, bias and gate parameter matters
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def fla_logits(model, ids):
    with fla_on_cpu(), torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def imported(request, tmp_path_factory):
    family = request.param
    model = fla_model(family)
    src, out = tmp_path_factory.mktemp(f"fla-{family}"), tmp_path_factory.mktemp(f"atlas-{family}") / "run"
    model.save_pretrained(src)
    result = invoke("--format", "json", "import-fla", src, out)
    assert result.exit_code == 0, result.output
    return family, model, out, json.loads(result.output)


def test_logits_equal_fla(imported):
    family, model, out, summary = imported
    atlas = ac.load(out)
    assert summary["family"] == family and summary["preset"] == atlas.spec.memory["use"]
    ids = torch.randint(0, VOCAB, (2, 23), generator=torch.Generator().manual_seed(1))
    want = fla_logits(model, ids)
    with torch.no_grad():
        got = atlas(ids)
    assert want.abs().max() > 0.1  # not a degenerate model
    assert ((got - want).norm() / want.norm()).item() < 1e-4
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    tol = {"rtol": 1e-4, "atol": 1e-4 * want.abs().max().item()}
    # split into calls that carry the state, and under a chunked strategy: the same function
    with torch.no_grad():
        first, state = atlas.step(ids[:, :10])
        rest, _ = atlas.step(ids[:, 10:], state)
    torch.testing.assert_close(torch.cat([first, rest], 1), want, **tol)
    spec = atlas.spec.to_dict()
    spec["memory"]["parallel"] = {"use": CHUNKED.get(family, "core:exact_chunk"), "chunk_size": 8}
    chunked = ac.build_model(spec)
    chunked.load_state_dict(atlas.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(chunked(ids), want, **tol)


@pytest.mark.parametrize("family, over", [
    ("retnet", {"use_output_gate": False}),
    ("retnet", {"fuse_norm": False, "expand_k": 0.5, "expand_v": 1.0, "elementwise_affine": False}),
    ("linear_attn", {"feature_map": "hedgehog"}),
    ("linear_attn", {"feature_map": "t2r", "elementwise_affine": False}),
    ("linear_attn", {"feature_map": "elu"}),
    ("linear_attn", {"feature_map": "hedgehog", "tie_feature_map_qk": True}),
])
def test_layer_variants_give_fla_logits(family, over, tmp_path):
    model = fla_model(family, seed=2, **over)
    src = tmp_path / "src"
    if over.get("tie_feature_map_qk"):  # save_pretrained refuses the shared map: one copy of it
        from safetensors.torch import save_model

        src.mkdir()
        model.config.save_pretrained(src)
        save_model(model, str(src / "model.safetensors"))
    else:
        model.save_pretrained(src)
    import_fla(src, tmp_path / "out")
    atlas = ac.load(tmp_path / "out")
    ids = torch.randint(0, VOCAB, (2, 19), generator=torch.Generator().manual_seed(3))
    want = fla_logits(model, ids)
    with torch.no_grad():
        got = atlas(ids)
        first, state = atlas.step(ids[:, :7])
        rest, _ = atlas.step(ids[:, 7:], state)
    assert want.abs().max() > 0.1
    assert ((got - want).norm() / want.norm()).item() < 1e-4
    torch.testing.assert_close(torch.cat([first, rest], 1), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_generate_continues_as_fla(imported):
    family, model, out, _ = imported
    prompt = [3, 17, 5, 9]
    result = invoke("--format", "json", "generate", out, "--prompt-ids", " ".join(map(str, prompt)),
                    "--greedy", "--max-new-tokens", "6", "--device", "cpu")
    assert result.exit_code == 0, result.output
    got = json.loads(result.output)["ids"]
    ids = torch.tensor([prompt])
    for _ in range(6):  # fla's greedy continuation, recomputing the whole sequence each token
        ids = torch.cat([ids, fla_logits(model, ids)[:, -1:].argmax(-1)], 1)
    assert got[-6:] == ids[0, -6:].tolist()


def test_eval_and_export_hf(imported, tmp_path):
    family, model, out, _ = imported
    result = invoke("--format", "json", "eval", out, "--task", '{use = "mqar", num_pairs = 4, seq_len = 32}',
                    "--batches", "1", "--batch-size", "4", "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert 0.0 <= json.loads(result.output)["accuracy"] <= 1.0
    transformers = pytest.importorskip("transformers")
    result = invoke("export-hf", out, tmp_path / "hf")
    assert result.exit_code == 0, result.output
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(0, VOCAB, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, fla_logits(model, ids), rtol=1e-4, atol=1e-4)
    # Hugging Face's decoding carries the state (RetNet's rotary position included) token by token
    ids = torch.tensor([[3, 17, 5, 9]])
    got = hf.generate(ids, max_new_tokens=5, do_sample=False)
    for _ in range(5):
        ids = torch.cat([ids, fla_logits(model, ids)[:, -1:].argmax(-1)], 1)
    assert got.tolist() == ids.tolist()


@pytest.mark.parametrize("family, over, path", [
    ("delta_net", {"qk_norm": "sum"}, "config.qk_norm"),
    # fla builds num_v_heads < num_heads, which its kernels cannot run (value head i reads q/k head
    # i // (HV // H)); a multiple of num_heads imports (test_import_fla_hybrid.py)
    ("gated_deltanet", {"head_dim": 8, "num_v_heads": 1}, "config.num_v_heads"),
    ("kda", {"head_dim": 8, "safe_gate": True, "lower_bound": -5.0}, "config.safe_gate"),
    ("gla", {"clamp_min": -3.0}, "config.clamp_min"),
    ("retnet", {"num_kv_heads": 1}, "config.num_kv_heads"),
    ("linear_attn", {"feature_map": "dpfp"}, "config.feature_map"),
    ("linear_attn", {"norm_feature_map": True}, "config.norm_feature_map"),
])
def test_unsupported_options_are_named(family, over, path, tmp_path):
    fla_model(family, **over).save_pretrained(tmp_path / "src")
    with pytest.raises(SpecError) as err:
        import_fla(tmp_path / "src", tmp_path / "out")
    assert path in str(err.value) and not (tmp_path / "out").exists()
    result = invoke("import-fla", tmp_path / "src", tmp_path / "out2")
    assert result.exit_code != 0 and path in result.output


def test_unsupported_family_says_why(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "rwkv7", "hidden_size": 8}))
    with pytest.raises(SpecError, match="token shift"):
        import_fla(tmp_path, tmp_path / "out")


@pytest.mark.parametrize("key, value", [("num_heads", None), ("hidden_size", "64"), ("num_hidden_layers", 0)])
def test_missing_or_bad_sizes_are_named(key, value, tmp_path):
    cfg = {"model_type": "delta_net", "vocab_size": 16, "hidden_size": 32, "num_hidden_layers": 2,
           "num_heads": 2}
    if value is None:
        del cfg[key]
    else:
        cfg[key] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match=rf"config\.{key}: must be a positive integer"):
        import_fla(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
