"""`CheckpointMeta`: the ``meta.json`` each writer wrote before it was a record is the bytes the
record writes now, reads back field by field, and a forged field is one `CheckpointError`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atlas_core.train.checkpoint_meta import CheckpointMeta
from atlas_core.train.errors import CheckpointError

SOURCE = Path("run/checkpoints/step-000000002/meta.json")
TASK = {"use": "core:text", "params": {"mode": "char", "path": "a.txt"}, "vocab_size": 4,
        "seq_len": 8, "files": {"path": {"path": "a.txt", "bytes": 3, "sha256": "0" * 64}},
        "text": {"mode": "char", "vocab": list("abcd")}}
OPTIMIZER = {"param_groups": [{"lr": 0.001, "betas": [0.9, 0.999]}]}


def _as_dict_writer(meta: dict, optimizer: dict) -> bytes:
    """What `save_checkpoint` wrote when meta was a plain dict."""
    return json.dumps({**meta, "optimizer": optimizer}, indent=1, default=float).encode()


def test_a_training_checkpoint_writes_the_same_bytes_as_before():
    record = CheckpointMeta(step=2, tokens_seen=256, elapsed_s=1.5, world_size=2, task=TASK,
                            last_eval={"step": 2, "loss": 1.25, "accuracy": 0.5},
                            optimizer=OPTIMIZER)
    old = _as_dict_writer({"step": 2, "tokens_seen": 256, "elapsed_s": 1.5, "world_size": 2,
                           "task": TASK, "last_eval": {"step": 2, "loss": 1.25, "accuracy": 0.5}},
                          OPTIMIZER)
    assert record.to_json() == old
    back = CheckpointMeta.from_json(old, SOURCE)
    assert back == record and back.source == SOURCE
    assert back.recorded_files() == TASK["files"]
    assert back.codec().vocab == tuple("abcd")


def test_a_checkpoint_before_any_evaluation_writes_a_null_last_eval():
    record = CheckpointMeta(step=0, task={"use": "mqar", "params": {}})
    assert json.loads(record.to_json())["last_eval"] is None
    assert record.to_json() == _as_dict_writer(
        {"step": 0, "tokens_seen": 0, "elapsed_s": 0.0, "world_size": 1,
         "task": {"use": "mqar", "params": {}}, "last_eval": None}, {})


@pytest.mark.parametrize("meta", [
    {"imported": {"format": "hf", "from": "src", "notes": []}, "task": TASK},  # atlas import
    {"made_by": "atlas bench inference: random weights, seed 0"},  # the benchmark's fixture
    {},
])
def test_other_writers_keep_their_keys_and_write_no_training_fields(meta):
    extra = {k: v for k, v in meta.items() if k != "task"}
    record = CheckpointMeta(task=meta.get("task"), extra=extra)
    assert record.to_json() == _as_dict_writer(meta, {})
    back = CheckpointMeta.from_json(record.to_json(), SOURCE)
    assert back.step is None and back.extra == extra and back.task == meta.get("task")
    assert back.trained_task() == meta.get("task", {})


@pytest.mark.parametrize("raw, problem", [
    (b"[1, 2]", "not a JSON object (list)"),
    (b"{", "not JSON"),
    (b'{"tokens_seen": "many"}', "'tokens_seen' is 'many', not a number"),
    (b'{"elapsed_s": true}', "'elapsed_s' is True, not a number"),
    (b'{"tokens_seen": 1.5}', "'tokens_seen' is 1.5, not a number"),
    (b'{"last_eval": [1]}', "'last_eval' is not a table"),
    (b'{"optimizer": "adam"}', "'optimizer' is not a table"),
    (b'{"task": [1, 2]}', "'task' is not a table with a task name 'use' and a 'params' table"),
    (b'{"task": {"use": "mqar", "params": 3}}', "'task' is not a table"),
])
def test_a_forged_field_is_one_checkpoint_error_naming_the_file(raw, problem):
    with pytest.raises(CheckpointError) as info:
        CheckpointMeta.from_json(raw, SOURCE)
    message = str(info.value)
    assert message.startswith(f"{SOURCE}: {problem}") and "\n" not in message


def test_a_malformed_text_record_is_a_checkpoint_error_when_the_codec_is_asked_for():
    meta = CheckpointMeta.from_json(json.dumps({"task": {"use": "text", "params": {},
                                                         "text": {"mode": "klingon"}}}).encode(),
                                    SOURCE)
    with pytest.raises(CheckpointError, match=f"^{SOURCE}: task.text must be"):
        meta.codec()
