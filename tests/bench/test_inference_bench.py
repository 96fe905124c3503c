"""``atlas bench inference`` runs end to end on the tiny configuration: each engine measured in
its own process on the same weights, atlas's float32 logits checked against transformers' before
any speed is reported, the table, the JSON and the plot."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from atlas_cli.main import make_app


def test_bench_inference_tiny(tmp_path):
    plot, out = tmp_path / "inference.png", tmp_path / "inference.json"
    result = CliRunner().invoke(make_app(), [
        "bench", "inference", "--configs", "tiny", "--dtypes", "float32,bfloat16", "--engines",
        "atlas,transformers", "--prefill", "16", "--decode", "2", "--threads", "1", "--cache",
        str(tmp_path / "cache"), "--plot", str(plot), "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["machine"]["read_gbs"] > 0
    rows = {(r["dtype"], r["engine"]): r for r in data["rows"]}
    assert set(rows) == {("float32", "atlas"), ("float32", "transformers"), ("bfloat16", "atlas"),
                         ("bfloat16", "transformers")}
    for r in rows.values():
        assert r["decode_tok_s"] > 0 and r["prefill_16_tok_s"] > 0 and r["peak_rss_gib"] > 0
        assert r["equivalent"]
    # the same weights: atlas and transformers read the same bytes per token, but for the masked
    # bias of atlas's no_bias gate rows (theta: one zero per value head and memory layer)
    a, t = rows[("float32", "atlas")], rows[("float32", "transformers")]
    assert 0 <= a["weight_bytes_per_token"] - t["weight_bytes_per_token"] == 3 * 4 * 4
    assert rows[("bfloat16", "atlas")]["weight_bytes_per_token"] * 2 == rows[("float32", "atlas")]["weight_bytes_per_token"]
    (check,) = data["equivalence"]
    assert check["ok"] and check["logits_rel_diff"] < 1e-4
    assert plot.stat().st_size > 1000


def test_rounds_take_turns_and_report_the_median(tmp_path):
    out = tmp_path / "inference.json"
    result = CliRunner().invoke(make_app(), [
        "bench", "inference", "--configs", "tiny", "--dtypes", "float32", "--engines", "atlas",
        "--prefill", "16", "--decode", "2", "--threads", "1", "--rounds", "3", "--cache",
        str(tmp_path / "cache"), "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.count("round 3 of 3") == 1
    (row,) = json.loads(out.read_text())["rows"]
    assert row["rounds"] == 3 and len(row["decode_tok_s_rounds"]) == 3
    assert row["decode_tok_s"] == sorted(row["decode_tok_s_rounds"])[1]
    assert row["prefill_16_tok_s"] == sorted(row["prefill_16_tok_s_rounds"])[1]


def test_merge_rounds():
    from atlas_core.bench.inference import merge_rounds

    runs = [{"decode_tok_s": 5.0, "prefill_8_tok_s": 9.0, "peak_rss_gib": 1.0, "load_s": 3.0},
            {"decode_tok_s": 7.0, "prefill_8_tok_s": 8.0, "peak_rss_gib": 1.5, "load_s": 2.0},
            {"decode_tok_s": 6.0, "prefill_8_tok_s": 7.0, "peak_rss_gib": 1.2, "load_s": 1.0}]
    row = merge_rounds(runs)
    assert row["decode_tok_s"] == 6.0 and row["prefill_8_tok_s"] == 8.0
    assert row["decode_tok_s_rounds"] == [5.0, 7.0, 6.0] and row["peak_rss_gib"] == 1.5 and row["load_s"] == 3.0
