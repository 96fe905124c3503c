"""`atlas bench` and benchmarks/bench_strategies.py on tiny sizes: table, JSON, PNG."""

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from atlas_cli.main import make_app

TINY = ["--rules", "delta,titans", "--lengths", "16,32", "--batch", "1", "--heads", "1", "--dim",
        "4", "--chunk", "8", "--exact-chunks", "8", "--repeats", "1", "--threads", "1"]
ROOT = Path(__file__).resolve().parents[2]


def test_bench_command_json_and_png(tmp_path):
    png, js = tmp_path / "b.png", tmp_path / "b.json"
    res = CliRunner().invoke(make_app(), ["--format", "json", "bench", *TINY, "--plot", str(png),
                                          "--json", str(js)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert json.loads(js.read_text())["rows"] == data["rows"]
    subjects = {(r["case"], r["subject"]) for r in data["rows"]}
    assert ("delta", "core:exact_chunk(C=8)") in subjects
    assert ("titans", "core:exact_chunk(C=8)") in subjects  # the exact momentum rule
    # core:chunkwise refuses the per-token rule at C = 8: it runs the rule with anchor = 8
    assert ("titans", "core:chunkwise(C=8) on anchor=8") in subjects
    assert ("titans", "core:chunkwise(C=8)") not in subjects
    assert ("titans", "seed000 (materialises [BH,T,d,d])") in subjects
    ok = [r for r in data["rows"] if r["status"] == "ok"]
    assert len(ok) == len(data["rows"])
    assert all(r["fwd_ms"] > 0 and r["train_ms"] > 0 and r["peak_train_mib"] > 0 for r in ok)
    assert all(r["speedup"] is not None for r in ok if r["check"] == "passed")
    checks = {c["subject"]: c for c in data["checks"]}
    assert checks["core:chunkwise(C=8) on anchor=8"]["detail"].startswith(
        "equals core:sequential on the rule with anchor = 8")
    # fla-core's chunked gated delta rule, when installed, is another transition: external
    assert all(c["status"] in ("passed", "reference") or c["subject"].startswith("fla ")
               for c in data["checks"])
    assert [t["ok"] for t in data["targets"]] == [None] * 6  # none of the target sizes was run
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_command_human_table():
    res = CliRunner().invoke(make_app(), ["bench", "--rules", "delta", *TINY[2:], "--no-memory",
                                          "--no-baselines"])
    assert res.exit_code == 0, res.output
    assert "core:exact_chunk(C=8)" in res.stdout and "fwd+bwd ms" in res.stdout
    # none of the targets' sizes ran: no "n/a" rows, one line that says so
    assert "targets:" not in res.stdout and "n/a" not in res.stdout
    assert "6 of 6 targets not evaluated" in res.stdout


def test_decode_case_times_model_steps_at_two_chunk_sizes():
    res = CliRunner().invoke(make_app(), ["--format", "json", "bench", "--rules", "decode", "--lengths", "8",
                                          "--batch", "1", "--heads", "1", "--dim", "4", "--decode-chunks",
                                          "16,1024", "--decode-tokens", "2", "--repeats", "1", "--threads", "1"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    rows = {r["subject"]: r for r in data["rows"]}
    assert set(rows) == {"model.step, core:chunkwise(C=16)", "model.step, core:chunkwise(C=1024)"}
    assert all(r["fwd_ms"] > 0 and r["train_ms"] is None and "ms per one-token model.step" in r["note"]
               for r in rows.values())
    assert [c["status"] for c in data["checks"]] == ["passed", "passed"]
    assert data["checks"][0]["detail"].startswith("decoded logits equal the model under core:sequential")
    decode = [t for t in data["targets"] if t["target"].startswith("decode")]
    assert len(decode) == 1 and decode[0]["ok"] is not None and "T=8: " in decode[0]["measured"]


def test_bench_command_bad_lengths():
    res = CliRunner().invoke(make_app(), ["bench", "--lengths", "0,16"])
    assert res.exit_code == 2


def test_script_writes_markdown(tmp_path):
    md = tmp_path / "t.md"
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_strategies.py"), "--rules", "delta",
         *TINY[2:], "--no-memory", "--no-baselines", "--markdown", str(md)],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "core:exact_chunk(C=8)" in out.stdout
    text = md.read_text()
    assert text.startswith("| rule | subject | T |") and "core:chunkwise(C=8) on anchor=8" in text
