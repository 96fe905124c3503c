"""Hugging Face clients on an export, with the packages of the ``clients`` extra (lm-eval, peft;
``pip install 'atlas-ttm[clients]'``). CI runs these in their own job, ``scripts/test_clients.sh``.

- lm-evaluation-harness, from its own command line (``python -m lm_eval``: a process that
  imports ``atlas_core`` only through the export's remote code) with ``--model hf --model_args
  pretrained=EXPORT,trust_remote_code=True`` on the local task of ``lm_eval_task/`` (a YAML and
  a JSONL), on a char-level and on a BPE export; its figure equals ``atlas eval``'s on the same
  text. Both measure one window: the corpus is the task's document three times, and its held-out
  split is exactly the last copy with the token before it (the blank line's second newline, or
  the end-of-text token), so ``atlas eval --seq-len T`` has one window to draw, and lm-eval's
  rolling log-likelihood of the document (after that same token, ``prefix_token_id``) predicts
  the same tokens from the same context. Char model of ASCII text: lm-eval's byte perplexity is
  the per-character perplexity; BPE: its bits per byte times the document's bytes is the summed
  loss.
- PEFT LoRA on an export: a few optimizer steps, ``save_pretrained``, reloaded on a fresh base,
  merged: the same logits each time.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the Hugging Face clients need transformers (extra 'hf')")
pytest.importorskip("lm_eval", reason="lm-evaluation-harness: pip install 'atlas-ttm[clients]' "
                    "(scripts/test_clients.sh installs it)")
pytest.importorskip("peft", reason="PEFT: pip install 'atlas-ttm[clients]' (scripts/test_clients.sh "
                    "installs it)")

import torch  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from atlas_cli.main import make_app  # noqa: E402

TASK_DIR = Path(__file__).resolve().parent / "lm_eval_task"
DOC = json.loads((TASK_DIR / "atlas_text.jsonl").read_text().splitlines()[0])["text"]
COPIES = 3
EOT = "<|endoftext|>"


def atlas(*args):
    r = CliRunner().invoke(make_app(plugin_apps=False), list(args))
    assert r.exit_code == 0, r.output
    return r.stdout


def _spec(name: str, task: str, vocab: int) -> str:
    return f"""schema = "atlas/1"
name = "{name}"
[model]
arch = "core:lm"
vocab_size = {vocab}
d_model = 32
depth = 1
heads = 2
[memory]
structure = "core:linear"
bias = "core:l2"
retention = "core:decay"
algorithm = "core:gd"
[train]
task = {task}
steps = 20
batch_size = 8
warmup_steps = 2
eval_every = 0
threads = 1
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A folder with the task (YAML + JSONL), the corpus (the document three times), a char
    and a BPE run of it, and their exports."""
    root = tmp_path_factory.mktemp("clients")
    for f in TASK_DIR.iterdir():
        shutil.copyfile(f, root / f.name)
    (root / "corpus.jsonl").write_text((json.dumps({"text": DOC}) + "\n") * COPIES)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        atlas("tokenizer", "train", "corpus.jsonl", "--vocab-size", "300", "--out", "tok.json")
        for mode, task, vocab in (
                ("char", '{ use = "text", path = "corpus.jsonl", mode = "char", seq_len = 32 }', 64),
                ("bpe", '{ use = "text", path = "corpus.jsonl", tokenizer = "tok.json", seq_len = 16 }',
                 300)):
            (root / f"{mode}.toml").write_text(_spec(f"clients-{mode}", task, vocab))
            atlas("train", f"{mode}.toml", "--out", f"run-{mode}", "--no-progress")
            atlas("export-hf", f"run-{mode}", f"hf-{mode}")
    finally:
        os.chdir(cwd)
    return root


def _atlas_eval(root: Path, mode: str, total: int, window: int) -> dict:
    """`atlas eval` of the held-out split = the last ``window`` tokens of the corpus (``total``
    tokens), one window of ``window - 1`` targets (every row of every batch is that window)."""
    fraction = (window + 0.5) / total  # int(total * fraction) == window, whatever the rounding
    cwd = os.getcwd()
    os.chdir(root)
    try:
        out = atlas("--format", "json", "eval", f"run-{mode}", "--task",
                    f'{{use = "text", path = "corpus.jsonl", val_fraction = {fraction!r}}}',
                    "--seq-len", str(window - 1), "--batches", "1", "--batch-size", "1")
    finally:
        os.chdir(cwd)
    result = json.loads(out)
    assert result["tokens"] == window - 1
    return result


def _lm_eval(root: Path, mode: str, extra_args: str = "") -> dict:
    """``python -m lm_eval`` in a new process, in ``root`` (where the task reads its JSONL)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATLAS_")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_CACHE=str(root / "datasets-cache"), TOKENIZERS_PARALLELISM="false")
    args = f"pretrained={root / f'hf-{mode}'},trust_remote_code=True{extra_args}"
    r = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", args,
         "--tasks", f"atlas_text_{'bpe' if mode == 'bpe' else 'char'}", "--include_path", str(root),
         "--device", "cpu", "--batch_size", "1", "--output_path", str(root / f"out-{mode}")],
        cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (path,) = (root / f"out-{mode}").rglob("results*.json")
    return json.loads(path.read_text())["results"][f"atlas_text_{'bpe' if mode == 'bpe' else 'char'}"]


