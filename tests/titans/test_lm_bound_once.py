"""Strategies and backends are bound once, when a model is built: a forward pass, a decoding step
(one token, or several continuing inside an anchor block) and ``generate`` make no registry lookup
(``Registry.get``, ``build``, ``all``, ``find``, ``names``), no ``supports()`` call on any strategy
class and no backend build or probe. Checked on small models built from the Titans LMM examples
(linear and deep memory) and the Atlas example. Also: ``core:lm`` is the generic language model
and ``titans:lmm`` is another name for it (same parameters, same logits for the same seed)."""

from __future__ import annotations

import tomllib
from collections import Counter
from pathlib import Path

import pytest
import torch

import atlas_core as ac
import atlas_core.backends as backends_mod
from atlas_core.backends import Backend
from atlas_core.host.registry import Registry
from atlas_core.lm import LanguageModel
from atlas_core.strategies.base import Strategy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
V = 32
# example -> (the strategy its memory layers run, the rule's anchor)
CASES = {
    "titans_lmm.toml": ("core:chunkwise", 64),
    "titans_deep_lmm.toml": ("core:chunkwise", 16),
    "atlas_lmm.toml": ("atlas_muon:atlas_parallel", 16),
}


def small_spec(example: str, **model) -> dict:
    raw = tomllib.loads((EXAMPLES / example).read_text())
    raw["model"].update(vocab_size=V, d_model=16, depth=2, heads=2, **model)
    raw.pop("train", None)
    return raw


def build(example: str, seed: int = 0, **model):
    torch.manual_seed(seed)
    return ac.build_model(small_spec(example, **model)).eval()


def _subclasses(cls):
    out, todo = set(), [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in out:
                out.add(sub)
                todo.append(sub)
    return out


class Lookups:
    """Counts registry lookups, ``supports()`` calls on every Strategy class, and backend
    builds and probes (``bind_backends``, ``Backend.is_available``) while installed."""

    REGISTRY = ("get", "build", "all", "find", "names")

    def __init__(self, monkeypatch):
        self.counts = Counter()
        # every strategy class that can run: the registered ones, imported by building them
        reg = ac.get_registry()
        for comp in list(reg.all("strategy")):
            reg.build("strategy", comp.name)
        for name in self.REGISTRY:
            self._wrap(monkeypatch, Registry, name, f"Registry.{name}")
        strategies = {Strategy} | _subclasses(Strategy)
        assert {"Chunkwise", "AtlasParallel", "Sequential", "ExactChunk"} <= {c.__name__ for c in strategies}
        for cls in strategies:
            if "supports" in vars(cls):
                self._wrap(monkeypatch, cls, "supports", f"{cls.__name__}.supports")
        for cls in {Backend} | _subclasses(Backend):
            if "is_available" in vars(cls):
                self._wrap(monkeypatch, cls, "is_available", f"{cls.__name__}.is_available")
        real_bind = backends_mod.bind_backends

        def bind(*a, **kw):
            self.counts["bind_backends"] += 1
            return real_bind(*a, **kw)

        monkeypatch.setattr(backends_mod, "bind_backends", bind)

    def _wrap(self, monkeypatch, cls, attr, label):
        real = vars(cls)[attr]
        counts = self.counts

        def wrapper(*a, **kw):
            counts[label] += 1
            return real(*a, **kw)

        monkeypatch.setattr(cls, attr, wrapper)

    def take(self) -> dict:
        out = dict(+self.counts)
        self.counts.clear()
        return out


@pytest.mark.parametrize("example", list(CASES))
def test_forward_and_generate_make_no_lookup(example, monkeypatch):
    strategy, anchor = CASES[example]
    model = build(example)
    layers = [b.memory for b in model.blocks]
    assert all(layer.runner.name == strategy and layer.rule.anchor == anchor for layer in layers)
    ids = torch.randint(0, V, (2, 40), generator=torch.Generator().manual_seed(1))
    counter = Lookups(monkeypatch)
    counter.take()  # setup's own builds
    with torch.no_grad():
        full = model(ids)  # whole chunks and a ragged last one
        assert counter.take() == {}
        logits, state = model.step(ids[:, :5], None)  # a prompt inside the first anchor block
        logits, state = model.step(ids[:, 5:21], state)  # continues inside the block, crosses it
        assert counter.take() == {}
        for t in range(21, 24):  # decoding steps: one token each
            step, state = model.step(ids[:, t : t + 1], state)
        assert counter.take() == {}
    out = model.generate(ids[:, :5], max_new_tokens=6, greedy=True)
    assert counter.take() == {}
    assert out.shape == (2, 11) and torch.isfinite(full).all()
    torch.testing.assert_close(logits, full[:, 5:21], rtol=1e-4, atol=1e-5)  # any split = one call
    torch.testing.assert_close(step[:, 0], full[:, 23], rtol=1e-4, atol=1e-5)
    # the counters are live: building a model looks components up and binds its strategy
    ac.build_model(small_spec(example))
    seen = counter.take()
    assert seen.get("Registry.get", 0) > 0 and seen.get("Registry.build", 0) > 0
    assert any(k.endswith(".supports") for k in seen) and seen.get("bind_backends", 0) > 0


def test_a_forward_with_a_backend_served_strategy_makes_no_lookup(monkeypatch):
    """A strategy whose backends are registered (core:chunkwise with cuda:chunk_linear, when the
    cuda plugin is installed) binds them at build time only; a forward runs the verifiers."""
    model = build("titans_lmm.toml")
    bound = model.blocks[0].memory.runner.bound_backends()
    names = {name for name, _, _ in bound.candidates}
    assert names == {c.name for c in backends_mod.backends_for("core:chunkwise")[1]}
    counter = Lookups(monkeypatch)
    counter.take()
    with torch.no_grad():
        model(torch.randint(0, V, (1, 64), generator=torch.Generator().manual_seed(2)))
    assert counter.take() == {}


def test_core_lm_builds_and_titans_lmm_is_another_name_for_it():
    reg = ac.get_registry()
    core, titans = reg.get("arch", "core:lm"), reg.get("arch", "titans:lmm")
    assert core.load_params() is titans.load_params()  # the same [model] params
    ids = torch.randint(0, V, (2, 20), generator=torch.Generator().manual_seed(3))
    models = {}
    for arch in ("core:lm", "titans:lmm"):
        torch.manual_seed(7)
        spec = small_spec("titans_lmm.toml")
        spec["model"]["arch"] = arch
        models[arch] = ac.build_model(spec).eval()
    a, b = models["core:lm"], models["titans:lmm"]
    assert isinstance(a, LanguageModel) and type(a) is type(b)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    with torch.no_grad():
        la, lb = a(ids), b(ids)
    assert la.shape == (2, 20, V) and torch.isfinite(la).all()
    assert torch.equal(la, lb)
    assert torch.equal(a.generate(ids[:, :4], 5, greedy=True), b.generate(ids[:, :4], 5, greedy=True))
    torch.manual_seed(8)  # another seed: other parameters, other logits (the comparison can fail)
    spec = small_spec("titans_lmm.toml")
    spec["model"]["arch"] = "core:lm"
    with torch.no_grad():
        assert not torch.equal(ac.build_model(spec).eval()(ids), la)
