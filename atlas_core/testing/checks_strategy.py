"""Checks of a strategy beyond the kit's small calls: its own default chunk size, and every rule
the environment has.

`check_default_chunk_size`: the equivalence checks run chunked strategies at chunk sizes 1 and 3
on 7 tokens; a strategy's default chunk size (core:exact_chunk's 32, a plugin's 64) is what users
run, and a computation wrong only at larger chunks passes those. This check runs every compared
strategy (for a rule or knob: each one that accepts it; for a strategy: itself) at its own
default chunk size D (`Subject.default_variant`) on ``2 D + ceil(D / 2)`` tokens: three chunks,
the last ragged, at the memory layer's default gates (as check_long_sequence_stable: the kit's
random gates, theta up to 0.5, can make a deep memory diverge over that many tokens), from a
non-zero state. Outputs, final state and gradients must equal
``core:sequential``'s, and the sequence cut into two calls off a chunk boundary must equal one
call.

`check_strategy_on_every_rule`: a strategy's own cases name the rules its author thought of. This
check puts the strategy against every rule available in the environment (the default
composition, every registered rule: bundled presets, standalone rules, every installed
third-party preset), one small call each, in two directions:

- where the strategy accepts a rule, it computes what ``core:sequential`` computes on it
  (outputs, final state and gradients; its largest kit variant, as the other checks run it);
- where no exact chunked form of the rule exists it must refuse: a knob-composed rule whose form
  lists no chunk form (``rule.form.chunk_forms`` empty: a per-token transition, an algorithm
  with neither a chunk form nor a closed linear form, a gradient at the decayed memory where no
  per-token form applies; `atlas_core.forms.catalogue` says which), and a standalone
  rule of another plugin (its inputs are its own type; its own plugin's strategies run it).

It depends on the strategy and its params only, not on the case's rule, so it runs once per
strategy, params, registry, dtype and device in a process; the other cases of the same strategy
report that result.
"""

from __future__ import annotations

import weakref

import torch

from . import inputs as I
from .cases import DEFAULT_COMPOSITION
from .config import CONFIG
from .results import RULE_BEARING, Failure, Skip, register
from .checks_equivalence import config_dtype, loss_and_grads, not_reference, run_split, variant_tolerance, compare_grads
from .checks_equivalence import forward_leaves, grads_of
from .subject import CHUNK


def long_T(D: int) -> int:
    """Tokens of the default-chunk run: two whole chunks and a ragged third (half a chunk)."""
    return 2 * D + (D + 1) // 2


def _compared(subject, rule, flat, variant, state, want, where: str, nums: dict):
    """Run ``variant``, compare its outputs with ``want`` (``core:sequential``'s, with their
    gradients: `loss_and_grads`) first, then its gradients: (its outputs, detached).
    ``where``: the run, for messages (``" over 160 tokens: ..."``)."""
    ref, g_want = want
    got, named = forward_leaves(subject, rule, flat, variant, state)
    I.compare(got, ref, variant_tolerance(variant), f"{variant.title} differs from {variant.reference_title}{where}", **nums)
    compare_grads(grads_of(got, named, variant.title), g_want, f"{variant.title}{where}: gradients differ", nums)
    return {k: x.detach() for k, x in got.items()}


def _default_variants(subject, rule) -> list:
    if subject.kind == "strategy":
        pairs = [(subject.name, dict(subject.params))]
    else:
        from atlas_core.host.registry import split_use

        if subject.case.strategy is not None:
            raw = subject.case.strategy
            names = list(raw) if isinstance(raw, (list, tuple)) else [raw]
        else:
            names = subject.compared_strategies()
        pairs = [split_use(n) for n in names]
    out, left = [], []
    for name, params in pairs:
        variant, why = subject.default_variant(name, dict(params), rule)
        if variant is None:
            if why:  # refused at its default: the equivalence checks' notes give the reasons
                left.append(name)
        elif variant.chunk <= 1:
            left.append(f"{variant.label} (chunk size 1: check_strategies_match_sequential's)")
        else:
            out.append(variant)
    subject.note("at the default chunk size: " + (", ".join(v.title for v in out) or "none")
                 + (f"; left out (refused): {', '.join(left)}" if left else ""))
    if not out:
        raise Skip("no compared strategy runs this rule at a default chunk size above 1"
                   + (f" ({'; '.join(left)})" if left else ""))
    return out


