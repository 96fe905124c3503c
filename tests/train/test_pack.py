"""Packed training (``[train] pack = true``): the text task's packed batches mark where each
document begins and mask the targets that begin a document (byte, char and bpe modes); packing
rows gives the right cu_seqlens; the trainer's first packed loss equals a hand computation from
one forward per document; a task without documents is refused."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F

import atlas_core as ac
from atlas_core.errors import SpecError
from atlas_core.train.metrics import read_metrics
from atlas_core.train.setup import TrainOptions
from atlas_core.train.tasks import IGNORE_INDEX
from atlas_core.train.tasks.text import TextTask
from atlas_core.train.tokenizer import eot_id, train_bpe
from atlas_core.train.launch import train
from atlas_core.varlen import pack_rows

from .conftest import TINY

DOCS = ["alpha beta", "gamma", "delta epsilon zeta", "eta", "theta iota"] * 4


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    return path


def _starts_by_hand(docs, unit) -> set[int]:
    """Positions of the first token of every document, documents joined by "\\n\\n"."""
    out, pos = set(), 0
    for d in docs:
        out.add(pos)
        pos += len(unit(d)) + 2
    return out


@pytest.mark.parametrize("mode,unit", [("byte", lambda d: d.encode()), ("char", lambda d: d)])
def test_packed_batch_marks_documents_and_masks_their_first_targets(corpus, mode, unit):
    task = TextTask({"path": str(corpus), "mode": mode, "seq_len": 12, "split": "all"})
    first = _starts_by_hand(DOCS, unit)
    assert set(torch.nonzero(task.first).squeeze(1).tolist()) == first
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    inputs, targets, starts = task.packed_batch(8, g1)
    plain_in, plain_tg = task.batch(8, g2)  # the same windows
    assert torch.equal(inputs, plain_in)
    offsets = torch.randint(0, task.tokens.numel() - 12, (8, 1), generator=torch.Generator().manual_seed(3))
    for r in range(8):
        o = int(offsets[r])
        assert starts[r, 0]
        for t in range(12):
            if t:
                assert bool(starts[r, t]) == ((o + t) in first)
            want = IGNORE_INDEX if (o + t + 1) in first else int(plain_tg[r, t])
            assert int(targets[r, t]) == want
    assert (targets == IGNORE_INDEX).any() and starts[:, 1:].any()


def test_bpe_documents_begin_after_end_of_text(corpus, tmp_path):
    tok = train_bpe(DOCS, 300, min_frequency=1)
    tok.save(str(tmp_path / "tok.json"))
    task = TextTask({"path": str(corpus), "tokenizer": str(tmp_path / "tok.json"), "seq_len": 10,
                     "split": "all"})
    eot = eot_id(task.tokenizer)
    want = [0] + [i + 1 for i in torch.nonzero(task.tokens[:-1] == eot).squeeze(1).tolist()]
    assert torch.nonzero(task.first).squeeze(1).tolist() == want
    assert len(want) == len(DOCS)
    inputs, targets, starts = task.packed_batch(4, torch.Generator().manual_seed(0))
    # a document's first target after the end-of-text token is never predicted
    after_eot = torch.zeros_like(starts)
    after_eot[:, 1:] = inputs[:, :-1] == eot
    assert torch.equal(starts[:, 1:], after_eot[:, 1:])
    assert (targets[inputs == eot] == IGNORE_INDEX).all()


def test_pack_rows_lists_every_boundary():
    rows = torch.arange(8).reshape(2, 4)
    starts = torch.tensor([[True, False, True, False], [True, True, False, False]])
    row, cu = pack_rows(rows, starts)
    assert row.tolist() == [list(range(8))] and cu.tolist() == [0, 2, 4, 5, 8]
    with pytest.raises(ValueError, match="True at the first position"):
        pack_rows(rows, torch.zeros(2, 4, dtype=torch.bool))


def _spec(corpus):
    spec = copy.deepcopy(TINY)
    spec["model"]["vocab_size"] = 256
    spec["memory"] = {"use": "titans:titans", "parallel": {"use": "core:exact_chunk", "chunk_size": 4}}
    spec["layer"] = {"conv_size": 3}
    spec["train"].update({"task": {"use": "text", "path": str(corpus), "seq_len": 16},
                          "pack": True, "steps": 3, "eval_every": 0, "eval_batches": 1})
    return spec


def test_packed_training_loss_is_the_per_document_loss(tmp_path, corpus):
    spec = _spec(corpus)
    out = tmp_path / "run"
    train(TrainOptions(spec=spec, out=str(out), progress=False))
    losses = [r["loss"] for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    # the first step's loss by hand: the same initial model and first batch, one forward per
    # document, cross-entropy over the targets that do not begin a document
    torch.manual_seed(0)
    model = ac.build_model({k: v for k, v in spec.items() if k != "train"})
    task = TextTask({"path": str(corpus), "seq_len": 16})
    inputs, targets, starts = task.packed_batch(4, torch.Generator().manual_seed(0))
    total, count = 0.0, 0
    with torch.no_grad():
        for r in range(4):
            edges = torch.nonzero(starts[r]).squeeze(1).tolist() + [16]
            for a, b in zip(edges, edges[1:]):
                logits = model(inputs[r : r + 1, a:b])[0]
                keep = targets[r, a:b] != IGNORE_INDEX
                total += float(F.cross_entropy(logits[keep], targets[r, a:b][keep], reduction="sum"))
                count += int(keep.sum())
    assert losses[0] == pytest.approx(total / count, rel=1e-5)


def test_pack_needs_a_task_with_documents(tmp_path, corpus):
    spec = copy.deepcopy(TINY)
    spec["train"]["pack"] = True
    with pytest.raises(SpecError, match="train.pack") as info:
        train(TrainOptions(spec=spec, out=str(tmp_path / "run"), progress=False))
    assert "no documents to pack" in str(info.value)
