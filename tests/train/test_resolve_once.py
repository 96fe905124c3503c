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


def test_a_resume_resolves_the_checkpoints_spec_once(tmp_path, resolutions):
    """Resuming with --steps: the checkpoint's spec is resolved once (to verify it; the second
    read of the checkpoint, for the weights, reuses it) and the override applied to it once."""
    spec = tmp_path / "spec.toml"
    spec.write_text(dump_toml(TINY))
    app = make_app(plugin_apps=False)
    args = ["train", str(spec), "--steps", "2", "--out", str(tmp_path / "run"), "--no-progress"]
    assert CliRunner().invoke(app, args, catch_exceptions=False).exit_code == 0
    resolutions.clear()
    r = CliRunner().invoke(app, ["--format", "json", "train", "--resume", str(tmp_path / "run"),
                                 "--steps", "3", "--no-progress"], catch_exceptions=False)
    assert r.exit_code == 0 and json.loads(r.stdout)["steps"] == 3
    assert len(resolutions) == 2


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
