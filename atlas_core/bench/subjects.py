"""What the benchmark runs: a `Subject` is one way of computing a case (a strategy, a layer, a
baseline), with its own float64 equivalence check.

- `StrategySubject`: ``rule(q, k, v, gates, strategy=...)`` for one registered strategy;
- `LayerSubject`: the project's `MemoryLayer` around the case's rule (``x: [B, T, d_model]``);
- baselines (``benchmarks/baselines/``) subclass `Subject` and are loaded by `load_baselines`.

The equivalence gate (`check_against_rule`): before any timing, the subject runs a small float64
problem and its output and final state are compared with the rule's readable loop — with
``core:sequential`` (an *exact* strategy) or with ``rule.reference(inputs, anchor_every=C)``, the
loop whose gradients are taken at the start of each block of C tokens (a *chunk-anchored* strategy;
its chunk size 1 must then equal ``core:sequential`` too). A subject that matches neither is marked
FAILED, and the benchmark reports no speedup for it.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from .cases import Case, Inputs, make_inputs

CHECK_TOL = 1e-8  # float64: max |diff| <= CHECK_TOL * (1 + max |reference|)
CHECK_SIZES = dict(B=1, H=2, Dk=8, Dv=8)


@dataclass
class Check:
    status: str  # "passed" | "FAILED" | "reference" | "external" | "error"
    detail: str = ""
    max_err: float | None = None

    @property
    def ok(self) -> bool:
        return self.status in ("passed", "reference")

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "detail": self.detail, "max_err": self.max_err}


class Subject:
    """Base class: one way to compute a case. Subclasses set ``name`` and implement the rest."""

    name: str = "?"
    group: str = "strategy"  # "strategy" | "layer" | "baseline"
    #: the strategy's chunk size (None: not chunked)
    chunk_size: int | None = None

    def supports(self, case: Case) -> tuple[bool, str]:
        return True, ""

    def setup(self, case: Case, sizes: dict[str, int], dtype: torch.dtype) -> Any:
        """Build what the forward needs (a rule, a module) for these sizes; called once per case."""
        return case.rule(sizes["H"], sizes["Dk"], sizes["Dv"], dtype)

    def forward(self, ctx: Any, inp: Inputs) -> torch.Tensor:
        raise NotImplementedError

    def parameters(self, ctx: Any) -> list[torch.Tensor]:
        return list(ctx.parameters()) if isinstance(ctx, torch.nn.Module) else []

    def check(self, case: Case) -> Check:
        return Check("external", "no equivalence check defined")

    def memory_estimate(self, case: Case, sizes: dict[str, int], T: int, train: bool = True) -> int | None:
        """Bytes a fwd + bwd (``train``) or a forward is expected to need, when the subject knows
        (used only to skip runs that cannot fit; never reported as a measurement)."""
        return None


class AnchoredReference:
    """A strategy object running the rule's readable loop with gradients anchored every C tokens
    (``rule.reference(inputs, anchor_every=C)``): the oracle of chunk-anchored strategies."""

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size
        self.name = f"reference(anchor_every={chunk_size})"

    def supports(self, rule) -> tuple[bool, str]:
        return (True, "") if hasattr(rule, "reference") else (False, "no reference loop")

    def run(self, rule, inputs):
        return rule.reference(inputs, anchor_every=self.chunk_size)


def _as_strategy(value):
    from ..strategies.base import Strategy

    if isinstance(value, AnchoredReference):  # duck-typed into the Strategy contract
        s = Strategy()
        s.name, s.supports, s.run = value.name, value.supports, value.run
        return s
    return value


def _max_rel_err(got, ref) -> float:
    """Max over y and every state tensor of max |got - ref| / (1 + max |ref|)."""
    (y1, s1), (y0, s0) = got, ref
    pairs = [(y1, y0)] + [(s1[k], s0[k]) for k in s0]
    if set(s1) != set(s0):
        return float("inf")
    err = 0.0
    for a, b in pairs:
        if a.shape != b.shape or not torch.isfinite(a).all():
            return float("inf")
        d = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
        scale = 1.0 + (b.double().abs().max().item() if b.numel() else 0.0)
        err = max(err, d / scale)
    return err


def check_against_rule(case: Case, run: Callable[[Any, Inputs, Any], tuple], chunk_size: int | None,
                       *, exact_only: bool = False, anchored_only: bool = False,
                       whole_call: bool = False) -> Check:
    """The float64 gate. ``run(rule, inputs, strategy_or_None)`` returns ``(y, state)`` computed
    by the subject (strategy None: the subject's own setting; else that strategy's value)."""
    rule = case.rule(CHECK_SIZES["H"], CHECK_SIZES["Dk"], CHECK_SIZES["Dv"], torch.float64)
    C = chunk_size or 1
    T = 37 if whole_call else min(max(2 * C + 5, 37), 160)
    inp = make_inputs(case, rule.gate_names, T=T, dtype=torch.float64, seed=1, **CHECK_SIZES)
    try:
        with torch.no_grad():
            got = run(rule, inp, None)
            seq = run(rule, inp, "core:sequential")
            if not all(torch.isfinite(t).all() for t in [seq[0], *seq[1].values()]):
                return Check("error", "core:sequential gave non-finite values on the check inputs")
            err_exact = _max_rel_err(got, seq)
            if not anchored_only and err_exact <= CHECK_TOL:
                return Check("passed", f"exact: equals core:sequential (T={T})", err_exact)
            if exact_only:
                return Check("FAILED", f"differs from core:sequential by {err_exact:.2e} (T={T})",
                             err_exact)
            anchor = T if whole_call else C
            anc = run(rule, inp, _as_strategy(AnchoredReference(anchor)))
            err_anc = _max_rel_err(got, anc)
            if err_anc > CHECK_TOL:
                return Check("FAILED", f"differs from core:sequential by {err_exact:.2e} and from "
                             f"the loop anchored every {anchor} tokens by {err_anc:.2e} (T={T})",
                             min(err_exact, err_anc))
            return Check("passed", f"anchored: equals the loop anchored every {anchor} tokens "
                         f"(T={T})", err_anc)
    except Exception as exc:  # noqa: BLE001 - a crash is a failed check, reported with its reason
        return Check("error", f"{type(exc).__name__}: {exc}")


def _strategy_value(name: str, params: dict[str, Any]) -> Any:
    return {"use": name, **params} if params else name


class StrategySubject(Subject):
    """``rule(q, k, v, gates, strategy=...)`` with one strategy (a registered name + params, or a
    Strategy object)."""

    group = "strategy"

    def __init__(self, strategy: Any, params: dict[str, Any] | None = None, label: str | None = None):
        self.strategy = strategy
        self.params = dict(params or {})
        self.chunk_size = self.params.get("chunk_size")
        base = strategy if isinstance(strategy, str) else getattr(strategy, "name", type(strategy).__name__)
        self.strategy_name = base
        self.name = label or (f"{base}(C={self.chunk_size})" if self.chunk_size else base)

    def _value(self, **override):
        if not isinstance(self.strategy, str):
            return self.strategy
        return _strategy_value(self.strategy, {**self.params, **override})

    def supports(self, case: Case) -> tuple[bool, str]:
        if case.kind != "rule":
            return False, "a rule-level strategy; this case is a layer"
        from ..strategies.base import build_strategy

        rule = case.rule(CHECK_SIZES["H"], CHECK_SIZES["Dk"], CHECK_SIZES["Dv"])
        strat = self._value()
        try:
            strat = build_strategy(strat) if not hasattr(strat, "supports") else strat
        except Exception as exc:  # noqa: BLE001
            return False, str(exc)
        return strat.supports(rule)

    def forward(self, rule, inp: Inputs) -> torch.Tensor:
        y, _ = rule(inp.q, inp.k, inp.v, gates=inp.gates, strategy=self._value())
        return y

    def check(self, case: Case) -> Check:
        if self.strategy == "core:sequential":
            return Check("reference", "the readable loop itself (tested against hand-written loops)")

        def run(rule, inp, strategy):
            value = self._value() if strategy is None else strategy
            return rule(inp.q, inp.k, inp.v, gates=inp.gates, strategy=_as_strategy(value))

        out = check_against_rule(case, run, self.chunk_size)
        if out.ok and out.detail.startswith("anchored") and self.chunk_size and isinstance(self.strategy, str):
            # chunk size 1 of an anchored strategy must be the sequential rule itself
            one = check_against_rule(
                case, lambda rule, inp, s: run(rule, inp, self._value(chunk_size=1) if s is None else s),
                1, exact_only=True)
            if not one.ok:
                return Check("FAILED", f"at chunk size 1: {one.detail}", one.max_err)
            out.detail += "; chunk size 1 equals core:sequential"
        return out


class LayerSubject(Subject):
    """The project's `MemoryLayer` (projections, short conv, q/k norm, gates, output norm and gate)
    around the case's rule, with a given strategy."""

    group = "layer"

    def __init__(self, strategy: Any, params: dict[str, Any] | None = None, label: str | None = None):
        self.inner = StrategySubject(strategy, params)
        self.chunk_size = self.inner.chunk_size
        self.name = label or f"atlas MemoryLayer, {self.inner.name}"

    def supports(self, case: Case) -> tuple[bool, str]:
        return (True, "") if case.kind == "layer" else (False, "a layer subject; this case is a rule")

    def _layer(self, case: Case, sizes: dict[str, int], dtype, strategy):
        from ..layer import LayerParams, MemoryLayer
        from ..rule import build_rule

        with torch.random.fork_rng():
            torch.manual_seed(0)
            rule = build_rule(case.spec)
            layer = MemoryLayer(sizes["H"] * sizes["Dk"], sizes["H"], rule,
                                LayerParams(d_key=sizes["Dk"], d_value=sizes["Dv"], **case.layer),
                                strategy=strategy)
        return layer.to(dtype)

    def setup(self, case: Case, sizes: dict[str, int], dtype: torch.dtype):
        return self._layer(case, sizes, dtype, self.inner._value())

    def forward(self, layer, inp: Inputs) -> torch.Tensor:
        return layer(inp.x)[0]

    def check(self, case: Case) -> Check:
        layer = self._layer(case, CHECK_SIZES, torch.float64, self.inner._value())

        def run(rule_unused, inp, strategy):
            layer.strategy = self.inner._value() if strategy is None else _as_strategy(strategy)
            return layer(inp.x)

        return check_against_rule(case, run, self.chunk_size)


def load_baselines(directory: str | Path, config: Any = None) -> tuple[list[Subject], list[str]]:
    """Import every ``*.py`` (not starting with ``_``) in ``directory`` by path and collect the
    subjects its ``subjects(config)`` function returns. Returns (subjects, problems): a baseline
    that cannot load is reported, not fatal."""
    directory = Path(directory)
    subjects: list[Subject] = []
    problems: list[str] = []
    if not directory.is_dir():
        return subjects, [f"baselines folder {directory} not found"]
    for path in sorted(directory.glob("*.py")):
        if path.name.startswith("_"):
            continue
        mod_name = f"atlas_bench_baseline_{path.stem}"
        try:
            spec = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[mod_name] = module
            spec.loader.exec_module(module)
            factory = getattr(module, "subjects", None)
            if factory is None:
                continue
            got = factory(config)
            subjects.extend(got)
        except Exception as exc:  # noqa: BLE001 - one broken baseline must not stop the benchmark
            problems.append(f"{path.name}: {type(exc).__name__}: {exc}")
    return subjects, problems


def default_baselines_dir() -> Path:
    """``benchmarks/baselines`` of the source checkout this package was imported from."""
    return Path(__file__).resolve().parents[2] / "benchmarks" / "baselines"
