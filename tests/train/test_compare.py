"""The comparison table's columns: rule labels and state sizes."""

from __future__ import annotations

import copy

import pytest

from atlas_core.model import build_model
from atlas_core.spec import load_spec
from atlas_core.train.compare import markdown_table, rule_label, state_sizes

from .conftest import TINY


@pytest.mark.parametrize(
    "knobs, label",
    [
        ({}, "l2+gd"),
        ({"bias": "core:dot"}, "dot+gd"),
        ({"retention": "core:decay", "algorithm": "core:momentum"}, "l2+momentum+decay"),
    ],
    ids=["delta", "hebbian", "titans"],
)
def test_rule_label(knobs, label):
    data = copy.deepcopy(TINY)
    data["memory"].update(knobs)
    assert rule_label(load_spec(data).memory) == label


def test_state_sizes_count_memory_and_momentum():
    data = copy.deepcopy(TINY)
    data["layer"].update(d_key=8, d_value=4)
    # the per-token rules (anchor = 1), run exactly in chunks of 8 (core:exact_chunk)
    data["memory"].update(anchor=1, parallel={"use": "core:exact_chunk", "chunk_size": 8})
    delta = state_sizes(build_model(data))
    assert delta == {"memory_layers": 1, "memory": 2 * 4 * 8, "state": 2 * 4 * 8}
    data["memory"].update(retention="core:decay", algorithm="core:momentum")
    data["model"]["depth"] = 2
    titans = state_sizes(build_model(data))
    # momentum Z has the shape of M: twice the state for the same memory
    assert titans == {"memory_layers": 2, "memory": 2 * 4 * 8, "state": 2 * 2 * 4 * 8}
    # an anchored rule also carries its block's anchor memory (the shape of M) and the position
    data["memory"].update(anchor=8, parallel={"use": "core:chunkwise", "chunk_size": 8})
    anchored = state_sizes(build_model(data))
    assert anchored == {"memory_layers": 2, "memory": 2 * 4 * 8, "state": 3 * 2 * 4 * 8 + 1}


def test_markdown_table_rows():
    row = {"name": "a", "rule": "l2+gd", "memory": 2048, "state": 4096, "params": 1234,
           "accuracy": 0.5, "eval_loss": 1.25, "time_s": 3.4}
    table = markdown_table([row])
    assert table.splitlines()[-1] == "| a | l2+gd | 2,048 | 4,096 | 1,234 | 0.500 | 1.250 | 3 |"


def test_scratch_runs_are_not_named_by_paths_that_are_removed(tmp_path, capfd):
    """Without ``out`` the runs live in a temporary folder removed after the table: the training
    lines call it <scratch>; with ``out`` they name the kept runs."""
    from atlas_core.train.compare import SCRATCH, compare

    spec = copy.deepcopy(TINY)
    rows = compare([spec], steps=2)
    err = capfd.readouterr().err
    assert f"train: run {SCRATCH}/01-{spec['name']}," in err, err
    assert f"checkpoint {SCRATCH}/01-" in err and "atlas-compare-" not in err, err
    assert rows[0]["run_dir"] is None and rows[0]["steps"] == 2
    kept = compare([spec], steps=2, out=tmp_path / "runs")
    err = capfd.readouterr().err
    assert f"train: run {tmp_path / 'runs'}/01-" in err and SCRATCH not in err
    assert (tmp_path / "runs" / f"01-{spec['name']}" / "spec.toml").is_file()
    assert kept[0]["run_dir"] == str(tmp_path / "runs" / f"01-{spec['name']}")
