"""`atlas train` resolves its spec once and builds each model's strategy once: the trainer and
the memory layers receive resolved values (counted by wrapping the functions that do the work)."""

from __future__ import annotations

import collections
import copy
import json

import pytest
from typer.testing import CliRunner

import atlas_core.spec.resolve as resolve_mod
from atlas_core.host.manager import get_registry
from atlas_core.model import build_model
from atlas_core.spec import Spec, dump_toml, load_spec
from atlas_core.strategies.base import Strategy
from atlas_cli.main import make_app

from .conftest import TINY


@pytest.fixture
def resolutions(monkeypatch):
    """Every `resolve_spec` call that resolves (a `Spec` passed in is returned as it is)."""
    calls = []
    real = resolve_mod.resolve_spec

    def counting(data, **kw):
        if not isinstance(data, Spec):
            calls.append(data)
        return real(data, **kw)

    monkeypatch.setattr(resolve_mod, "resolve_spec", counting)
    return calls


@pytest.fixture
def supports_calls(monkeypatch):
    """``(strategy class, rule id) -> number of supports() calls`` for every registered strategy
    (a call counts once, where the strategy's own class defines it, whatever ``super()`` does)."""
    counts: collections.Counter = collections.Counter()
    reg = get_registry()
    classes = {type(reg.build("strategy", comp.name)) for comp in reg.all("strategy")}
    for cls in {c for k in classes for c in k.__mro__ if "supports" in c.__dict__}:
        real = cls.__dict__["supports"]

        def counting(self, rule, *a, _real=real, _cls=cls, **k):
            outermost = next(c for c in type(self).__mro__ if "supports" in c.__dict__)
            if outermost is _cls:
                counts[(type(self).__name__, id(rule))] += 1
            return _real(self, rule, *a, **k)

        monkeypatch.setattr(cls, "supports", counting)
    return counts


@pytest.mark.parametrize("extra", [[], ["--steps", "2"], ["model.d_model=16", "train.lr=1e-3"]])
def test_atlas_train_resolves_its_spec_once(tmp_path, resolutions, extra):
    spec = tmp_path / "spec.toml"
    spec.write_text(dump_toml(TINY))
    r = CliRunner().invoke(make_app(plugin_apps=False),
                           ["--format", "json", "train", str(spec), *extra, "--steps", "2",
                            "--out", str(tmp_path / "run"), "--no-progress"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["steps"] == 2
    assert len(resolutions) == 1


@pytest.fixture
def checkpoint_reads(monkeypatch):
    """Every read of a checkpoint: its verified opening (`checked_load_checkpoint`'s checks) and
    the parse of its ``meta.json`` (`load_checkpoint` does it once per opening)."""
    from atlas_core.train import checkpoint_preflight
    from atlas_core.train.checkpoint_meta import CheckpointMeta

    calls = []
    real_check = checkpoint_preflight.check_checkpoint_files
    real_meta = CheckpointMeta.from_json.__func__

    def check(path):
        calls.append(("open", str(path)))
        return real_check(path)

    def meta(cls, data, source):
        calls.append(("meta", str(source)))
        return real_meta(cls, data, source)

    monkeypatch.setattr(checkpoint_preflight, "check_checkpoint_files", check)
    monkeypatch.setattr(CheckpointMeta, "from_json", classmethod(meta))
    return calls


def _trained_run(tmp_path, steps: int = 2):
    spec = tmp_path / "spec.toml"
    spec.write_text(dump_toml(TINY))
    args = ["train", str(spec), "--steps", str(steps), "--out", str(tmp_path / "run"),
            "--no-progress"]
    assert CliRunner().invoke(make_app(plugin_apps=False), args,
                              catch_exceptions=False).exit_code == 0
    return tmp_path / "run"


@pytest.mark.parametrize("extra, resolved", [
    ([], 1),  # --steps alone: [train] is validated again, the other tables are the checkpoint's
    (["train.lr=1e-3"], 1),
    (["name=renamed"], 2),  # an override outside [train]: the overridden spec is a new one
])
def test_a_resume_reads_the_checkpoint_and_resolves_its_spec_once(tmp_path, resolutions,
                                                                  checkpoint_reads, extra, resolved):
    """``atlas train --resume RUN --steps 3``: the run directory is read once (`launch.prepare`),
    the checkpoint opened once and its stored spec resolved once, by the API's override and the
    plan alike."""
    run = _trained_run(tmp_path)
    resolutions.clear()
    checkpoint_reads.clear()
    r = CliRunner().invoke(make_app(plugin_apps=False),
                           ["--format", "json", "train", "--resume", str(run), *extra,
                            "--steps", "3", "--no-progress"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["steps"] == 3
    assert [kind for kind, _ in checkpoint_reads] == ["open", "meta"]
    assert len(resolutions) == resolved


def test_a_resume_without_overrides_reads_the_checkpoint_once(tmp_path, resolutions,
                                                             checkpoint_reads):
    import atlas_core

    run = _trained_run(tmp_path)
    resolutions.clear()
    checkpoint_reads.clear()
    done = atlas_core.train(resume=run)  # the run is complete: nothing to train
    assert done.result["complete"] is True
    assert [kind for kind, _ in checkpoint_reads] == ["open", "meta"]
    assert len(resolutions) == 1


def test_restarting_an_unsaved_run_resolves_its_spec_once(tmp_path, resolutions,
                                                          checkpoint_reads):
    """A run stopped before its first checkpoint (a metrics log without its end marker): the
    resume resolves the run's spec.toml once, and there is no checkpoint to read."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "spec.toml").write_text(dump_toml(TINY))
    (run / "metrics.jsonl").write_text('{"kind": "run", "event": "start"}\n')
    r = CliRunner().invoke(make_app(plugin_apps=False),
                           ["--format", "json", "train", "--resume", str(run), "--steps", "1",
                            "--no-progress"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "starting it again from step 0" in r.stderr
    assert json.loads(r.stdout)["steps"] == 1
    assert checkpoint_reads == []
    assert len(resolutions) == 1


def test_a_spec_object_is_trained_as_it_is(tmp_path, resolutions):
    import atlas_core

    spec = load_spec(copy.deepcopy(TINY))
    resolutions.clear()
    atlas_core.train(spec, out=tmp_path / "run", steps=1)
    assert len(resolutions) == 1  # the override (steps) applied to the resolved tables, once
    resolutions.clear()
    atlas_core.train(spec, out=tmp_path / "run2")
    assert resolutions == []  # no override: the Spec is used as it is


def test_the_model_reuses_the_strategy_its_spec_resolved(monkeypatch, supports_calls):
    data = copy.deepcopy(TINY)
    data["model"]["depth"] = 3
    spec = load_spec(data)
    supports_calls.clear()
    reg = get_registry()
    builds = []
    real_build = type(reg).build

    def build(self, kind, value, *a, **k):
        out = real_build(self, kind, value, *a, **k)
        if kind == "strategy":
            builds.append(value)
        return out

    monkeypatch.setattr(type(reg), "build", build)
    model = build_model(spec)
    layers = [b.memory for b in model.blocks]
    assert len(layers) == 3
    # one strategy object (built, validated and checked once, when the spec was resolved) shared
    # by the layers: the build builds none and checks none (tests/spec/test_build_once.py)
    assert builds == [] and len({id(m.runner) for m in layers}) == 1
    assert isinstance(layers[0].runner, Strategy) and layers[0].runner is spec.memory_plan.strategy
    assert not supports_calls
