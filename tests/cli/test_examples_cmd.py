"""`atlas examples list|copy`: the example specs that ship with the package."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from atlas_cli.main import make_app
from atlas_core.example_specs import examples_dir, list_examples

runner = CliRunner()
REPO_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def invoke(args):
    return runner.invoke(make_app(plugin_apps=False), args, catch_exceptions=False)


def test_every_repository_example_is_listed_with_its_summary():
    names = {r["name"] for r in list_examples()}
    assert names == {p.stem for p in REPO_EXAMPLES.glob("*.toml")}
    r = invoke(["--format", "json", "examples", "list"])
    assert r.exit_code == 0, r.output
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert rows["titans_lmm"]["summary"] and "MFLOP" in rows["titans_lmm"]["cost"]
    assert (examples_dir() / "titans_lmm.toml").is_file()


def test_summaries_and_costs_are_whole():
    """The summary is the header's whole first paragraph (not its first line, cut mid-sentence),
    the cost its whole Cost paragraph (FLOPs, parameters and the measured time), in the table
    and in the JSON."""
    rows = {r["name"]: r for r in list_examples()}
    mac = rows["titans_mac"]
    assert mac["summary"].startswith("Titans MAC, memory as context")
    assert mac["summary"].endswith("Decoding buffers the current segment.")
    assert mac["cost"].startswith("5.1 MFLOP per token") or "MFLOP per token" in mac["cost"]
    assert "tokens/s training" in mac["cost"] and mac["cost"].endswith("there.")
    assert "measured and rewritten by" not in mac["cost"]
    for row in rows.values():
        assert row["summary"] and "\n" not in row["summary"], row["name"]
        assert row["cost"].endswith("there."), (row["name"], row["cost"])
    r = runner.invoke(make_app(plugin_apps=False), ["examples", "list"], terminal_width=200,
                      catch_exceptions=False)
    text = " ".join(r.stdout.replace("│", " ").split())  # the table's cells, wrapped lines joined
    assert "the current segment." in text and "take about" in text


def test_copy_writes_the_named_specs_and_refuses_to_overwrite(tmp_path):
    r = invoke(["examples", "copy", str(tmp_path), "--name", "titans_lmm", "--name", "zoo_gla"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["titans_lmm.toml", "zoo_gla.toml"]
    assert (tmp_path / "zoo_gla.toml").read_bytes() == (REPO_EXAMPLES / "zoo_gla.toml").read_bytes()
    again = invoke(["--format", "json", "examples", "copy", str(tmp_path), "--name", "zoo_gla"])
    assert again.exit_code == 1 and "--force" in json.loads(again.stdout)["error"]["message"]
    assert invoke(["examples", "copy", str(tmp_path), "--name", "zoo_gla", "--force"]).exit_code == 0
    # an example that reads a file comes with it (the text_char corpus, also from a wheel)
    r = invoke(["examples", "copy", str(tmp_path / "text"), "--name", "text_char"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "text").iterdir()) == ["text_char.toml", "text_char.txt"]
    assert 'path = "examples/text_char.txt"' in (tmp_path / "text" / "text_char.toml").read_text()
    bad = invoke(["examples", "copy", str(tmp_path), "--name", "titan_lmm"])
    assert bad.exit_code == 2 and "did you mean 'titans_lmm'" in bad.output


def _table_rows(text: str) -> dict[str, list[str]]:
    """The cells of the printed table, each wrapped cell's lines joined: ``{name: [summary,
    cost]}``."""
    rows: dict[str, list[list[str]]] = {}
    name = None
    for line in text.splitlines():
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip("│").split("│")]
        if cells[0]:
            name = cells[0]
            rows[name] = [[], []]
        for part, cell in zip(rows[name], cells[1:]):
            if cell:
                part.append(cell)
    return {n: [" ".join(p) for p in parts] for n, parts in rows.items()}


def test_the_table_prints_every_summary_whole():
    """Summaries are plain text, not rich markup: "[persistent | retrieved | segment]" and
    "[B, H, Dv, Dk]" are printed, and nothing is cut (at a colon or elsewhere): each cell of the
    table, its wrapped lines joined, is the summary and the cost."""
    rows = list_examples()
    assert any("[" in r["summary"] for r in rows)  # the case this guards
    r = invoke(["examples", "list"])
    assert r.exit_code == 0, r.output
    table = _table_rows(r.stdout)
    assert sorted(table) == sorted(row["name"] for row in rows)
    for row in rows:
        summary, cost = table[row["name"]]
        assert " ".join(summary.split()) == " ".join(row["summary"].split()), row["name"]
        assert " ".join(cost.split()) == " ".join(row["cost"].split()), row["name"]
    assert "attend over [persistent | retrieved | segment], store" in table["titans_mac"][0]
