"""The certification flow on the CPU stand-in: `atlas check fla` runs the conformance kit on the
fla backends; `atlas fla certify` runs it and records the backends that passed and really served
the kit's calls; a failing check leaves a backend uncertified (and revokes an earlier
certificate); `atlas fla status` and `revoke`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("fla.ops")

from atlas_cli.main import make_app  # noqa: E402
from atlas_core.strategies.exact_chunk import ExactChunk  # noqa: E402
from atlas_plugins.fla_backend import certificates  # noqa: E402
from atlas_plugins.fla_backend.availability import device_name  # noqa: E402
from tests.fla_backend import stand_in as S  # noqa: E402

runner = CliRunner()


def atlas(*args):
    result = runner.invoke(make_app(), ["--format", "json", *args])
    return result.exit_code, result.stdout


def test_atlas_check_fla_runs_the_kit_on_the_backends(stand_in):
    code, out = atlas("check", "fla")
    data = json.loads(out)
    assert code == 0 and data["ok"], out
    ref = {r["case"]: r["status"] for r in data["results"] if r["check"] == "check_backend_matches_reference"}
    assert ref == {f"fla:{op}@{preset}": "passed" for op, preset in (
        ("delta_rule", "zoo:deltanet"), ("delta_rule", "zoo:longhorn"),
        ("gated_delta_rule", "zoo:gated_deltanet"), ("gated_delta_rule", "zoo:gated_delta_product"),
        ("kda", "zoo:kda"), ("gla", "zoo:gla"), ("simple_gla", "zoo:simple_gla"),
        ("simple_gla", "zoo:retnet"), ("simple_gla", "zoo:linear_attention"))}
    light = {r["status"] for r in data["results"] if r["check"] == "check_entry_module_light"}
    assert light == {"passed"}
    ops = {c["op"] for c in stand_in}
    assert {"chunk_gla", "chunk_simple_gla"} <= ops  # core:chunkwise handed them the kit's calls
    lengths = {c["T"] for c in stand_in}  # the kit's calls reach the backends through both strategies
    assert 70 in lengths and min(lengths) > 64  # past fla's 64-token chunk (on a GPU)
    assert certificates.load()[0] == []  # checking records nothing


def test_certify_records_the_backends_that_passed(stand_in, certs):
    code, out = atlas("fla", "certify", "fla:gla", "simple_gla")
    rows = {r["backend"]: r for r in json.loads(out)}
    assert code == 0, out
    for name in ("fla:gla", "fla:simple_gla"):
        assert rows[name]["certified"] and rows[name]["calls"] > 0 and rows[name]["device"] == device_name()
        assert certificates.find(name, device_name())[0] is not None
    code, out = atlas("fla", "status")
    status = {r["backend"]: r for r in json.loads(out)["backends"]}
    assert code == 0 and status["fla:gla"]["certified"] and status["fla:simple_gla"]["certified"]
    assert not status["fla:kda"]["certified"] and "no certificate for fla:kda" in status["fla:kda"]["reason"]
    code, out = atlas("fla", "revoke", "gla")
    assert code == 0 and json.loads(out) == [{"backend": "fla:gla", "device": device_name(), "revoked": True}]
    assert certificates.find("fla:gla", device_name())[0] is None
    assert certificates.find("fla:simple_gla", device_name())[0] is not None


def test_certify_says_which_case_it_is_on(stand_in, certs):
    """fla compiles and tunes its kernels for minutes on a GPU: one line per kit case on stderr,
    the JSON alone on stdout."""
    result = runner.invoke(make_app(), ["--format", "json", "fla", "certify", "simple_gla"])
    assert result.exit_code == 0, result.output
    assert [r["backend"] for r in json.loads(result.stdout)] == ["fla:simple_gla"]
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("certify: ")]
    assert lines == [f"certify: fla:simple_gla@{p} ..." for p in ("zoo:simple_gla", "zoo:retnet",
                                                                   "zoo:linear_attention")]


def test_a_failing_check_leaves_the_backend_uncertified(certs):
    """A stand-in that forgets the mapping's ``scale = 1`` (fla's default 1/sqrt(K)) fails the
    kit's comparison: no certificate, and the one held before is revoked."""
    def wrong_scale(q, k, v, g, scale=None, **kw):
        return S.chunk_gla(q, k, v, g, **kw)

    with S.fla_ops_on_cpu({"chunk_gla": wrong_scale}) as calls:
        certificates.record("fla:gla", device_name())
        code, out = atlas("fla", "certify", "fla:gla")
        assert calls  # it ran
    (row,) = json.loads(out)
    assert code == 1 and not row["certified"]
    assert "check_backend_matches_reference" in row["reason"] and "differs from the PyTorch code" in row["reason"]
    assert row["checks"]["fla:gla@zoo:gla"]["check_backend_matches_reference"] == "failed"
    with S.fla_ops_on_cpu():
        assert certificates.find("fla:gla", device_name())[0] is None


def test_a_backend_the_kit_never_reached_is_not_certified(stand_in, certs):
    """The delta rules' backends are checked under core:exact_chunk (what "auto" runs them with):
    certified only if that strategy really handed them the kit's calls."""
    code, out = atlas("fla", "certify", "fla:kda")
    (row,) = json.loads(out)
    assert ExactChunk.uses_backends
    assert code == 0 and row["certified"] and row["calls"] > 0


def test_certify_without_a_device(certs):
    code, out = atlas("fla", "certify", "fla:gla")
    (row,) = json.loads(out)
    assert code == 1 and row["reason"].startswith("not available here: no CUDA device")
    assert certificates.load()[0] == []


def test_unknown_backend_names_are_refused(stand_in):
    result = runner.invoke(make_app(), ["fla", "certify", "fla:glaa"])
    assert result.exit_code == 2 and "did you mean" in result.output.lower()
