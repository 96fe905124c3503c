"""`Subject`: a `Case` resolved against the installed plugins, with what the checks need.

Resolution never raises: a plugin that failed to import (strict loading: the kit always treats
a failed plugin as an error, as ``ATLAS_STRICT_PLUGINS=1`` does), an unknown or ambiguous name,
are stored in ``subject.error`` and every check of that subject fails with it.

For components that run (rules, knobs, strategies, backends) the subject knows
- the rule spec it is tested in (`rule_spec`) and how to build it (`build_rule`, seeded);
- how to make calls (`inputs`) and run them through a strategy or through ``core:sequential``
  (`run`);
- the strategy *variants* to compare with ``core:sequential``: each supporting strategy (the
  bundled ones, or those chosen in the kit's config: `compared_strategies`), and for
  strategies with a ``chunk_size`` param chunk size 1 on the rule as given, and chunk size
  `CHUNK` (3) on the rule as given when the strategy accepts it there, else on the same rule
  rebuilt with ``anchor = 2 * CHUNK`` (seeded identically). A variant carries the anchor it needs
  (`Variant.anchor`); `run` runs it, and ``core:sequential`` as its reference, on that rule.
  There is one equivalence: a strategy that accepts a rule computes what ``core:sequential``
  computes on that rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from .cases import DEFAULT_COMPOSITION, Case
from .config import CONFIG
from .results import RULE_BEARING, Failure, Skip

KNOBS = ("structure", "bias", "retention", "algorithm", "feature_map")
CHUNK = 3  # the chunk size of the chunked variants (T = 7 leaves a ragged last chunk)
#: the chunk size a strategy without a ``chunk_size`` param is run at by check_default_chunk_size
#: (it may chunk inside: a hidden chunk of up to 64 tokens is then exercised)
STANDIN_CHUNK = 64
#: the anchor the rule is rebuilt with for a strategy whose default chunk follows the anchor
#: (core:chunkwise: the largest divisor of the anchor up to 64): Titans' block of 16 tokens
STANDIN_ANCHOR = 16
_NAME = re.compile(r"^[A-Za-z_][\w]*:[\w.\-]+\Z")


@dataclass(frozen=True)
class Variant:
    """A strategy run, always compared with ``core:sequential`` on the same rule."""

    label: str  # e.g. "core:chunkwise(chunk_size=3)"
    spec: Any  # the strategy spec handed to the rule
    chunk: int | None = None
    #: the anchor of the rule this variant runs on: None is the rule as given; an int is the same
    #: rule rebuilt (seeded identically) with that ``anchor``, because the strategy refuses the
    #: rule as given at this chunk size
    anchor: int | None = None

    @property
    def title(self) -> str:
        """The strategy and, when it is not the rule as given, the rule it runs on."""
        return self.label if self.anchor is None else f"{self.label} on the rule with anchor = {self.anchor}"

    @property
    def reference_title(self) -> str:
        return "core:sequential" if self.anchor is None else f"core:sequential on the rule with anchor = {self.anchor}"


SEQUENTIAL = Variant("core:sequential", "core:sequential")


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
                hint = did_you_mean(self.name, pool) or "see `atlas components list`"
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
            why = host.registry.unavailable.get(ns)
            if rec is None and why:  # refused: claimed by two distributions, or by a squatter
                return f"namespace {ns!r} {why}"
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
    def build_rule(self, *, seed: int = 0, dtype: Any = None, spec: Any = None, sizes: Mapping | None = None,
                   anchor: int | None = None):
        """The subject's rule (or ``spec``), seeded; ``anchor`` rebuilds it with that anchor key."""
        import torch

        from atlas_core.rule import build_rule

        how = {"seed": seed, "dtype": dtype, "spec": spec, "sizes": dict(sizes or {})}
        s = {**self.sizes(), **(sizes or {})}
        full = spec if spec is not None else self.rule_spec()
        if anchor is not None:
            full = {"use": full} if isinstance(full, str) else dict(full)
            full["anchor"] = anchor
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            rule = build_rule(full, heads=s["H"], d_key=s["Dk"], d_value=s["Dv"], registry=self.registry)
        if isinstance(rule, torch.nn.Module):
            rule = rule.to(device=CONFIG.device)
            if dtype is not None and dtype in (torch.float32, torch.float64):
                rule = rule.to(dtype=dtype)
        self._built()[id(rule)] = (rule, how)
        return rule

    def _built(self) -> dict:
        if not hasattr(self, "_how"):
            self._how: dict[int, tuple[Any, dict]] = {}  # id(rule) -> (rule, how it was built)
            self._anchored: dict[tuple[int, int], Any] = {}  # (id(rule), anchor) -> rebuilt rule
        return self._how

    def with_anchor(self, rule, anchor: int):
        """``rule`` rebuilt with ``anchor`` (same spec, seed, dtype and sizes; cached), for the
        variants that need it. Raises what `build_rule` raises (a standalone rule takes no anchor)."""
        if self.composed(rule) and rule.anchor == anchor:
            return rule
        built = self._built()
        key = (id(rule), anchor)
        if key not in self._anchored:
            if id(rule) not in built:
                raise RuntimeError("the kit rebuilds only rules it built itself (Subject.build_rule)")
            self._anchored[key] = self.build_rule(**built[id(rule)][1], anchor=anchor)
        return self._anchored[key]

    def rule_for(self, rule, variant: Variant):
        """The rule ``variant`` runs on: ``rule`` itself, or ``rule`` rebuilt with the variant's anchor."""
        return rule if variant.anchor is None else self.with_anchor(rule, variant.anchor)

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
                rule = self.build_rule(spec=spec)
                if self.kind == "strategy":  # chunk size 1, or the chunked variant on an anchor
                    ok = bool(self._strategy_variants(self.name, dict(self.params), rule)[0])
                else:
                    ok, _ = strat.supports(rule)
            except Exception:  # noqa: BLE001 - a preset that does not build here is passed over
                continue
            if ok:
                self.rule_base = base
                return

    @staticmethod
    def composed(rule: Any) -> bool:
        """A knob composition (its form says so), whose calls the kit makes itself."""
        form = getattr(rule, "form", None)
        return bool(form is not None and form.composed)

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
        """Run a call through ``variant`` (or, with ``reference``, through ``core:sequential``) on
        the rule the variant runs on (`rule_for`); returns ``{"y": ..., "state.<key>": ...}``."""
        from . import inputs as I

        kwargs = I.unflatten(flat)
        self.running = None if reference or variant is SEQUENTIAL else variant  # whom a crash blames
        target = self.rule_for(rule, variant)
        spec = "core:sequential" if reference else variant.spec
        label = variant.reference_title if reference else variant.title
        return I.outputs(target(**kwargs, state=state, strategy=spec), f"{self.name} under {label}")

    def warm_state(self, rule, variant: Variant = SEQUENTIAL, *, B: int | None = None, dtype=None,
                   seed: int = 99) -> dict:
        """A realistic non-zero state of the rule ``variant`` runs on: the state after 3 random
        tokens through core:sequential (detached)."""
        from . import inputs as I

        flat = self.inputs(rule, B=B, T=3, dtype=dtype, seed=seed)
        out = self.run(rule, flat, variant, reference=True)
        return {k: x.detach().clone() for k, x in I.state_of(out).items()}

    # -- strategies -----------------------------------------------------------------------------
    def variants(self, rule) -> tuple[list[Variant], list[str]]:
        """(strategy variants to compare with core:sequential, reasons others were left out)."""
        if self.kind == "strategy":
            names = [self.name]
        elif self.case.strategy is not None:
            raw = self.case.strategy
            names = list(raw) if isinstance(raw, (list, tuple)) else [raw]
        else:
            names = self.compared_strategies()
        out, left = [], []
        for entry in names:
            from atlas_core.host.registry import split_use

            name, params = split_use(entry)
            if self.kind == "strategy":
                params = {**self.params, **params}
            got, why = self._strategy_variants(name, params, rule)
            out += got
            left += why
        return out, left

    def note_compared(self, variants: list[Variant], left: list[str] = ()) -> None:
        """Report the variants a check compared with core:sequential, and those left out."""
        self.note("compared with core:sequential: " + (", ".join(v.title for v in variants) or "none")
                  + (f"; left out: {'; '.join(left)}" if left else ""))

    def compared_strategies(self) -> list[str]:
        """The strategies a rule or knob is compared under (besides core:sequential): those chosen
        in the kit's config (`KitConfig.chosen_strategies`: names or namespaces), else every
        bundled one and those of the component's own plugin (its standalone rule's own
        strategies, say). Another package's strategy is certified by its own package (a `Case`
        naming it), so that a broken one never fails another component's checks."""
        from atlas_core.strategies.trust import bundled

        comps = [c for c in self.registry.all("strategy") if c.name != "core:sequential"]
        chosen = CONFIG.chosen_strategies()
        if chosen is None:  # the bundled ones, and the component's own plugin's (one package)
            return [c.name for c in comps if bundled(c) or c.namespace == self.case.namespace]
        out: list[str] = []
        for entry in chosen:
            hits = [c.name for c in comps if entry in (c.name, c.namespace)]
            if not hits and entry != "core:sequential":
                known = ", ".join(c.name for c in comps)
                raise Failure(f"the chosen strategy {entry!r} names no registered strategy or namespace "
                              f"of strategies (registered: {known})")
            out += hits
        return list(dict.fromkeys(out))

    # -- notes and blame ------------------------------------------------------------------------
    def note(self, text: str) -> None:
        """A line for the report of the check that runs now (what it compared, a warning)."""
        notes = self.__dict__.setdefault("notes", [])
        if text not in notes:
            notes.append(text)

    def warn(self, text: str) -> None:
        """A warning for the report of the check that runs now (also a Python warning)."""
        import warnings

        self.note(f"warning: {text}")
        warnings.warn(f"{self.id}: {text}", UserWarning, stacklevel=2)

    def _strategy_variants(self, name: str, params: dict, rule) -> tuple[list[Variant], list[str]]:
        """The variants of one strategy on ``rule``. With a ``chunk_size`` param: chunk size 1 on
        the rule as given, and chunk size C (the case's, else `CHUNK`) on the rule as given if the
        strategy accepts it there, else on the rule rebuilt with ``anchor = 2 C`` (a composed rule;
        a block then spans two chunks). Without one: the strategy on the rule as given."""
        from atlas_core.errors import AtlasError

        comp = self.registry.get("strategy", name)
        if comp.name == "core:sequential":
            return [], []

        def accepts(spec, on) -> tuple[bool, str]:
            try:
                return self.registry.build("strategy", spec).supports(on)
            except (AtlasError, ValueError) as exc:
                return False, f"cannot be built: {exc}"

        model = comp.load_params()
        fields = set(getattr(model, "model_fields", {}) or {})
        if "chunk_size" not in fields:
            spec = {"use": comp.name, **params} if params else comp.name
            ok, reason = accepts({"use": comp.name, **params}, rule)
            if not ok:
                return [], [f"{comp.name}: {reason}"]
            label = comp.name + (f"({', '.join(f'{k}={v}' for k, v in params.items())})" if params else "")
            return [Variant(label, spec)], []
        out, left = [], []
        sizes = [1, int(params.get("chunk_size") or CHUNK)]
        if sizes[1] == 1:
            sizes = [1, CHUNK] if "chunk_size" not in params else [1]
        for C in dict.fromkeys(sizes):
            spec = {"use": comp.name, **params, "chunk_size": C}
            label = f"{comp.name}(chunk_size={C})"
            ok, reason = accepts(spec, rule)
            if ok:
                out.append(Variant(label, spec, C))
                continue
            if C == 1:
                left.append(f"{label}: {reason}")
                continue
            if not self.composed(rule):
                left.append(f"{label}: {reason} (a standalone rule takes no anchor to rebuild it with)")
                continue
            A = 2 * C
            try:
                anchored = self.with_anchor(rule, A)
            except (AtlasError, ValueError) as exc:
                left.append(f"{label}: {reason}; the rule does not rebuild with anchor = {A}: {exc}")
                continue
            ok2, reason2 = accepts(spec, anchored)
            if ok2:
                out.append(Variant(label, spec, C, anchor=A))
            else:
                left.append(f"{label}: {reason}; on the rule with anchor = {A}: {reason2}")
        return out, left

    def default_variant(self, name: str, params: dict, rule) -> tuple[Variant | None, str]:
        """The strategy ``name`` at its own default chunk size (``params`` without ``chunk_size``):
        (the variant, "") or (None, why it was left out). Its chunk ``D`` is what the strategy
        says it runs the rule with (`Strategy.chunk_for`), else its params' default, else
        `STANDIN_CHUNK` (a strategy without a chunk size may still chunk inside). A strategy
        that refuses the rule as given at its default runs on the rule rebuilt with ``anchor =
        2 D`` (`STANDIN_ANCHOR` where the default follows the anchor, as core:chunkwise's)."""
        from atlas_core.errors import AtlasError

        comp = self.registry.get("strategy", name)
        if comp.name == "core:sequential":
            return None, ""
        own = {k: v for k, v in params.items() if k != "chunk_size"}
        spec = {"use": comp.name, **own}
        model = comp.load_params()
        declared = getattr(getattr(model, "model_fields", {}).get("chunk_size"), "default", None)

        def build_on(on):
            try:
                strat = self.registry.build("strategy", spec)
            except (AtlasError, ValueError) as exc:
                return None, f"cannot be built: {exc}"
            ok, reason = strat.supports(on)
            return (strat, "") if ok else (None, reason)

        anchor = None
        strat, reason = build_on(rule)
        if strat is None and self.composed(rule):
            A = 2 * (declared if isinstance(declared, int) else STANDIN_ANCHOR // 2)
            try:
                anchored = self.with_anchor(rule, A)
            except (AtlasError, ValueError) as exc:
                return None, (f"{comp.name} at its default: {reason}; the rule does not rebuild with "
                              f"anchor = {A}: {exc}")
            strat, reason2 = build_on(anchored)
            if strat is None:
                return None, f"{comp.name} at its default: {reason}; on the rule with anchor = {A}: {reason2}"
            rule, anchor = anchored, A
        elif strat is None:
            return None, f"{comp.name} at its default: {reason}"
        D = strat.chunk_for(rule) or (declared if isinstance(declared, int) else STANDIN_CHUNK)
        what = "its default" if isinstance(declared, int) or strat.chunk_for(rule) else "the kit's stand-in"
        extra = "".join(f", {k}={v}" for k, v in own.items())
        return Variant(f"{comp.name}(chunk_size={D}{extra}: {what})", spec, int(D), anchor=anchor), ""

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
            self.note("ran under: " + ", ".join(v.title for v in runs))
            return runs
        runs = ([SEQUENTIAL] if with_sequential else []) + runs
        self.note("ran under: " + ", ".join(v.title for v in runs)
                  + (f"; left out: {'; '.join(left)}" if left else ""))
        return runs