@register(
    "check_default_chunk_size",
    "every strategy runs at its own default chunk size D (or the kit's stand-in of 64 for one "
    "without a chunk size) on 2 D + D/2 tokens, three chunks with a ragged last one, from a "
    "non-zero state: outputs, final state and gradients equal core:sequential's on the same "
    "rule, and the sequence cut into two calls off a chunk boundary equals one call.",
    RULE_BEARING,
    applies=not_reference,
)
def check_default_chunk_size(subject) -> None:
    subject.require_buildable()
    rule = subject.build_rule(dtype=config_dtype())
    for variant in _default_variants(subject, rule):
        D = variant.chunk
        T = long_T(D)
        nums = {"strategy": variant.title, "reference": variant.reference_title,
                "dtype": CONFIG.dtype, "sizes": subject.sizes_text(1, T)}
        warm = subject.warm_state(rule, variant, B=1)
        # the memory layer's initial gates: T tokens at the kit's random ones (theta up to 0.5)
        # can diverge under the reference itself (a deep memory's inner steps)
        flat = subject.inputs(rule, B=1, T=T, seed=29, mode="default")
        want = loss_and_grads(subject, rule, flat, variant, warm, reference=True)
        chunks = f"{T} tokens: chunks of {D}, the last of {T - 2 * D}"
        bad = [k for k, x in want[0].items() if not bool(torch.isfinite(x).all())]
        if bad:
            raise Skip(f"{variant.reference_title} itself is not finite over {T} tokens at the default "
                       f"gates ({', '.join(bad)}): check_long_sequence_stable's finding, not a strategy's")
        got = _compared(subject, rule, flat, variant, warm, want, f" over {chunks}", nums)
        cut = D + (D + 1) // 2  # inside the second chunk
        with torch.no_grad():
            joined = run_split(subject, rule, flat, variant, warm, (cut,))
        I.compare(joined, got, variant_tolerance(variant),
                  f"{variant.title}: two calls cut at token {cut} (inside a chunk) differ from one call "
                  f"over {chunks}", **{**nums, "reference": "one call under the same strategy"})


# -- every rule -----------------------------------------------------------------------------------
def _no_chunked_form(form) -> str:
    """Why a knob-composed rule whose form lists no chunk form has none (the chunk-form
    catalogue's reason, `atlas_core.forms.catalogue.no_form_reason`)."""
    from atlas_core.forms.catalogue import no_form_reason

    return no_form_reason(form) or "no chunk form's requirement holds"


def must_refuse(strategy_namespace: str, rule, component) -> str:
    """Why no strategy but core:sequential (and a standalone rule's own plugin's) may run
    ``rule``: "" when one may."""
    form = getattr(rule, "form", None)
    if form is None or not form.composed:
        ns = component.namespace if component is not None else "?"
        if ns == strategy_namespace:
            return ""
        return (f"it is a standalone rule of another plugin ({ns!r}): its call takes its own inputs, "
                "and only its own plugin's strategies (and core:sequential) run it")
    if not form.chunk_forms:
        return (f"no exact chunked form of it exists (rule.form.chunk_forms is empty: "
                f"{_no_chunked_form(form)}), so only core:sequential runs it")
    return ""


def available_rules(registry) -> list[tuple[str, object, object]]:
    """(label, spec, component) of every rule the environment has: the default composition,
    then every registered rule (presets and standalone rules of every plugin), each with the
    params of its first declared case."""
    out: list[tuple[str, object, object]] = [("the default composition", dict(DEFAULT_COMPOSITION), None)]
    for comp in registry.all("rule"):
        cases = comp.extra.get("check_cases") if comp.extra else None
        params = dict((cases[0] or {}).get("params") or {}) if cases else {}
        out.append((comp.name, {"use": comp.name, **params}, comp))
    return out


def _provider(comp) -> str:
    if comp is None:
        return ""
    from atlas_core.strategies.trust import describe

    return f" ({describe(comp).split(' (', 1)[1]}"


