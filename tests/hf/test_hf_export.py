"""``atlas export-hf`` and `export_checkpoint`: text models (codec, suppressed ids), refusals of
bad input, and what Hugging Face decoding does not support."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers", reason="the Hugging Face integration needs transformers "
                    "(pip install 'atlas-ttm[hf]')")

import torch  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

import atlas_core  # noqa: E402,F401
from atlas_cli.main import make_app  # noqa: E402
from atlas_core.train.inference import generate_from_checkpoint  # noqa: E402

from .specs import SPECS, VOCAB, make_checkpoint  # noqa: E402

CHARS = list("abcdefghij")  # 10 characters, VOCAB = 32 ids: ids 10.. mean nothing


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("mqar"), SPECS["core_lm"], seed=3)


@pytest.fixture(scope="module")
def char_ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("char"), SPECS["mal"], seed=4,
                           text={"mode": "char", "vocab": CHARS})


def invoke(args):
    return CliRunner().invoke(make_app(), args)


def test_cli_exports_a_directory_that_loads(ckpt, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    result = invoke(["--format", "json", "export-hf", str(ckpt.parent.parent), str(out)])  # the run dir
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["arch"] == "core:lm" and data["step"] == 1 and data["out_dir"] == str(out)
    assert {"config.json", "model.safetensors", "generation_config.json"} <= set(data["files"])
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "atlas_memory" and config["atlas_spec"]["model"]["arch"] == "core:lm"
    model = AutoModelForCausalLM.from_pretrained(out)
    from atlas_core.train.checkpoint import load_checkpoint

    assert model.config.atlas_spec_hash == load_checkpoint(ckpt).spec.spec_hash
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_every_exported_file_has_the_mode_of_a_new_file(ckpt, tmp_path):
    """model.safetensors was left 0600 (safetensors writes through a private temporary file)
    while the rest was 0644: every file now gets 0666 less the umask."""
    import os
    import stat

    out = tmp_path / "hf"
    old = os.umask(0o022)
    try:
        assert invoke(["export-hf", str(ckpt), str(out)]).exit_code == 0
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir() if p.is_file()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes


def test_cli_refuses_a_non_empty_directory_unless_overwrite(ckpt, tmp_path):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = invoke(["export-hf", str(ckpt), str(out)])
    assert result.exit_code == 1
    assert "not empty" in result.stderr and "--overwrite" in result.stderr
    assert "Traceback" not in result.output and (out / "keep.txt").read_text() == "mine"
    result = invoke(["export-hf", str(ckpt), str(out), "--overwrite"])
    assert result.exit_code == 0, result.output
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()


def test_cli_bad_checkpoint_is_one_line(tmp_path):
    result = invoke(["export-hf", str(tmp_path / "nowhere"), str(tmp_path / "out")])
    assert result.exit_code == 1 and result.stderr.startswith("error: ")
    assert "does not exist" in result.stderr and not (tmp_path / "out").exists()


def test_cli_help_shows_an_example():
    result = invoke(["export-hf", "--help"])
    assert result.exit_code == 0 and "atlas export-hf" in result.stdout and "--overwrite" in result.stdout


def test_char_model_suppresses_ids_past_its_vocabulary(char_ckpt, tmp_path):
    from transformers import AutoModelForCausalLM

    from atlas_core.hf import export_checkpoint

    export_checkpoint(char_ckpt, tmp_path / "hf")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert model.generation_config.suppress_tokens == list(range(len(CHARS), VOCAB))
    codec = model.config.codec()
    assert codec.mode == "char" and list(codec.vocab) == CHARS
    native = generate_from_checkpoint(str(char_ckpt), prompt="badge", max_new_tokens=32,
                                      greedy=True, device="cpu")
    prompt = torch.tensor([codec.encode("badge")])
    out = model.generate(prompt, max_new_tokens=32, do_sample=False)
    new = out[0, prompt.shape[1]:].tolist()
    assert new == native["ids"] and max(new) < len(CHARS)
    assert codec.decode(new) == native["text"]
    # without the suppression the model would pick meaningless ids: the setting matters
    free = model.generate(prompt, max_new_tokens=32, do_sample=False, suppress_tokens=None)
    assert max(free[0, prompt.shape[1]:].tolist()) >= len(CHARS)


def test_unsupported_decoding_is_refused_with_a_reason(ckpt, tmp_path):
    from atlas_core.hf import AtlasConfig, AtlasForCausalLM, AtlasMemoryCache
    from atlas_core.train.inference import open_checkpoint

    c, native, _ = open_checkpoint(str(ckpt), "cpu")
    model = AtlasForCausalLM(AtlasConfig.from_spec(c.spec), native=native).eval()
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with pytest.raises(ValueError, match="padding"):
        model.generate(ids, attention_mask=torch.tensor([[0, 1, 1], [1, 1, 1]]), max_new_tokens=2)
    with pytest.raises(ValueError, match="num_beams=2: beam search"):
        model.generate(ids, num_beams=2, max_new_tokens=2)
    with pytest.raises(TypeError, match="AtlasMemoryCache"):
        model(ids, past_key_values=object())
    # continuing a cache by hand equals one call over the whole sequence
    cache = AtlasMemoryCache()
    first = model(ids[:, :2], past_key_values=cache, use_cache=True).logits
    second = model(ids[:, 2:], past_key_values=cache).logits
    assert cache.get_seq_length() == 3
    torch.testing.assert_close(torch.cat([first, second], 1), native(ids), rtol=0, atol=1e-5)
    # the cache's newer keyword is the same thing; both at once is refused
    again = AtlasMemoryCache()
    model(ids[:, :2], cache=again, use_cache=True)
    torch.testing.assert_close(model(ids[:, 2:], cache=again).logits, second, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="both cache and past_key_values"):
        model(ids, cache=AtlasMemoryCache(), past_key_values=AtlasMemoryCache())


def test_generate_continues_a_cache_it_is_given(ckpt):
    """generate() with a cache that holds the prompt's state feeds only the new tokens and gives
    the tokens of one generate() over the prompt."""
    from atlas_core.hf import AtlasConfig, AtlasForCausalLM, AtlasMemoryCache
    from atlas_core.hf.modeling import CACHE_NAME
    from atlas_core.train.inference import open_checkpoint

    c, native, _ = open_checkpoint(str(ckpt), "cpu")
    model = AtlasForCausalLM(AtlasConfig.from_spec(c.spec), native=native).eval()
    prompt = torch.tensor([[1, 2, 3, 4]])
    whole = model.generate(prompt, max_new_tokens=6, do_sample=False)
    cache = AtlasMemoryCache()
    with torch.no_grad():
        model(prompt[:, :3], cache=cache, use_cache=True)
    fed = []
    step = model.model.step
    model.model.step = lambda ids, state=None: (fed.append(ids.shape[1]), step(ids, state))[1]
    try:
        out = model.generate(prompt, max_new_tokens=6, do_sample=False, **{CACHE_NAME: cache})
    finally:
        del model.model.step
    assert torch.equal(out, whole)
    assert fed == [1] * 6  # the prompt's last token, then one per step


def test_config_refuses_a_spec_that_does_not_load():
    from atlas_core.hf import AtlasConfig

    bad = dict(SPECS["core_lm"], model={**SPECS["core_lm"]["model"], "d_model": -1})
    with pytest.raises(ValueError, match="atlas_spec.*d_model"):
        AtlasConfig(atlas_spec=bad)
    with pytest.raises(ValueError, match="text_codec"):
        AtlasConfig(atlas_spec=SPECS["core_lm"], text_codec={"mode": "words"})


def test_bpe_model_exports_its_tokenizer(tmp_path):
    pytest.importorskip("tokenizers", reason="BPE needs tokenizers (a transformers dependency)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from atlas_core.hf import export_checkpoint
    from atlas_core.train.tokenizer import train_bpe

    docs = ["the memory reads the keys", "the values are written to the memory", "keys and values"] * 4
    tok = train_bpe(docs, 270, min_frequency=1)
    spec = dict(SPECS["core_lm"], model={**SPECS["core_lm"]["model"], "vocab_size": 300})
    ckpt = make_checkpoint(tmp_path, spec, seed=5, text={"mode": "bpe", "tokenizer": tok.to_str()})
    out = tmp_path / "hf"
    summary = export_checkpoint(ckpt, out)
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(summary["files"])
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    hf_tok = AutoTokenizer.from_pretrained(out)
    size = tok.get_vocab_size()
    assert model.generation_config.suppress_tokens == list(range(size, 300))
    prompt = "the memory"
    ids = hf_tok(prompt, add_special_tokens=False)["input_ids"]
    assert ids == model.config.codec().encode(prompt) == tok.encode(prompt).ids
    native = generate_from_checkpoint(str(ckpt), prompt=prompt, max_new_tokens=32, greedy=True,
                                      device="cpu")
    out_ids = model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
    new = out_ids[0, len(ids):].tolist()
    assert new == native["ids"] and max(new) < size
    assert hf_tok.decode(new) == native["text"]


POLY = {"schema": "atlas/1", "name": "hf-poly",
        "model": {"arch": "core:lm", "vocab_size": VOCAB, "d_model": 16, "depth": 1, "heads": 2},
        "memory": {"structure": "core:linear", "bias": "core:l2", "retention": "core:none",
                   "algorithm": "core:gd", "read": "after",
                   # fixed coefficients: a buffer that is not saved with the weights
                   "feature_map": {"use": "omega:poly", "mode": "elementwise", "degree": 2,
                                   "coefficients": "fixed"}}}


def test_unsaved_buffers_get_their_build_values_on_loading(tmp_path):
    from transformers import AutoModelForCausalLM

    from atlas_core.hf import AtlasConfig, AtlasForCausalLM
    from atlas_core.model import build_model

    native = build_model(POLY).eval()
    unsaved = {n for n, _ in native.named_buffers()} - set(native.state_dict())
    assert unsaved  # the case under test
    AtlasForCausalLM(AtlasConfig.from_spec(native.spec), native=native).save_pretrained(tmp_path)
    back = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    for name, buf in native.named_buffers():
        assert torch.equal(dict(back.model.named_buffers())[name], buf), name
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, native(ids), rtol=0, atol=1e-5)


def test_weights_that_do_not_fit_are_refused(ckpt, tmp_path):
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from atlas_core.hf import export_checkpoint

    export_checkpoint(ckpt, tmp_path / "hf")
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    dropped = sorted(k for k in weights if k.endswith("norm_mlp.weight"))[0]
    del weights[dropped]
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f"missing {dropped}.*atlas export-hf"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "hf")


def test_bench_runs_both_loops_and_compares_them(tmp_path, capsys):
    from atlas_core.hf.bench import main
    from atlas_core.spec import dump_toml

    path = tmp_path / "tiny.toml"
    path.write_text(dump_toml(SPECS["mac"]))
    main([str(path), "--new-tokens", "6", "--prompt", "3", "--repeats", "1"])
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{path}: native ") and line.endswith("(same tokens)")


def test_a_bfloat16_export_loads_in_bfloat16_with_float32_logits_close(ckpt, tmp_path):
    from transformers import AutoModelForCausalLM

    r32 = invoke(["export-hf", str(ckpt), str(tmp_path / "f32")])
    r16 = invoke(["--format", "json", "export-hf", str(ckpt), str(tmp_path / "bf16"), "--dtype", "bfloat16"])
    assert r32.exit_code == 0 and r16.exit_code == 0, r16.output
    assert json.loads(r16.stdout)["dtype"] == "bfloat16"
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    size = {d: (tmp_path / d / "model.safetensors").stat().st_size for d in ("f32", "bf16")}
    assert size["bf16"] < 0.6 * size["f32"]
    m32 = AutoModelForCausalLM.from_pretrained(tmp_path / "f32").eval()
    m16 = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16").eval()
    assert {p.dtype for p in m16.parameters()} == {torch.bfloat16}
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = m32(ids).logits, m16(ids).logits
    assert (b.float() - a).abs().max() < 0.05 * a.abs().max()


def test_an_unknown_export_dtype_is_one_line(ckpt, tmp_path):
    r = invoke(["export-hf", str(ckpt), str(tmp_path / "x"), "--dtype", "float16"])
    assert r.exit_code != 0
    assert "dtype 'float16'" in r.output and "float32, bfloat16" in r.output
    assert not (tmp_path / "x").exists()
