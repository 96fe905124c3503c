"""The Python API (atlas_core.train, atlas_core.load, Run): a tiny spec trained a few steps, the
model loaded back, and the same run made through `atlas train` (the command calls the API)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import atlas_core as ac
from atlas_core.api import Run, collect_overrides
from atlas_core.errors import SpecError
from atlas_core.spec import dump_toml, load_spec
from atlas_cli.main import make_app
from tests.train.conftest import TINY

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = {"model.d_model": 8, "train.eval_batches": 1}


@pytest.fixture(scope="module")
def api_run(tmp_path_factory) -> Run:
    out = tmp_path_factory.mktemp("api") / "run"
    return ac.train(TINY, out=out, steps=3, batch_size=2, **OVERRIDES)


def test_run_exposes_directory_metrics_spec_and_history(api_run):
    assert api_run.run_dir.is_dir() and (api_run.run_dir / "spec.toml").is_file()
    m = api_run.metrics
    assert m["steps"] == 3 and 0.0 <= m["accuracy"] <= 1.0
    assert m["perplexity"] == pytest.approx(torch.tensor(m["eval_loss"]).exp().item(), rel=1e-5)
    spec = api_run.spec
    assert spec.model["d_model"] == 8 and spec.train["steps"] == 3
    assert spec.train["batch_size"] == 2 and spec.train["eval_batches"] == 1
    assert spec.model["depth"] == TINY["model"]["depth"]  # the rest is the given spec's
    assert spec.spec_hash == api_run.result["spec_hash"]
    kinds = [r["kind"] for r in api_run.history]
    assert kinds.count("train") == 3 and kinds[-1] == "run"
    assert api_run.checkpoint.name == "step-000000003"


def test_load_gives_the_trained_model_in_eval_mode(api_run):
    model = ac.load(api_run.run_dir)
    assert not model.training
    assert model.spec == api_run.spec and model.trained_steps == 3
    assert model.codec is None and model.task["use"] == "core:mqar"
    assert Path(model.checkpoint) == api_run.checkpoint
    same = ac.load(api_run.checkpoint)  # a checkpoint directory loads the same weights
    for (name, a), (_, b) in zip(model.state_dict().items(), same.state_dict().items()):
        assert torch.equal(a, b), name
    ids = torch.randint(0, 16, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids)
    assert logits.shape == (2, 16, 16) and torch.isfinite(logits).all()
    out = model.generate(ids[:1, :5], max_new_tokens=4, greedy=True)
    assert out.shape == (1, 9) and torch.equal(out[:, :5], ids[:1, :5])
    # Run.model is that model
    for (name, a), (_, b) in zip(api_run.model.state_dict().items(), model.state_dict().items()):
        assert torch.equal(a, b), name


def test_the_cli_path_trains_the_same_run(api_run, tmp_path):
    spec_file = tmp_path / "tiny.toml"
    spec_file.write_text(dump_toml(TINY))
    out = tmp_path / "cli"
    r = CliRunner().invoke(make_app(plugin_apps=False), [
        "--format", "json", "train", str(spec_file), "model.d_model=8", "train.eval_batches=1",
        "--steps", "3", "--batch-size", "2", "--out", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    cli = json.loads(r.stdout)
    assert cli["spec_hash"] == api_run.result["spec_hash"]
    for key in ("accuracy", "eval_loss", "eval_tokens", "params", "steps"):
        assert cli[key] == api_run.result[key], key
    a, b = ac.load(out).state_dict(), ac.load(api_run.run_dir).state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name  # the CPU run is deterministic


def test_keyword_forms_are_the_same_overrides():
    dotted = collect_overrides(None, {"model.d_model": 8, "train.lr": 1e-3})
    nested = collect_overrides(None, {"model": {"d_model": 8}, "train": {"lr": 1e-3}})
    texts = collect_overrides(["model.d_model=8", "train.lr=1e-3"])
    common = collect_overrides(None, {"model.d_model": 8}, lr=1e-3)
    keyed = [[(o.key, o.value) for o in ovs] for ovs in (dotted, nested, texts, common)]
    assert keyed[0] == keyed[1] == keyed[2] == keyed[3] == [("model.d_model", 8), ("train.lr", 1e-3)]
    assert [o.key for o in collect_overrides(None, {"name": "x"})] == ["name"]


def test_unknown_keywords_and_bad_overrides_fail_before_training(tmp_path):
    with pytest.raises(TypeError, match=r"did you mean \*\*\{'train.warmup_steps'"):
        ac.train(TINY, out=tmp_path / "a", warmup_steps=3)
    with pytest.raises(TypeError, match="did you mean 'model'"):
        ac.train(TINY, out=tmp_path / "a", **{"modle.d_model": 8})
    with pytest.raises(SpecError) as info:
        ac.train(TINY, out=tmp_path / "a", lr=-1.0)
    (issue,) = info.value.issues
    assert issue.path == "train.lr" and "set by the override --lr -1.0" in issue.hint
    assert not (tmp_path / "a").exists()


def test_resume_with_overrides_continues_the_run(api_run, tmp_path):
    import shutil

    run_dir = tmp_path / "resumed"
    shutil.copytree(api_run.run_dir, run_dir)
    more = ac.train(resume=run_dir, steps=5, lr=1e-3)
    assert more.metrics["steps"] == 5 and more.run_dir == run_dir
    assert more.spec.train["steps"] == 5 and more.spec.train["lr"] == 1e-3
    with pytest.raises(Exception, match="different model"):
        ac.train(resume=run_dir, steps=9, **{"model.d_model": 16})


def test_a_text_model_loads_with_its_codec(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("abcab cabca bcabc " * 20)
    run = ac.train(TINY, out=tmp_path / "text", steps=1, batch_size=2,
                   train={"task": {"use": "text", "path": str(text), "mode": "char", "seq_len": 16},
                          "eval_batches": 1})
    model = ac.load(run.run_dir)
    assert model.codec is not None and model.codec.mode == "char"
    assert model.codec.decode(model.codec.encode("cab ab")) == "cab ab"


def test_the_readme_python_api_example_runs(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Python API", 1)[1]
    code = section.split("```python", 1)[1].split("```", 1)[0]
    assert "runs/mqar-small" in code
    code = code.replace("runs/mqar-small", str(tmp_path / "mqar-small"))
    monkeypatch.chdir(ROOT)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["run"].metrics["steps"] == 20
    assert scope["run"].spec.model["d_model"] == 32
    assert tuple(scope["logits"].shape) == (1, 64, 64)


def test_import_stays_cheap_and_train_is_the_package():
    code = ("import sys, atlas_core as ac; ac.train; ac.load; ac.Run; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "import atlas_core.train.params; assert ac.train is sys.modules['atlas_core.train']; "
            "assert callable(ac.train); print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_a_subword_model_loads_with_its_tokenizer(tmp_path):
    from atlas_core.train.tokenizer import train_bpe

    corpus = ["the cat sat on the mat. the dog sat on the log. " * 4 for _ in range(8)]
    tok = train_bpe(corpus, vocab_size=270)
    tok.save(str(tmp_path / "tokenizer.json"))
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(corpus))
    vocab = tok.get_vocab_size()
    run = ac.train(TINY, out=tmp_path / "bpe", steps=1, batch_size=2,
                   **{"model.vocab_size": vocab, "train.eval_batches": 1,
                      "train.task": {"use": "text", "path": str(text), "mode": "bpe",
                                     "tokenizer": str(tmp_path / "tokenizer.json"), "seq_len": 16}})
    model = ac.load(run.run_dir)
    assert model.tokenizer is not None and model.codec.mode == "bpe"
    ids = model.tokenizer.encode("the cat sat", add_special_tokens=False).ids
    assert ids == tok.encode("the cat sat", add_special_tokens=False).ids
    assert model.codec.decode(model.codec.encode("the dog")).strip() == "the dog"


def test_a_loaded_model_has_its_decode_matrices_in_place(api_run):
    """`atlas_core.load` places each decode step's fused weights in one matrix before reading them:
    the weights equal the checkpoint's, and the decoder's fusing copies nothing."""
    from atlas_core.decode import Decoder
    from atlas_core.train.checkpoint import load_checkpoint

    model = ac.load(api_run.run_dir)
    want = load_checkpoint(api_run.checkpoint)
    plain = ac.build_model(want.spec)
    want.load_model(plain)
    for (name, a), (_, b) in zip(model.state_dict().items(), plain.state_dict().items()):
        assert torch.equal(a, b), name
    layer = next(b.memory for b in model.blocks if getattr(b, "memory", None) is not None)
    q, k = layer.q_proj.weight, layer.k_proj.weight
    assert q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()  # one matrix
    assert k.data_ptr() == q.data_ptr() + q.numel() * q.element_size()
    before = {n: p.data_ptr() for n, p in model.named_parameters()}
    Decoder(model, max_len=32)
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == before
    assert all(p.requires_grad for p in model.parameters())  # still trainable
