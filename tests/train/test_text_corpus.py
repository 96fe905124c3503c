"""Real text data: corpora read through `datasets` (text, JSON Lines, Parquet), a BPE tokenizer
trained locally with `atlas tokenizer train`, documents separated by the end-of-text token, the
tokenizer kept in every checkpoint, decoded text from `atlas generate`."""

from __future__ import annotations

import copy
import json
import random

import pytest
import torch
from typer.testing import CliRunner

from atlas_cli.main import make_app
from atlas_core.errors import SpecError
from atlas_core.spec import dump_toml
from atlas_core.train.codec import TextCodec
from atlas_core.train.tasks.base import TaskDataError
from atlas_core.train.tasks.corpus import read_documents
from atlas_core.train.tasks.text import TextTask
from atlas_core.train.tokenizer import EOT, TokenizerError, load_tokenizer, train_bpe

from .conftest import TINY

runner = CliRunner()
WORDS = ("the memory learns a key and a value at every token while the model reads it back "
         "later on as the gate decides what stays").split()


def invoke(args):
    return runner.invoke(make_app(plugin_apps=False), args, catch_exceptions=False)


def _docs(n=120, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 30))) for _ in range(n)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("corpus")
    docs = _docs()
    path = tmp / "corpus.jsonl"
    path.write_text("".join(json.dumps({"body": d, "n": i}) + "\n" for i, d in enumerate(docs)))
    return tmp, path, docs


