"""Checkpoints: round trip without pickle, atomic writes, corrupt and foreign checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from atlas_core.train import checkpoint as ck
from atlas_core.train.checkpoint import CheckpointError, load_checkpoint
from atlas_core.train.optim import build_optimizer, load_optimizer_tensors, optimizer_tensors
from atlas_core.train.params import train_params
from atlas_core.train.setup import TrainOptions
from atlas_core.train.launch import train


@pytest.fixture
def run(tmp_path, tiny_spec):
    """A finished 6-step tiny run with checkpoints at steps 3 and 6."""
    tiny_spec["train"]["checkpoint_every"] = 3
    out = tmp_path / "run"
    train(TrainOptions(spec=tiny_spec, out=str(out), progress=False))
    return out


def _snapshot(directory):
    return {p.relative_to(directory): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def test_layout_and_manifest(run):
    ckpt = load_checkpoint(run)  # a run directory means its latest complete checkpoint
    assert ckpt.path == run / "checkpoints" / "step-000000006"
    assert ckpt.step == 6
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step-000000003", "step-000000006"]
    files = json.loads((ckpt.path / "manifest.json").read_text())["files"]
    for name, entry in files.items():
        assert (ckpt.path / name).stat().st_size == entry["bytes"]
    assert ckpt.meta.task["params"]["num_pairs"] == 2
    assert set(ckpt.rng()) == {"rng/data", "rng/torch"}
    assert ckpt.rng()["rng/data"].dtype == torch.uint8
    assert load_checkpoint(ckpt.path / "model.safetensors").path == ckpt.path


def test_loading_never_unpickles(run, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("torch.load (pickle) must not be used")

    monkeypatch.setattr(torch, "load", refuse)
    import pickle

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    ckpt = load_checkpoint(run)
    assert ckpt.model_tensors() and ckpt.optimizer_state()[0] and ckpt.rng()


def test_optimizer_state_round_trip(tiny_spec):
    from atlas_core.model import build_model

    torch.manual_seed(0)
    model = build_model(tiny_spec)
    p = train_params(tiny_spec["train"])
    opt = build_optimizer(model, p)
    model(torch.randint(0, 16, (2, 8))).sum().backward()
    opt.step()
    tensors, rest = optimizer_tensors(model, opt)
    json.dumps(rest)  # the non-tensor part is plain JSON
    assert any(k.endswith("/exp_avg_sq") for k in tensors)
    fresh = build_optimizer(model, p)
    load_optimizer_tensors(model, fresh, tensors, rest)
    a, b = opt.state_dict(), fresh.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for i in a["state"]:
        for key, value in a["state"][i].items():
            assert torch.equal(value, b["state"][i][key]), (i, key)


def test_a_crash_while_saving_keeps_the_last_checkpoint(run, tiny_spec, monkeypatch):
    """The writer dies in the middle of the next checkpoint (the tensor files written, two small
    files after them, half of the third): the latest complete one is still the step-6 checkpoint,
    it loads, and a resume from the run directory uses it."""
    before = _snapshot(run / "checkpoints" / "step-000000006")
    real = ck.write_atomic
    calls = []

    def dying(path, data):
        calls.append(path.name)
        if len(calls) == 3:
            with open(path.with_name(path.name + ".tmp-x"), "wb") as fh:
                fh.write(data[: len(data) // 2])  # half a file, then the crash
            raise OSError("disk full (simulated)")
        real(path, data)

    monkeypatch.setattr(ck, "write_atomic", dying)
    with pytest.raises(OSError, match="simulated"):
        train(TrainOptions(resume=str(run), steps=8, progress=False))
    assert calls[:2] == ["state.safetensors", "meta.json"]  # the tensor files are written before them
    monkeypatch.setattr(ck, "write_atomic", real)

    ckpt = load_checkpoint(run)
    assert ckpt.step == 6
    assert _snapshot(ckpt.path) == before
    assert not (run / "checkpoints" / "step-000000008").exists()
    result = train(TrainOptions(resume=str(run), steps=8, progress=False))
    assert result["steps"] == 8
    assert not list((run / "checkpoints").glob(".step-*"))  # the partial directory is cleaned


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "manifest"])
def test_corrupt_checkpoint_is_one_clear_error(run, damage):
    path = run / "checkpoints" / "step-000000006"
    target = path / "model.safetensors"
    data = target.read_bytes()
    if damage == "truncate":
        target.write_bytes(data[: len(data) // 2])
        pattern = "truncated or altered"
    elif damage == "flip":
        target.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
        pattern = "corrupt"
    elif damage == "delete":
        target.unlink()
        pattern = "missing"
    else:
        (path / "manifest.json").write_text("{not json")
        pattern = "unreadable manifest"
    with pytest.raises(CheckpointError, match=pattern):
        load_checkpoint(path)
    snapshot = _snapshot(run)
    with pytest.raises(CheckpointError, match=pattern):
        train(TrainOptions(resume=str(path), steps=9, progress=False))
    assert _snapshot(run) == snapshot  # nothing overwritten


def test_missing_and_empty_checkpoint_paths(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        load_checkpoint(tmp_path)
    (tmp_path / "x.bin").write_bytes(b"12")
    with pytest.raises(CheckpointError, match="is a file, not a checkpoint"):
        load_checkpoint(tmp_path / "x.bin")


def test_weights_from_another_spec_are_refused(run, tiny_spec):
    from atlas_core.model import build_model

    bigger = dict(tiny_spec, model={**tiny_spec["model"], "d_model": 32})
    with pytest.raises(CheckpointError, match=r"do not fit this model .*shape"):
        load_checkpoint(run).load_model(build_model(bigger))


def test_an_edited_spec_file_is_detected(run):
    path = run / "checkpoints" / "step-000000006"
    spec = path / "spec.toml"
    text = spec.read_text().replace("d_model = 16", "d_model = 32")
    spec.write_text(text)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["spec.toml"] = {"bytes": len(text.encode()),
                                      "sha256": __import__("hashlib").sha256(text.encode()).hexdigest()}
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="resolves to spec_hash"):
        load_checkpoint(path)


# -- recovery after a killed save (the kills themselves: test_checkpoint_kill.py) -------------------
def _names(root):
    return sorted(p.name for p in root.iterdir())


def test_recovery_adopts_a_complete_copy_and_deletes_the_rest(run, tmp_path):
    """Step 6 exists only as an ``.old`` copy (complete) and a newer ``.partial`` copy that
    is not; beside them lie a complete ``.trash`` copy of step 3, an empty ``.partial`` of step
    9 and one whose manifest is a link to a device. Reading picks the complete step-6 copy and
    changes nothing; recovery renames it to step-000000006 and deletes everything else."""
    import os
    import shutil

    root = run / "checkpoints"
    before = _snapshot(root / "step-000000006")
    old = (root / "step-000000006").rename(root / ".step-000000006.old-999999911")
    partial = root / ".step-000000006.partial-999999912"
    shutil.copytree(old, partial)
    (partial / "optimizer.safetensors").write_bytes(b"cut")
    (root / "step-000000003").rename(root / ".step-000000003.trash-999999913")
    (root / ".step-000000009.partial-999999914").mkdir()
    linked = root / ".step-000000008.partial-999999915"
    shutil.copytree(old, linked)
    (linked / "manifest.json").unlink()
    os.symlink("/dev/zero", linked / "manifest.json")
    names = _names(root)

    assert load_checkpoint(run).path == old
    assert load_checkpoint(root / "step-000000006").path == old  # the missing name resolves
    assert _names(root) == names  # reading renamed and deleted nothing
    assert ck.recover_checkpoints(root) == [root / "step-000000006"]
    assert _names(root) == ["step-000000006"]
    assert _snapshot(root / "step-000000006") == before
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(root / "step-000000003")  # a pruned checkpoint is never brought back


def test_recovery_prefers_the_newer_partial_copy(run):
    import os
    import shutil

    root = run / "checkpoints"
    old = (root / "step-000000006").rename(root / ".step-000000006.old-999999911")
    partial = root / ".step-000000006.partial-999999912"
    shutil.copytree(old, partial)
    inode = os.stat(partial).st_ino
    assert load_checkpoint(run).path == partial
    assert ck.recover_checkpoints(root) == [root / "step-000000006"]
    assert os.stat(root / "step-000000006").st_ino == inode
    assert _names(root) == ["step-000000003", "step-000000006"]


def test_a_save_never_prunes_itself(run, tiny_spec):
    """Resuming from step 3 of a run that reached step 6, with keep_checkpoints = 1: the new
    step-4 checkpoint is the one kept, not the step-6 one of the abandoned attempt."""
    tiny_spec["train"]["keep_checkpoints"] = 1
    result = train(TrainOptions(spec=tiny_spec, resume=str(run / "checkpoints" / "step-000000003"),
                                steps=4, progress=False))
    assert result["checkpoint"] == str(run / "checkpoints" / "step-000000004")
    assert _names(run / "checkpoints") == ["step-000000004"]


def test_resume_of_a_directory_without_a_run_is_refused(tmp_path):
    """Only a run directory (a metrics log and its spec.toml) stopped before its first
    checkpoint is started again by --resume; anything else is the usual error."""
    (tmp_path / "metrics.jsonl").write_text('{"kind": "run", "event": "start", "step": 0}\n')
    snapshot = _snapshot(tmp_path)
    with pytest.raises(CheckpointError, match="holds no complete checkpoint"):
        train(TrainOptions(resume=str(tmp_path), progress=False))
    assert _snapshot(tmp_path) == snapshot
