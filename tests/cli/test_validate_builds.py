"""`atlas spec validate` also runs the checks an architecture makes when it is built (a spec that
validates builds), `atlas build` handles every example, and bad specs of every plugin fail with
exit 1 and one readable message, never a traceback (in a fresh process, as a user runs it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from atlas_core.host.manager import get_host, reset_host
from atlas_core.spec import load_spec
from atlas_cli.common import set_global_format
from atlas_cli.main import make_app

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.toml"))
LM = 'vocab_size = 32\nd_model = 16\nheads = 2\n'

# file name -> (TOML text, the dotted paths its errors must name)
BAD = {
    # issue 6: a rule the architecture cannot host, window / segment < 1, too many persistent tokens
    "mal_hosts_mru.toml": (f'[model]\narch = "titans:mal"\n{LM}window = 4\npersistent_tokens = 1\n'
                           '[memory]\nuse = "mru:mru"\n', {"memory"}),
    "mac_reads_mru.toml": (f'[model]\narch = "titans:mac"\n{LM}segment_size = 4\npersistent_tokens = 1\n'
                           '[memory]\nuse = "mru:mru"\n', {"memory"}),
    "mag_window0.toml": (f'[model]\narch = "titans:mag"\n{LM}window = 0\n[memory]\nuse = "titans:titans"\n',
                         {"model.window"}),
    "mac_segment0.toml": (f'[model]\narch = "titans:mac"\n{LM}segment_size = 0\n[memory]\nuse = "titans:titans"\n',
                          {"model.segment_size"}),
    "mac_persistent.toml": (f'[model]\narch = "titans:mac"\n{LM}segment_size = 4\npersistent_tokens = 5\n'
                            '[memory]\nuse = "titans:titans"\n', {"model.persistent_tokens"}),
    # issue 5: an MRU head size that is not a perfect square; a composed rule in the MRU LM
    "mru_heads.toml": ('[model]\narch = "mru:mru_lm"\nvocab_size = 32\nd_model = 12\nheads = 2\ndepth = 1\n'
                       '[memory]\nuse = "mru:mru"\n', {"model.heads"}),
    "mru_composed.toml": ('[model]\narch = "mru:mru_lm"\nvocab_size = 32\nd_model = 16\nheads = 4\ndepth = 1\n'
                          '[memory]\nuse = "titans:titans"\n', {"memory.use"}),
    # issue 25: what the model's build refuses and what the task needs, reported in one pass
    "build_and_task.toml": ('[model]\narch = "core:lm"\nvocab_size = 16\nd_model = 30\nheads = 4\n'
                            'depth = 1\n[memory]\nstructure = "core:linear"\n[train]\n'
                            'task = { use = "mqar", num_pairs = 8, seq_len = 64 }\n',
                            {"memory", "train.task.num_pairs"}),
    # issue 2: a deep memory whose residual cannot add (d_key 8 != d_value 4)
    "deep_residual.toml": (f'[model]\narch = "titans:lmm"\n{LM}[memory]\nuse = "titans:titans_deep"\n'
                           '[layer]\nd_value = 4\n', {"memory.structure.residual"}),
    # issues 3 and 4, all in one file: every problem at once
    "omega_muon.toml": (
        f'[model]\narch = "titans:lmm"\n{LM}[memory]\n'
        'bias = { use = "omega:window", window = 0, inner = "core:l3" }\n'
        'feature_map = { use = "omega:poly", mode = "tensor", degree = 0 }\n'
        'algorithm = { use = "atlas_muon:muon", ns_steps = -1, coefficients = [1.0, nan, 2.0] }\n',
        {"memory.bias.window", "memory.bias.inner", "memory.feature_map.degree",
         "memory.feature_map.dim", "memory.algorithm.ns_steps", "memory.algorithm.coefficients"}),
}


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_specs")
    for name, (text, _) in BAD.items():
        (root / name).write_text('schema = "atlas/1"\n' + text)
    return root


@pytest.fixture
def real_host():
    """The installed plugins only (other CLI tests install a toy host). Afterwards the CLI's
    process-wide output format is reset: a later test that drives a sub-app directly (without the
    root callback that sets it) must not inherit this test's ``--format json``."""
    reset_host(None)
    yield get_host()
    reset_host(None)
    set_global_format(None)


def invoke(args):
    return CliRunner().invoke(make_app(), [str(a) for a in args])


def test_validate_reports_what_only_building_would_find(bad_dir, real_host):
    files = [bad_dir / name for name in BAD]
    result = invoke(["--format", "json", "spec", "validate", *files])
    assert result.exit_code == 1, result.output
    rows = {Path(r["file"]).name: r for r in json.loads(result.stdout)}
    for name, (_, paths) in BAD.items():
        row = rows[name]
        assert row["ok"] is False, name
        assert {e["path"] for e in row["errors"]} == paths, (name, row["errors"])
    assert "cannot host" in rows["mal_hosts_mru.toml"]["errors"][0]["message"]
    assert "perfect square" in rows["mru_heads.toml"]["errors"][0]["message"]
    assert rows["mru_heads.toml"]["errors"][0]["value"] == 2
    # the spec itself resolves: it is the build that refuses it (so `spec validate` must build)
    load_spec(bad_dir / "mal_hosts_mru.toml")


def _needs_missing_plugin(path: Path) -> str | None:
    text = path.read_text()
    missing = [ns for ns in ("miras",) if f'"{ns}:' in text and ns not in get_host().records]
    return missing[0] if missing else None


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_validates_and_builds_on_meta(path, real_host):
    if _needs_missing_plugin(path):  # an example of a separately installed package
        result = invoke(["spec", "validate", path])
        assert result.exit_code == 1 and "not installed" in result.stdout
        return
    assert invoke(["spec", "validate", path]).exit_code == 0
    result = invoke(["--format", "json", "build", path, "--device", "meta"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    spec = load_spec(path)
    blocks = [b for b in data["blocks"] if b["block"].startswith(("blocks.", "layers."))]
    assert len(blocks) == spec.model["depth"] and all(b["params"] > 0 for b in blocks)
    assert data["param_devices"] == ["meta"] and data["total_params"] > 0


def test_bad_specs_exit_1_without_traceback_in_a_fresh_process(bad_dir):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATLAS_")}
    files = [str(bad_dir / name) for name in BAD]
    proc = subprocess.run([sys.executable, "-m", "atlas_cli", "spec", "validate", *files],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stdout.count("error  ") == len(BAD)
    build = subprocess.run([sys.executable, "-m", "atlas_cli", "build", files[0], "--device", "meta"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert build.returncode == 1 and "Traceback" not in build.stderr
    assert build.stderr.splitlines()[-1].startswith("error: ") and "cannot host" in build.stderr
