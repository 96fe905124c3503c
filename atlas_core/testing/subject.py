"""`Subject`: a `Case` resolved against the installed plugins, with what the checks need.

Resolution never raises: a plugin that failed to import (strict loading: the kit always treats
a failed plugin as an error, as ``ATLAS_STRICT_PLUGINS=1`` does), an unknown or ambiguous name,
are stored in ``subject.error`` and every check of that subject fails with it.

For components that run (rules, knobs, strategies, backends) the subject knows
- the rule spec it is tested in (`rule_spec`) and how to build it (`build_rule`, seeded);
- how to make calls (`inputs`), run them through a strategy (`run`) or the anchored reference;
- the strategy *variants* to compare with ``core:sequential``: each supporting strategy, and for
  strategies with a ``chunk_size`` param chunk size 1 (exactly sequential) and 3 (the anchored
  reference ``rule.reference(inputs, anchor_every=3)``, or plain sequential for a strategy that
  declares the capability ``"exact"``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from .cases import DEFAULT_COMPOSITION, Case
from .config import CONFIG
from .results import RULE_BEARING, Failure, Skip

KNOBS = ("structure", "bias", "retention", "algorithm", "feature_map")
KIND_PREFERENCE = ("rule", "strategy", *KNOBS, "backend", "arch", "task")
CHUNK = 3  # the chunk size of the anchored comparisons (T = 7 leaves a ragged last chunk)
_NAME = re.compile(r"^[A-Za-z_][\w]*:[\w.\-]+$")


@dataclass(frozen=True)
class Variant:
    label: str  # e.g. "core:chunkwise(chunk_size=3)"
    spec: Any  # the strategy spec handed to the rule
    ref: str  # "sequential" | "anchored"
    chunk: int | None = None


SEQUENTIAL = Variant("core:sequential", "core:sequential", "sequential")


def _names_in(value: Any) -> set[str]:
    """Component names mentioned anywhere in a spec value."""
    if isinstance(value, str):
        return {value} if _NAME.match(value) else set()
    if isinstance(value, Mapping):
        out: set[str] = set()
        for v in value.values():
            out |= _names_in(v)
        return out
    if isinstance(value, (list, tuple)):
        return set().union(*(_names_in(v) for v in value)) if value else set()
    return set()


class Subject:
    """A resolved case. ``error`` is None when it resolved."""

    def __init__(self, case: Case, host: Any = None) -> None:
        self.case = case
        self.id = case.case_id
        self.name = case.name
        self.params = dict(case.params)
        self.kind = case.kind or "?"
        self.component = None
        self.error: str | None = None
        self.rule_base = case.rule
        self._resolve(host)

    # -- resolution ---------------------------------------------------------------------------
    def _resolve(self, host: Any) -> None:
        from atlas_core.errors import did_you_mean
        from atlas_core.host.manager import get_host

        host = host or get_host()
        self.host = host
        self.registry = host.registry
        failed = self._failed_plugins(host, {self.name} | _names_in(self.case.rule) | _names_in(self.params)
                                      | _names_in(self.case.strategy))
        if failed:
            self.error = failed
            return
        found = self.registry.find(self.name)
        if self.case.kind:
            found = [c for c in found if c.kind == self.case.kind]
        if not found:
            pool = [c.name for c in self.registry.all()]
            ns = self.case.namespace
            installed = sorted({n.split(":", 1)[0] for n in pool})
            if ns not in installed:
                hint = did_you_mean(ns, installed)
                self.error = (f"unknown component {self.name!r}: no installed plugin provides namespace "
                              f"{ns!r}" + (f"; {hint}" if hint else f" (installed: {', '.join(installed)})"))
            else:
                hint = did_you_mean(self.name, pool) or f"see `atlas components list`"
                kind = f" {self.case.kind}" if self.case.kind else ""
                self.error = f"unknown{kind} component {self.name!r}; {hint}"
            return
        if len(found) > 1:
            kinds = ", ".join(c.kind for c in found)
            self.error = f"{self.name!r} is registered as several kinds ({kinds}); pass Case(..., kind=...)"
            return
        self.component = found[0]
        self.kind = self.component.kind
        self.name = self.component.name
        self.rule_base = self.case.rule

    def missing_params(self) -> list[str]:
        """Required params (no default) the case does not give: the component cannot be built
        from this case. `atlas check` then reports what to declare (``check_cases``)."""
        model = self.component.load_params() if self.component is not None else None
        if model is None:
            return []
        return [n for n, f in model.model_fields.items() if f.is_required() and n not in self.params]

    def require_buildable(self) -> None:
        self.require()
        missing = self.missing_params()
        if missing:
            raise Skip(
                f"{self.name} has required params {missing} and the case gives none; declare "
                f"check_cases=[{{'params': {{...}}}}] at registration or pass Case(params=...)"
            )

    @staticmethod
    def _failed_plugins(host: Any, names: set[str]) -> str | None:
        for ns in sorted({n.split(":", 1)[0] for n in names}):
            rec = host.records.get(ns)
            if rec is not None and rec.status == "failed":
                return (f"plugin {ns!r} ({rec.distribution} {rec.version}, {rec.module}) failed to "
                        f"load: {rec.error}")
        return None

    def require(self) -> None:
        if self.error:
            raise Failure(self.error)

    # -- specs ----------------------------------------------------------------------------------
    @property
    def runs(self) -> bool:
        return self.kind in RULE_BEARING or self.kind == "backend"

    def rule_spec(self, params: Mapping[str, Any] | None = None) -> Any:
        """The rule this subject is tested in; ``params`` update the component's own params."""
        own = {**self.params, **(params or {})}
        if self.kind in ("strategy", "backend") and not getattr(self, "_picked", False):
            self._picked = True
            self.pick_rule_for_strategy()
        if self.kind == "rule":
            return {"use": self.name, **own}
        base = self.rule_base if self.rule_base is not None else DEFAULT_COMPOSITION
        spec = {"use": base} if isinstance(base, str) else dict(base)
        if self.kind in KNOBS:
            spec[self.kind] = {"use": self.name, **own} if own else self.name
        return spec

    def sizes(self) -> dict[str, int]:
        return {k: self.case.size(k) for k in ("B", "T", "H", "Dk", "Dv")}

    def sizes_text(self, B: int | None = None, T: int | None = None) -> str:
        s = self.sizes()
        if B is not None:
            s["B"] = B
        if T is not None:
            s["T"] = T
        return " ".join(f"{k}={v}" for k, v in s.items())

    # -- building and calling -------------------------------------------------------------------
    def build_rule(self, *, seed: int = 0, dtype: Any = None, spec: Any = None, sizes: Mapping | None = None):
        import torch

        from atlas_core.rule import build_rule

        s = {**self.sizes(), **(sizes or {})}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            rule = build_rule(spec if spec is not None else self.rule_spec(),
                              heads=s["H"], d_key=s["Dk"], d_value=s["Dv"], registry=self.registry)
        if isinstance(rule, torch.nn.Module):
            rule = rule.to(device=CONFIG.device)
            if dtype is not None and dtype in (torch.float32, torch.float64):
                rule = rule.to(dtype=dtype)
        return rule

    def pick_rule_for_strategy(self) -> None:
        """A strategy (or backend) case without ``rule``: run it on the default composition, or a
        simpler core composition (gd instead of momentum, then without retention), or else the
        first registered rule it supports (its own namespace first), so that a strategy for one
        family of rules (an exact delta-rule form, Muon, the MRU) is still exercised."""
        if self.kind not in ("strategy", "backend") or self.case.rule is not None or self.rule_base is not None:
            return
        try:
            if self.kind == "strategy":
                strat = self.registry.build("strategy", {"use": self.name, **self.params})
            else:  # a backend runs on the rules its strategy runs
                strat = self.registry.build("strategy", self.component.extra["strategy"])
        except Exception:  # noqa: BLE001 - reported by check_resolves_by_name / the backend check
            return
        presets = sorted(
            (c for c in self.registry.all("rule")),
            key=lambda c: (c.namespace != self.component.namespace, c.name),
        )
        core_variants = [  # the default composition, then simpler core ones (a gd-only form, ...)
            DEFAULT_COMPOSITION,
            {**DEFAULT_COMPOSITION, "algorithm": "core:gd"},
            {**DEFAULT_COMPOSITION, "algorithm": "core:gd", "retention": "core:none"},
        ]
        candidates = core_variants + [c.name for c in presets]
        for base in candidates:
            try:
                spec = {"use": base} if isinstance(base, str) else dict(base)
                ok, _ = strat.supports(self.build_rule(spec=spec))
            except Exception:  # noqa: BLE001 - a preset that does not build here is passed over
                continue
            if ok:
                self.rule_base = base
                return

    @staticmethod
    def composed(rule: Any) -> bool:
        from atlas_core.rule import ComposedRule

        return isinstance(rule, ComposedRule)

    def inputs(self, rule, *, B: int | None = None, T: int | None = None, dtype=None,
               seed: int = 1, mode: str = "random") -> dict:
        import torch

        from . import inputs as I

        s = self.sizes()
        B = B or s["B"]
        T = T or s["T"]
        dtype = dtype or getattr(torch, CONFIG.dtype)
        if self.composed(rule):
            return I.composed_inputs(rule, B, T, dtype=dtype, device=CONFIG.device, seed=seed, mode=mode)
        return I.standalone_inputs(rule, self.name, B, T, dtype=dtype, device=CONFIG.device, seed=seed)

    def run(self, rule, flat: Mapping, variant: Variant = SEQUENTIAL, state=None, *, reference: bool = False):
        """Run a call through ``variant`` (or, with ``reference``, through what the variant is
        compared with); returns ``{"y": ..., "state.<key>": ...}``."""
        from . import inputs as I

        kwargs = I.unflatten(flat)
        if reference and variant.ref == "anchored":
            prepared = rule.prepare(**kwargs, state=state)
            result = rule.finish(prepared, rule.reference(prepared, anchor_every=variant.chunk))
            return I.outputs(result, f"the anchored reference (anchor_every={variant.chunk})")
        spec = "core:sequential" if reference else variant.spec
        label = "core:sequential" if reference else variant.label
        return I.outputs(rule(**kwargs, state=state, strategy=spec), f"{self.name} under {label}")

    def warm_state(self, rule, *, B: int | None = None, dtype=None, seed: int = 99) -> dict:
        """A realistic non-zero state: the state after 3 random tokens (detached)."""
        from . import inputs as I

        flat = self.inputs(rule, B=B, T=3, dtype=dtype, seed=seed)
        out = self.run(rule, flat)
        return {k: x.detach().clone() for k, x in I.state_of(out).items()}

    # -- strategies -----------------------------------------------------------------------------
    def variants(self, rule) -> tuple[list[Variant], list[str]]:
        """(strategy variants to compare with core:sequential, reasons others were left out)."""
        from atlas_core.errors import AtlasError

        if self.kind == "strategy":
            names = [self.name]
        elif self.case.strategy is not None:
            raw = self.case.strategy
            names = list(raw) if isinstance(raw, (list, tuple)) else [raw]
        else:
            names = [c.name for c in self.registry.all("strategy") if c.name != "core:sequential"]
        out, left = [], []
        composed = self.composed(rule)
        for entry in names:
            from atlas_core.host.registry import split_use

            name, params = split_use(entry)
            if self.kind == "strategy":
                params = {**self.params, **params}
            comp = self.registry.get("strategy", name)
            if comp.name == "core:sequential":
                continue
            try:
                strat = self.registry.build("strategy", {"use": comp.name, **params})
                ok, reason = strat.supports(rule)
            except (AtlasError, ValueError) as exc:
                ok, reason = False, f"cannot be built: {exc}"
            if not ok:
                left.append(f"{comp.name}: {reason}")
                continue
            model = comp.load_params()
            fields = set(getattr(model, "model_fields", {}) or {})
            exact = "exact" in comp.capabilities
            if "chunk_size" in fields:
                sizes = [1, int(params.get("chunk_size", CHUNK))]
                if sizes[1] == 1:
                    sizes = [1, CHUNK] if "chunk_size" not in params else [1]
                for C in dict.fromkeys(sizes):
                    spec = {"use": comp.name, **params, "chunk_size": C}
                    label = f"{comp.name}(chunk_size={C})"
                    if C == 1 or exact:
                        out.append(Variant(label, spec, "sequential", C))
                    elif composed:
                        out.append(Variant(label, spec, "anchored", C))
                    else:
                        left.append(f"{label}: no anchored reference for a standalone rule "
                                    "(declare the capability 'exact' if it is exact)")
            else:
                spec = {"use": comp.name, **params} if params else comp.name
                label = comp.name + (f"({', '.join(f'{k}={v}' for k, v in params.items())})" if params else "")
                out.append(Variant(label, spec, "sequential"))
        return out, left

    def run_variants(self, rule, *, with_sequential: bool = True) -> list[Variant]:
        """The strategies the generic checks run: sequential (unless the subject is another
        strategy) plus, per other strategy, its chunked variant."""
        if self.kind == "strategy" and self.name == "core:sequential":
            return [SEQUENTIAL]
        variants, left = self.variants(rule)
        picked: dict[str, Variant] = {}
        for v in variants:  # keep the last (largest chunk) variant per strategy
            key = v.label.split("(", 1)[0]
            picked[key] = v
        runs = list(picked.values())
        if self.kind == "strategy":
            if not runs:
                raise Skip(f"{self.name} does not run this rule: " + "; ".join(left))
            return runs
        return ([SEQUENTIAL] if with_sequential else []) + runs
