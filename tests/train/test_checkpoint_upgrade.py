"""Checkpoints and exports written by an earlier version load here when every value their spec
states is kept: the fields a later version adds (with defaults that keep the earlier meaning) are
filled in, not refused; an edited stored spec is still refused."""

from __future__ import annotations

import hashlib
import json

import pytest

import atlas_core as ac
from atlas_core.spec import load_spec
from atlas_core.spec.compat import content_hash, stated_changes
from atlas_core.train.checkpoint import load_checkpoint, save_checkpoint
from atlas_core.train.checkpoint_meta import CheckpointMeta
from atlas_core.train.errors import CheckpointError

SPEC = {"schema": "atlas/1", "name": "old", "model": {"arch": "core:lm", "vocab_size": 16, "d_model": 8,
                                                      "depth": 1, "heads": 2}, "memory": {"use": "zoo:deltanet"}}


def as_earlier_version(path, drop: str, keep_stored_hash: bool = False):
    """Rewrite the checkpoint as a version without the field ``drop`` ("section.key") wrote it."""
    section, key = drop.split(".")
    spec_file = path / "spec.toml"
    lines, cur, out = spec_file.read_text().splitlines(), None, []
    for line in lines:
        if line.startswith("["):
            cur = line.strip("[]")
        if cur == section and line.split("=")[0].strip() == key:
            continue
        out.append(line)
    text = "\n".join(out) + "\n"
    spec_file.write_text(text)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["spec.toml"] = {"bytes": len(text.encode()), "sha256": hashlib.sha256(text.encode()).hexdigest()}
    manifest["spec_hash"] = "0123456789abcdef"  # what the earlier resolution hashed to
    if not keep_stored_hash:
        manifest.pop("spec_stored_hash")
    (path / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture
def ckpt(tmp_path):
    spec = load_spec(SPEC)
    return save_checkpoint(tmp_path / "run", 0, model=ac.build_model(spec), spec=spec, optimizer_state=({}, {}),
                           rng={}, meta=CheckpointMeta())


def test_a_field_added_later_takes_its_default(ckpt):
    as_earlier_version(ckpt, "layer.qk_norm_eps")
    loaded = load_checkpoint(ckpt)
    assert loaded.spec.layer["qk_norm_eps"] == 0.0 and loaded.notes and "earlier version" in loaded.notes[0]
    model = ac.load(ckpt)
    assert model.spec == loaded.spec


def test_an_edited_spec_is_refused_where_the_manifest_records_its_hash(ckpt):
    as_earlier_version(ckpt, "layer.qk_norm_eps", keep_stored_hash=True)
    with pytest.raises(CheckpointError, match="edited"):
        load_checkpoint(ckpt)


def test_stated_changes():
    assert stated_changes({"a": 1, "b": {"c": 2.0}}, {"a": 1, "b": {"c": 2, "d": 3}, "e": 4}) == []
    assert stated_changes({"a": 1, "b": {"c": 2}}, {"a": 2, "b": {}}) == ["a", "b.c"]
    assert stated_changes({"a": None}, {}) == []  # an unset field this version no longer has
    assert content_hash({"x": 1, "y": 2}) == content_hash({"y": 2, "x": 1})


def test_an_export_of_an_earlier_version_loads(tmp_path):
    from atlas_core.hf.config import AtlasConfig

    spec = load_spec(SPEC)
    stored = spec.to_dict()
    del stored["layer"]["qk_norm_eps"]  # a field the earlier version did not have
    config = AtlasConfig(atlas_spec=stored, atlas_spec_hash=content_hash(stored))
    assert config.spec() == spec
    edited = json.loads(json.dumps(stored))
    edited["model"]["d_model"] = 16
    with pytest.raises(ValueError, match="edited"):
        AtlasConfig(atlas_spec=edited, atlas_spec_hash=content_hash(stored)).spec()