def test_lm_eval_on_a_char_export_equals_atlas_eval(work):
    assert DOC.isascii()  # one byte per character: byte perplexity = per-character perplexity
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(work / "hf-char", trust_remote_code=True)
    newline = tok.convert_tokens_to_ids("\n")
    # corpus: DOC \n\n DOC \n\n DOC; held out: "\n" + DOC, one window predicting DOC after "\n"
    ours = _atlas_eval(work, "char", COPIES * len(DOC) + 2 * (COPIES - 1), len(DOC) + 1)
    theirs = _lm_eval(work, "char", f",prefix_token_id={newline}")
    assert theirs["byte_perplexity,none"] == pytest.approx(ours["perplexity"], rel=1e-5)
    assert theirs["bits_per_byte,none"] == pytest.approx(ours["loss"] / math.log(2), rel=1e-5)


def test_lm_eval_on_a_bpe_export_equals_atlas_eval(work):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(work / "hf-bpe", trust_remote_code=True)
    doc_ids = tok(DOC)["input_ids"]
    assert tok(DOC + EOT)["input_ids"] == doc_ids + [tok.eos_token_id]  # what lm-eval encodes
    n = len(doc_ids)
    # corpus: (DOC EOT) x 3; held out: EOT DOC EOT, one window predicting DOC EOT after EOT
    # (lm-eval's prefix: the tokenizer's eos_token)
    ours = _atlas_eval(work, "bpe", COPIES * (n + 1), n + 2)
    theirs = _lm_eval(work, "bpe")
    summed = theirs["bits_per_byte,none"] * len((DOC + EOT).encode()) * math.log(2)
    assert summed / (n + 1) == pytest.approx(ours["loss"], rel=1e-5)


def test_peft_lora_trains_saves_reloads_and_merges(work, tmp_path):
    """LoRA adapters on the memory layers' projections: 5 AdamW steps on the next-token loss,
    saved and reloaded on a fresh base (the same logits as the trained model), merged (the same
    logits again), the merged model saved and loaded back as an atlas export."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    export = work / "hf-char"
    tok = AutoTokenizer.from_pretrained(export, trust_remote_code=True)
    ids = torch.tensor([tok(DOC[:64])["input_ids"]])
    base = AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True)
    with torch.no_grad():
        before = base(ids).logits
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                        lora_dropout=0.0, task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    losses = []
    for _ in range(5):
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    model.eval()
    with torch.no_grad():
        tuned = model(ids).logits
    assert not torch.allclose(tuned, before, atol=1e-4)  # the adapters changed the model
    model.save_pretrained(tmp_path / "adapter")
    fresh = AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True)
    reloaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, tuned, rtol=0, atol=1e-6)
    merged = reloaded.merge_and_unload()
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, tuned, rtol=1e-5, atol=1e-5)
    merged.save_pretrained(tmp_path / "merged")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", trust_remote_code=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, tuned, rtol=1e-5, atol=1e-5)
