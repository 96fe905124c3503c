"""``tests/plugin_pkgs/acme_nlms``, a package written from docs/plugins.md alone (its walkthrough of
a Longhorn-like rule): installed from its folder into a fresh virtual environment, it adds the gate
``mu`` and the normalised step ``acme_nlms:nlms`` (a bias whose weight reads the key), passes
``atlas check acme_nlms`` and its own tests (the kit, and a hand-written loop under every strategy
that accepts it), and a ``core:lm`` model built from a spec learns the new gate."""

import json
from pathlib import Path

import pytest

from .test_packages import REPO, _env, _install, _where, venv  # noqa: F401 - the fixture

NLMS = REPO / "tests" / "plugin_pkgs" / "acme_nlms"

SPEC = """
schema = "atlas/1"
name = "nlms"

[model]
arch = "core:lm"
vocab_size = 16
d_model = 16
depth = 1
heads = 2

[memory]
use = "acme_nlms:nlms_delta"
parallel = "auto"

[layer]
gate_bias = { mu = -1.0 }
"""

MODEL = """
import sys, torch
from atlas_core import build_model
model = build_model(sys.argv[1])
layer = [m for m in model.modules() if type(m).__name__ == "MemoryLayer"][0]
assert layer.gate_names == ("alpha", "theta", "mu"), layer.gate_names
H = layer.heads
assert torch.equal(layer.gate_proj.bias.detach()[2 * H:], torch.full((H,), -1.0)), layer.gate_proj.bias
assert layer.runner.name == "core:exact_chunk", layer.runner.name
out = model(torch.randint(0, 16, (2, 9)))
assert torch.isfinite(out).all()
print("ok")
"""


def test_the_nlms_package_passes_the_kit_and_its_tests(venv, tmp_path):  # noqa: F811
    import subprocess

    _install(venv, NLMS)
    assert _where(venv, "atlas_acme_nlms").startswith(str(venv.parent.parent)), "not the installed copy"

    def run(*args):
        return subprocess.run([str(venv), *args], capture_output=True, text=True, timeout=600,
                              cwd=tmp_path, env=_env())

    spec = tmp_path / "nlms.toml"
    spec.write_text(SPEC)
    built = run("-c", MODEL, str(spec))
    assert built.returncode == 0 and "ok" in built.stdout, built.stdout[-3000:] + built.stderr[-3000:]
    checked = run("-m", "atlas_cli", "check", "acme_nlms", "--format", "json")
    assert checked.returncode == 0, checked.stdout[-4000:] + checked.stderr[-2000:]
    results = json.loads(checked.stdout)
    rows = results["results"] if isinstance(results, dict) else results
    assert {r["status"] for r in rows} <= {"passed", "skipped"}
    passed = {(r["case"].split("(")[0], r["check"]) for r in rows if r["status"] == "passed"}
    for comp in ("acme_nlms:nlms", "acme_nlms:nlms_delta"):
        for check in ("check_strategies_match_sequential", "check_gradients_match_reference", "check_split_calls"):
            assert (comp, check) in passed, (comp, check, sorted(passed))
    # its own equation test, as its author runs it (its conformance test is the kit just run)
    own = run("-m", "pytest", str(NLMS / "tests" / "test_nlms.py"), "-q", "-p", "no:cacheprovider",
              "--rootdir", str(tmp_path))
    assert own.returncode == 0 and "1 passed" in own.stdout, own.stdout[-4000:] + own.stderr[-2000:]
