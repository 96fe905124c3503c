"""``atlas import SRC OUT --set memory.use=titans:titans``: the memory rule of an imported Qwen3.5
swapped for Titans'. Every weight the new model can use is the import's (gate rows gate by gate),
only the new gate starts fresh; the swapped model trains on text with falling loss; the conformance
kit passes on the rule of the swapped layer."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import atlas_core as ac
from atlas_cli.main import make_app
from atlas_core.errors import SpecError
from atlas_core.model_import import import_checkpoint

from .models import hf_model, save


def invoke(*args):
    return CliRunner().invoke(make_app(), [str(a) for a in args])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The plain import and the swapped one, of one Qwen3.5-shaped checkpoint."""
    root = tmp_path_factory.mktemp("swap")
    src = save(hf_model("qwen3_5_text", seed=21), root / "src")
    import_checkpoint(src, root / "plain")
    result = invoke("--format", "json", "import", src, root / "titans", "--set", "memory.use=titans:titans")
    assert result.exit_code == 0, result.output
    return root, json.loads(result.output)


def test_only_the_new_gate_is_initialised(runs):
    root, summary = runs
    assert summary["preset"] == "titans:titans" and summary["overrides"] == ["memory.use=titans:titans"]
    assert summary["initialised"] == ["blocks.*.memory.gate_proj.bias[eta] (3 blocks)",
                                      "blocks.*.memory.gate_proj.weight[eta] (3 blocks)"]
    assert summary["dropped"] == []
    plain, titans = ac.load(root / "plain"), ac.load(root / "titans")
    assert titans.spec.memory["use"] == "titans:titans" and titans.spec.model["layers"] == plain.spec.model["layers"]
    a, b = plain.state_dict(), titans.state_dict()
    for key in b:
        if key.endswith("gate_proj.weight") or key.endswith("gate_proj.bias"):
            continue
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=0, msg=key)
    # gate rows by name: Gated DeltaNet's alpha, theta; Titans' alpha, eta, theta
    old, new = plain.blocks[0].memory, titans.blocks[0].memory
    assert old.gate_names == ("alpha", "theta") and new.gate_names == ("alpha", "eta", "theta")
    Hv = new.gate_sizes[0]
    w_old, w_new = old.gate_proj.weight, new.gate_proj.weight
    torch.testing.assert_close(w_new[:Hv], w_old[:Hv], rtol=0, atol=0)  # alpha
    torch.testing.assert_close(w_new[2 * Hv:], w_old[Hv:], rtol=0, atol=0)  # theta
    assert not torch.equal(w_new[Hv : 2 * Hv], torch.zeros_like(w_new[Hv : 2 * Hv]))  # eta: its init
    torch.testing.assert_close(new.gate_proj.bias[Hv : 2 * Hv], torch.full((Hv,), 2.0))  # eta's declared bias


def test_swapped_model_trains_on_text(runs):
    root, _ = runs
    out = root / "trained"
    result = invoke("train", "--resume", root / "titans", "--out", out, "--steps", "100", "--batch-size", "8",
                    'train.task={use = "text", path = "examples/text_char.txt", mode = "char", seq_len = 64}',
                    "train.eval_every=100", "train.eval_batches=2", "--device", "cpu")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if r.get("kind", "train") == "train" and "loss" in r]
    assert len(losses) >= 10
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.8 * first, (first, last)
    assert ac.load(out).spec.memory["use"] == "titans:titans"


def test_conformance_kit_passes_on_the_swapped_rule(runs):
    from atlas_core.testing import Case, check_component

    root, _ = runs
    model = ac.load(root / "titans")
    layer = model.blocks[0].memory
    sizes = {"H": model.spec.layer["value_heads"], "Dk": layer.d_rule_key, "Dv": layer.d_value}
    results = check_component(Case("titans:titans", sizes=sizes), on_fail="collect")
    failed = [r for r in results if r.status == "failed"]
    assert results and not failed, [(r.name, r.message) for r in failed]
    assert sum(r.status == "passed" for r in results) >= 10


def test_a_bad_override_is_named_and_writes_nothing(tmp_path):
    src = save(hf_model("qwen3_5_text", seed=22), tmp_path / "src")
    with pytest.raises(SpecError, match="memory.use=titans:nope"):
        import_checkpoint(src, tmp_path / "out", overrides=["memory.use=titans:nope"])
    assert not (tmp_path / "out").exists()
