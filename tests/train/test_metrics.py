"""The metrics log and the curve."""

from __future__ import annotations

import builtins
import json

from atlas_core.train.metrics import MetricsLog, plot_curves, read_metrics

RECORDS = [
    {"kind": "train", "step": 1, "loss": 2.0},
    {"kind": "train", "step": 2, "loss": 1.5},
    {"kind": "eval", "step": 2, "loss": 1.6, "accuracy": 0.25},
    {"kind": "train", "step": 3, "loss": 1.2},
]


def test_truncate_after_keeps_earlier_steps(tmp_path):
    log = MetricsLog(tmp_path / "m.jsonl")
    for r in RECORDS:
        log.write(r)
    log.truncate_after(2)
    assert read_metrics(tmp_path / "m.jsonl") == RECORDS[:3]
    off = MetricsLog(tmp_path / "other.jsonl", enabled=False)  # a non-zero rank writes nothing
    off.write(RECORDS[0])
    assert not (tmp_path / "other.jsonl").exists()


def test_a_torn_last_line_is_skipped(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(RECORDS[0]) + "\n" + '{"kind": "tra')
    assert read_metrics(path) == RECORDS[:1]


def test_curve_is_written(tmp_path):
    assert plot_curves(RECORDS, tmp_path / "c.png", "t") is None
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_the_plot_is_skipped_with_a_reason(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    why = plot_curves(RECORDS, tmp_path / "c.png")
    assert why is not None and "matplotlib is not installed" in why and "\n" not in why
    assert not (tmp_path / "c.png").exists()