def _asks(subject) -> list[tuple[str, dict]]:
    """(label, spec) of the strategy as the sweep asks it: at the case's params, at its default
    chunk size, and for a chunked strategy at chunk sizes 1 and 3."""
    params = dict(subject.params)
    fields = set(getattr(subject.component.load_params(), "model_fields", {}) or {})
    own = {k: v for k, v in params.items() if k != "chunk_size"}
    specs = [params, own] + ([{**own, "chunk_size": C} for C in (1, CHUNK)] if "chunk_size" in fields else [])
    out = {}
    for p in specs:
        label = subject.name + (f"({', '.join(f'{k}={v}' for k, v in p.items())})" if p else "")
        out.setdefault(label, {"use": subject.name, **p})
    return list(out.items())


_SWEEPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
SWEEP_SIZES = {"B": 1, "T": 7}


def _sweep(subject) -> tuple[list[str], Failure | None]:
    """(notes, the first failure or None) of the strategy over every available rule."""
    from atlas_core.errors import AtlasError

    ran, refused, must, left = [], [], [], []
    asks = _asks(subject)
    for label, spec, comp in available_rules(subject.registry):
        try:
            rule = subject.build_rule(spec=spec, dtype=config_dtype())
        except Exception as exc:  # noqa: BLE001 - a rule that does not build here is left out, named
            left.append(f"{label}: does not build ({type(exc).__name__})")
            continue
        why = must_refuse(subject.component.namespace, rule, comp)
        if why:
            for ask_label, ask in asks:
                try:
                    strat = subject.registry.build("strategy", ask)
                except (AtlasError, ValueError):  # params it refuses: it runs nothing there
                    continue
                ok, _ = strat.supports(rule)
                if ok:
                    return [], Failure(
                        f"{ask_label} accepts {label}{_provider(comp)}, but {why}: a strategy must refuse "
                        "what it cannot run as a chunked computation, supports() -> (False, reason) "
                        "(docs/plugins.md#what-supports-must-refuse)",
                        strategy=ask_label, rule=label)
            must.append(label)
            continue
        variants, _ = subject._strategy_variants(subject.name, dict(subject.params), rule)
        if not variants:
            refused.append(label)
            continue
        variant = variants[-1]  # the largest chunk, as the other checks run it
        nums = {"strategy": variant.title, "reference": variant.reference_title, "rule": label,
                "dtype": CONFIG.dtype, "sizes": f"B={SWEEP_SIZES['B']} T={SWEEP_SIZES['T']}"}
        try:
            flat = subject.inputs(rule, **SWEEP_SIZES, seed=31)
        except Skip as exc:
            left.append(f"{label}: {exc.reason[:80]}")
            continue
        warm = subject.warm_state(rule, variant, B=SWEEP_SIZES["B"])
        try:
            want = loss_and_grads(subject, rule, flat, variant, warm, reference=True)
            _compared(subject, rule, flat, variant, warm, want, f" on {label}{_provider(comp)}", nums)
        except Failure as exc:
            return [], exc
        except Exception as exc:  # noqa: BLE001 - a crash on an accepted rule is the strategy's failure
            return [], Failure(f"{variant.title} accepts {label}{_provider(comp)} and then raises "
                               f"{type(exc).__name__}: {str(exc)[:200]}", **nums)
        ran.append(label)
    notes = [f"equal to core:sequential on {len(ran)} rules ({', '.join(ran) or 'none'}); refused "
             f"{len(must)} without an exact chunked form, as it must ({', '.join(must) or 'none'}); "
             f"refused {len(refused)} others" + (f"; left out: {'; '.join(left)}" if left else "")]
    return notes, None


@register(
    "check_strategy_on_every_rule",
    "a strategy, against every rule the environment has (the default composition, bundled "
    "presets, standalone rules, every installed third-party preset; one small call each): where "
    "it accepts a rule it equals core:sequential (outputs, final state, gradients), and it "
    "refuses every rule that has no exact chunked form (a composed rule whose form lists no chunk "
    "form, a standalone rule of another plugin).",
    {"strategy"},
    applies=not_reference,
)
def check_strategy_on_every_rule(subject) -> None:
    subject.require_buildable()
    key = (subject.name, repr(sorted(subject.params.items())), CONFIG.dtype, CONFIG.device)
    done = _SWEEPS.setdefault(subject.registry, {})
    if key not in done:
        done[key] = _sweep(subject)
    notes, failure = done[key]
    for note in notes:
        subject.note(note)
    if failure is not None:
        raise failure
