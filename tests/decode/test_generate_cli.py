"""``atlas generate``: several prompts as one batch (each as alone), the weights' dtype, the text
streamed to stdout as it is decoded and the rate on stderr."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from atlas_cli.main import make_app


def invoke(*args):
    return CliRunner().invoke(make_app(), [str(a) for a in args])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gen") / "text-char"
    r = invoke("train", "examples/text_char.toml", "--steps", "2", "--out", out, "--device", "cpu")
    assert r.exit_code == 0, r.output
    return out


def test_a_batch_of_prompts_decodes_each_as_alone(run):
    base = ["generate", run, "--greedy", "--max-new-tokens", "6", "--device", "cpu", "--format", "json"]
    both = invoke(*base, "--prompt", "The memory", "--prompt", "A")
    assert both.exit_code == 0, both.output
    rows = json.loads(both.stdout)["rows"]
    for text, row in zip(["The memory", "A"], rows):
        alone = json.loads(invoke(*base, "--prompt", text).stdout)
        assert row["ids"] == alone["ids"] and row["prompt"] == text and len(row["ids"]) == 6


def test_bfloat16_weights(run):
    r = invoke("generate", run, "--prompt-ids", "3 5 7", "--greedy", "--max-new-tokens", "4", "--dtype",
               "bfloat16", "--device", "cpu", "--format", "json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["dtype"] == "bfloat16" and len(data["ids"]) == 4
    bad = invoke("generate", run, "--prompt-ids", "3", "--dtype", "int8")
    assert bad.exit_code == 2 and "--dtype" in bad.output


def test_text_streams_and_the_rate_goes_to_stderr(run):
    r = invoke("generate", run, "--prompt", "The memory", "--greedy", "--max-new-tokens", "8", "--device", "cpu")
    assert r.exit_code == 0, r.output
    want = json.loads(invoke("generate", run, "--prompt", "The memory", "--greedy", "--max-new-tokens", "8",
                             "--device", "cpu", "--format", "json").stdout)
    assert r.stdout == "The memory" + want["text"] + "\n"
    assert "tokens/s after the first" in r.stderr