@pytest.fixture(scope="module")
def tokenizer_file(corpus):
    tmp, path, _ = corpus
    out = tmp / "tokenizer.json"
    r = invoke(["--format", "json", "tokenizer", "train", str(path), "--text-field", "body",
                "--vocab-size", "300", "--out", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["vocab_size"] == 300 and data["documents"] == 120
    return out


def test_formats_read_the_same_documents(tmp_path, corpus):
    _, jsonl, docs = corpus
    assert read_documents(jsonl, text_field="body") == docs
    pq = pytest.importorskip("pyarrow.parquet", reason="datasets installs pyarrow")
    import pyarrow as pa

    pq.write_table(pa.table({"body": docs}), tmp_path / "c.parquet")
    assert read_documents(tmp_path / "c.parquet", text_field="body") == docs
    (tmp_path / "c.txt").write_text("one whole document\nwith two lines")
    assert read_documents(tmp_path / "c.txt") == ["one whole document\nwith two lines"]


def test_corpus_errors_name_the_field_and_the_fix(tmp_path, corpus):
    _, jsonl, _ = corpus
    with pytest.raises(TaskDataError, match=r"no field 'text' \(its fields: body, n\); set text_field"):
        read_documents(jsonl)
    (tmp_path / "bad.jsonl").write_text('{"text": 3}\n')
    with pytest.raises(TaskDataError, match="holds int, not text"):
        read_documents(tmp_path / "bad.jsonl")
    (tmp_path / "empty.jsonl").write_text('{"text": ""}\n')
    with pytest.raises(TaskDataError, match="holds no text"):
        read_documents(tmp_path / "empty.jsonl")


def test_bpe_task_separates_documents_with_end_of_text(corpus, tokenizer_file):
    _, path, docs = corpus
    task = TextTask({"path": str(path), "mode": "bpe", "tokenizer": str(tokenizer_file),
                     "text_field": "body", "seq_len": 16, "split": "all"})
    tok = load_tokenizer(tokenizer_file)
    eot = tok.token_to_id(EOT)
    assert task.vocab_size == 300 and eot == 0
    ids = task.tokens.tolist()
    assert ids.count(eot) == len(docs) and ids[-1] == eot
    first = ids[: ids.index(eot)]
    assert task.decode(first) == docs[0]  # byte-level BPE round-trips the text exactly
    assert task.encode(docs[0]).tolist() == first


def test_bpe_params_are_checked(corpus, tokenizer_file, tmp_path):
    _, path, _ = corpus
    with pytest.raises(SpecError, match="mode = 'bpe' needs a tokenizer"):
        TextTask({"path": str(path), "mode": "bpe", "text_field": "body"})
    with pytest.raises(SpecError, match="only with mode = 'bpe'"):
        TextTask({"path": str(path), "mode": "byte", "tokenizer": str(tokenizer_file)})
    # a tokenizer without a mode means bpe
    implied = TextTask({"path": str(path), "tokenizer": str(tokenizer_file), "text_field": "body",
                        "seq_len": 8})
    assert implied.params.mode == "bpe" and implied.vocab_size == 300
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not a tokenizers JSON file"):
        load_tokenizer(tmp_path / "junk.json")
    with pytest.raises(TokenizerError, match="no such file"):
        load_tokenizer(tmp_path / "missing.json")
    with pytest.raises(TokenizerError, match="vocab_size = 10"):
        train_bpe(["a b c"], 10)


def test_codec_from_checkpoint_meta_decodes_without_the_file(tokenizer_file):
    text = tokenizer_file.read_text()
    codec = TextCodec.from_task_meta({"text": {"mode": "bpe", "tokenizer": text}})
    ids = codec.encode("the memory reads it back")
    assert codec.decode(ids) == "the memory reads it back"
    with pytest.raises(ValueError, match="tokenizer's JSON text"):
        TextCodec.from_task_meta({"text": {"mode": "bpe"}})


def test_train_eval_generate_end_to_end(corpus, tokenizer_file, tmp_path):
    """Tokenizer trained on the corpus, 50 steps, perplexity on the validation split, decoded
    generation, the tokenizer exported back from the checkpoint."""
    path = tmp_path / "corpus.jsonl"  # a copy: this test changes it
    path.write_bytes(corpus[1].read_bytes())
    spec = copy.deepcopy(TINY)
    spec["model"].update(arch="core:lm", vocab_size=300)
    spec["train"].update(steps=50, eval_every=25, log_every=25, task={
        "use": "text", "path": str(path), "mode": "bpe", "tokenizer": str(tokenizer_file),
        "text_field": "body", "seq_len": 16, "val_fraction": 0.2})
    spec_path = tmp_path / "bpe.toml"
    spec_path.write_text(dump_toml(spec))
    out = tmp_path / "run"
    r = invoke(["--format", "json", "train", str(spec_path), "--out", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    trained = json.loads(r.stdout)
    assert trained["steps"] == 50
    # evaluation on the held-out 20 % (the files are named again: a checkpoint never picks them)
    task = json.dumps({"use": "text", "path": str(path), "tokenizer": str(tokenizer_file)})
    task = task.replace('": ', '" = ').replace('{"use"', '{use').replace(', "path"', ', path')
    task = task.replace(', "tokenizer"', ', tokenizer')
    r = invoke(["--format", "json", "eval", str(out), "--task", task, "--batches", "2"])
    assert r.exit_code == 0, r.output
    ppl = json.loads(r.stdout)["perplexity"]
    assert 1.0 < ppl < 300.0  # better than uniform over the vocabulary after 50 steps
    # without --task: the corpus the run read (unchanged: its size and SHA-256 are the ones the
    # checkpoint recorded) with the checkpoint's own tokenizer, the same perplexity
    r = invoke(["--format", "json", "eval", str(out), "--batches", "2"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["perplexity"] == pytest.approx(ppl, rel=1e-6)
    # ... and naming the corpus alone: the same
    only_corpus = "{use = \"text\", path = \"%s\"}" % path
    r = invoke(["--format", "json", "eval", str(out), "--task", only_corpus, "--batches", "2"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["perplexity"] == pytest.approx(ppl, rel=1e-6)
    # a corpus changed since: one error that names the file to give, and says the tokenizer is kept
    original = path.read_bytes()
    path.write_bytes(original + b'{"body": "one more document", "n": -1}\n')
    r = invoke(["eval", str(out), "--batches", "2"])
    assert r.exit_code == 1
    assert f"path = {str(path)!r}" in r.stderr and "tokenizer = " not in r.stderr, r.stderr
    assert "is not the one the run read" in r.stderr, r.stderr
    assert "--task '{use = \"core:text\", path = \"FILE\"}'" in r.stderr, r.stderr
    assert "the tokenizer is the checkpoint's own" in r.stderr, r.stderr
    path.write_bytes(original)
    r = invoke(["--format", "json", "generate", str(out), "--prompt", "the memory", "--greedy",
                "--max-new-tokens", "8"])
    assert r.exit_code == 0, r.output
    gen = json.loads(r.stdout)
    assert gen["prompt"] == "the memory" and isinstance(gen["text"], str) and len(gen["ids"]) == 8
    assert load_tokenizer(tokenizer_file).decode(gen["ids"], skip_special_tokens=False) == gen["text"]
    # no prompt: a new document, from the end-of-text token (id 0 of `atlas tokenizer train`)
    r = invoke(["--format", "json", "generate", str(out), "--max-new-tokens", "4"])
    assert r.exit_code == 0, r.output
    free = json.loads(r.stdout)
    assert free["prompt"] == "" and free["prompt_ids"] == [0] and len(free["ids"]) == 4
    r = invoke(["tokenizer", "export", str(out), str(tmp_path / "back.json")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "back.json").read_text() == tokenizer_file.read_text()
    assert torch.isfinite(torch.tensor(ppl))
    # reloaded through Hugging Face transformers, with its tokenizer
    transformers = pytest.importorskip("transformers", reason="extra 'hf'")
    r = invoke(["export-hf", str(out), str(tmp_path / "hf")])
    assert r.exit_code == 0, r.output
    import atlas_core

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    ids = hf_tok("the memory", return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == gen["prompt_ids"]
    native = atlas_core.load(out)
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, native(ids), rtol=1e-5, atol=1e-5)
