"""Checks that compare a run with its reference: strategies, state carry, split calls, gradients,
reductions.

There is one reference: ``core:sequential`` on the same rule (the rule's function; docs/math.md).
A strategy variant runs either on the rule as given or, when the strategy refuses a chunk size
there, on the same rule rebuilt with ``anchor = 2 * C`` (`subject.Variant.anchor`); its reference
is then ``core:sequential`` on that rebuilt rule. Chunk size 1 is compared to rounding ("exact"
tolerance), larger chunks at the "chunked" tolerance (another summation order).
Every comparison starts from a realistic non-zero state (the state after 3 random tokens) as well
as from the empty one, so initial-state handling is covered.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch

from . import inputs as I
from .config import CONFIG, TOLERANCES
from .results import RULE_BEARING, Failure, Skip, register
from .subject import SEQUENTIAL, Variant


def config_dtype():
    return getattr(torch, CONFIG.dtype)


def _nums(subject, variant, dtype=None, B=None, T=None, **extra):
    return {
        "strategy": variant.title,
        "reference": variant.reference_title,
        "dtype": str(dtype or config_dtype()).replace("torch.", ""),
        "sizes": subject.sizes_text(B, T),
        **extra,
    }


def variant_tolerance(variant: Variant) -> float:
    return CONFIG.tolerance("exact" if (variant.chunk or 1) == 1 else "chunked")


def not_reference(subject) -> bool:
    return not (subject.kind == "strategy" and subject.name == "core:sequential")


def _compared_variants(subject, rule) -> list[Variant]:
    variants, left = subject.variants(rule)
    left = [r if len(r) <= 110 else r[:107] + "..." for r in left]
    subject.note_compared(variants, left)
    if not variants:
        if subject.kind == "strategy":
            raise Skip(f"{subject.name} does not run this rule: " + "; ".join(left))
        raise Skip(
            "no compared strategy other than core:sequential runs this rule (the bundled ones, or "
            "those chosen with --strategy / --atlas-strategies)"
            + (" (" + "; ".join(left) + ")" if left else "")
        )
    return variants


@register(
    "check_strategies_match_sequential",
    "every strategy that accepts a rule computes what core:sequential computes on that "
    "rule: chunk size 1 on the rule as given (to rounding), and chunk size 3 on the rule as given "
    "when the strategy accepts it there, else on the same rule rebuilt with anchor = 6; outputs "
    "and final state, from an empty and from a non-zero state.",
    RULE_BEARING,
    applies=not_reference,
)
def check_strategies_match_sequential(subject) -> None:
    subject.require_buildable()
    rule = subject.build_rule(dtype=config_dtype())
    for variant in _compared_variants(subject, rule):
        warm = subject.warm_state(rule, variant)
        flat = subject.inputs(rule)
        for start, state in (("empty", None), ("non-zero", warm)):
            got = subject.run(rule, flat, variant, state=state)
            want = subject.run(rule, flat, variant, state=state, reference=True)
            I.compare(got, want, variant_tolerance(variant),
                      f"{variant.title} differs from {variant.reference_title} ({start} initial state)",
                      **_nums(subject, variant))


def _join(parts: list[dict]) -> dict:
    """Calls run one after the other -> one result: outputs concatenated, the last state."""
    return {"y": torch.cat([p["y"] for p in parts], dim=1), **{k: x for k, x in parts[-1].items() if k != "y"}}


def run_split(subject, rule, flat, variant, state, cuts) -> dict:
    """``flat`` run as consecutive calls cut at ``cuts``, each given the state the last returned."""
    bounds = [0, *cuts, None]
    parts, st = [], state
    for a, b in zip(bounds, bounds[1:]):
        out = subject.run(rule, I.time_slice(flat, a, b), variant, state=st)
        parts.append(out)
        st = I.state_of(out)
    return _join(parts)


@register(
    "check_state_carry",
    "two calls, the second given the state the first returned, equal one call over the whole "
    "sequence (outputs and final state; split on a chunk boundary for chunked strategies).",
    RULE_BEARING,
)
def check_state_carry(subject) -> None:
    subject.require_buildable()
    rule = subject.build_rule(dtype=config_dtype())
    for variant in subject.run_variants(rule):
        warm = subject.warm_state(rule, variant)
        flat = subject.inputs(rule)
        cut = variant.chunk if variant.chunk and variant.chunk > 1 else 3
        whole = subject.run(rule, flat, variant, state=warm)
        joined = run_split(subject, rule, flat, variant, warm, (cut,))
        I.compare(joined, whole, CONFIG.tolerance("exact"),
                  f"{variant.title}: two calls split at token {cut} differ from one call",
                  **_nums(subject, variant, split=cut, reference="one call under the same strategy"))


# Where the split check cuts a call of T = 7 tokens: into 2 and into 3 calls, off every chunk
# boundary of chunk size 3 (from the empty state, and from the non-zero state 3 tokens in).
SPLITS = ((2,), (1, 5))


def _splits(T: int) -> list[tuple[int, ...]]:
    got = [c for c in SPLITS if all(0 < x < T for x in c)]
    return got or ([(T // 2,)] if T > 1 else [])


@register(
    "check_split_calls",
    "any split of a sequence into calls equals one call: T = 7 cut into 2 calls (at token 2) and "
    "into 3 calls (at tokens 1 and 5), each given the state the last returned, off the chunk "
    "boundaries, gives the outputs and final state of one call, under core:sequential and every "
    "variant of check_strategies_match_sequential, from an empty and from a non-zero state.",
    RULE_BEARING,
)
def check_split_calls(subject) -> None:
    subject.require_buildable()
    rule = subject.build_rule(dtype=config_dtype())
    if subject.kind == "strategy":
        variants = [SEQUENTIAL] if subject.name == "core:sequential" else _compared_variants(subject, rule)
    else:
        found, left = subject.variants(rule)
        variants = [SEQUENTIAL] + found
        subject.note_compared(found, left)
    T = subject.sizes()["T"]
    for variant in variants:
        warm = subject.warm_state(rule, variant)
        flat = subject.inputs(rule)
        for start, state in (("empty", None), ("non-zero", warm)):
            whole = subject.run(rule, flat, variant, state=state)
            for cuts in _splits(T):
                joined = run_split(subject, rule, flat, variant, state, cuts)
                where = " and ".join(str(c) for c in cuts)
                tokens = "tokens" if len(cuts) > 1 else "token"
                I.compare(joined, whole, variant_tolerance(variant),
                          f"{variant.title}: {len(cuts) + 1} calls cut at {tokens} {where} differ from one "
                          f"call ({start} initial state)",
                          **_nums(subject, variant, split=where, reference="one call under the same strategy"))


def loss_and_grads(subject, rule, flat, variant, state, *, reference=False):
    """Gradients of a fixed random projection of (y, final state) w.r.t. every input and state
    tensor that takes part in gradients (`inputs.differentiable`: not an anchor position)."""
    out, named = forward_leaves(subject, rule, flat, variant, state, reference=reference)
    return out, grads_of(out, named, variant.reference_title if reference else variant.title)


def forward_leaves(subject, rule, flat, variant, state, *, reference=False):
    """One call on fresh leaves of ``flat`` and ``state``: (its outputs, {name: leaf} of every
    input and initial-state tensor that takes part in gradients)."""
    x = I.leaves(flat)
    s = I.leaves(state) if state is not None else None
    out = subject.run(rule, x, variant, state=s, reference=reference)
    named = {**{f"input {k}": t for k, t in x.items() if t.requires_grad},
             **({f"initial state[{k!r}]": t for k, t in s.items() if t.requires_grad} if s else {})}
    return out, named


def grads_of(out, named, title: str) -> dict:
    """The gradients of a fixed random projection of ``out`` w.r.t. ``named`` (None where none
    reaches). A result that carries no gradient at all is a `Failure` naming ``title``."""
    g = torch.Generator().manual_seed(11)
    loss = 0.0
    for key in sorted(out):
        w = torch.randn(out[key].shape, generator=g, dtype=torch.float64).to(out[key])
        loss = loss + (out[key] * w).sum()
    if not (isinstance(loss, torch.Tensor) and loss.requires_grad):
        raise Failure(f"no output carries a gradient under {title}: the strategy or a component "
                      "detaches its results (.detach(), torch.no_grad(), a tensor built anew)")
    grads = torch.autograd.grad(loss, list(named.values()), allow_unused=True)
    return dict(zip(named, grads))


@register(
    "check_gradients_finite",
    "a backward pass through outputs and final state reaches every input (q, k, v, every gate, "
    "every initial-state tensor but an anchor position) with finite gradients, under every strategy.",
    RULE_BEARING,
)
def check_gradients_finite(subject) -> None:
    subject.require_buildable()
    rule = subject.build_rule(dtype=config_dtype())
    for variant in subject.run_variants(rule):
        warm = subject.warm_state(rule, variant)
        _, grads = loss_and_grads(subject, rule, subject.inputs(rule), variant, warm)
        for name, g in grads.items():
            if g is None:
                raise Failure(f"no gradient reaches {name}", **_nums(subject, variant))
            if not torch.isfinite(g).all():
                raise Failure(f"the gradient of {name} has {int((~torch.isfinite(g)).sum())} non-finite entries",
                              **_nums(subject, variant))


@register(
    "check_gradients_match_reference",
    "gradients through every strategy equal the gradients through core:sequential on the same "
    "rule (the variants of check_strategies_match_sequential) for every input and initial-state "
    "tensor.",
    RULE_BEARING,
    applies=not_reference,
)
def check_gradients_match_reference(subject) -> None:
    subject.require_buildable()
    rule = subject.build_rule(dtype=config_dtype())
    for variant in _compared_variants(subject, rule):
        warm = subject.warm_state(rule, variant)
        flat = subject.inputs(rule)
        _, got = loss_and_grads(subject, rule, flat, variant, warm)
        _, want = loss_and_grads(subject, rule, flat, variant, warm, reference=True)
        compare_grads(got, want, f"gradients through {variant.title} differ from those through "
                      f"{variant.reference_title}", _nums(subject, variant))


def compare_grads(got: dict, want: dict, what: str, nums: dict) -> None:
    """Fail unless the same inputs get a gradient on both sides and the gradients agree to the
    "grad" tolerance (``what`` heads the message of a difference)."""
    for name in want:
        if (got[name] is None) != (want[name] is None):
            raise Failure(f"a gradient reaches {name} on one side only", **nums)
    keys = [k for k in want if want[k] is not None]
    I.compare({k: got[k] for k in keys}, {k: want[k] for k in keys}, CONFIG.tolerance("grad"), what, **nums)


TINY = {"B": 1, "T": 3, "H": 1, "Dk": 2, "Dv": 2}


@register(
    "check_gradcheck_float64",
    "torch.autograd.gradcheck passes in float64 on tiny sizes (B=1, T=3, H=1, Dk=Dv=2) for every "
    "strategy, w.r.t. every input and a non-zero initial state (an anchor position is held fixed): "
    "the backward is the derivative of the forward (fast mode: random projections of the Jacobian).",
    RULE_BEARING,
)
def check_gradcheck_float64(subject) -> None:
    subject.require_buildable()
    rule = subject.build_rule(dtype=torch.float64, sizes=TINY)
    for variant in subject.run_variants(rule):
        warm = subject.warm_state(rule, variant, B=1, dtype=torch.float64)
        flat = subject.inputs(rule, B=1, T=TINY["T"], dtype=torch.float64)
        fixed = {k: x for k, x in warm.items() if not I.differentiable(k, x)}
        varied = {k: x for k, x in warm.items() if k not in fixed}
        names = list(flat) + [f"state.{k}" for k in varied]
        tensors = [t.detach().clone().requires_grad_(True) for t in list(flat.values()) + list(varied.values())]
        n = len(flat)
        nums = {"strategy": variant.title, "dtype": "float64", "sizes": " ".join(f"{k}={v}" for k, v in TINY.items())}

        def run(*ts, reference=False):
            x = dict(zip(names[:n], ts[:n]))
            s = {**fixed, **{k[len("state."):]: t for k, t in zip(names[n:], ts[n:])}}
            return subject.run(rule, x, variant, state=s, reference=reference)

        # outputs that depend on the inputs under core:sequential must under the variant too: a
        # detached output would otherwise reach gradcheck as a bare shape error
        keys = _connected_outputs(run, tensors, variant, nums)

        def f(*ts):
            out = run(*ts)
            return tuple(out[k] for k in keys)

        try:
            torch.autograd.gradcheck(f, tensors, eps=1e-6, atol=1e-5, rtol=1e-3, fast_mode=True)
        except Exception as exc:  # noqa: BLE001 - GradcheckError or a crash in backward
            text = str(exc).strip().splitlines()
            raise Failure("gradcheck failed (the backward is not the derivative of the forward, or "
                          "it crashed): " + " ".join(text[:6])[:600], **nums)


def _label(key: str) -> str:
    return "the output y" if key == "y" else f"the final state[{key[len('state.'):]!r}]"


def _connected_outputs(run, tensors, variant, nums) -> list[str]:
    """The output keys gradcheck differentiates: those that carry a gradient under
    core:sequential. One of them that carries none under ``variant`` is a `Failure` naming it."""
    want = run(*tensors, reference=True)
    got = run(*tensors)
    keys = [k for k in sorted(want) if I.differentiable(k, want[k]) and want[k].requires_grad]
    cut = [k for k in keys if k in got and not got[k].requires_grad]
    if cut:
        raise Failure(
            f"{', '.join(_label(k) for k in cut)} {'carry' if len(cut) > 1 else 'carries'} no gradient "
            f"under {variant.title} ({'they do' if len(cut) > 1 else 'it does'} "
            "under core:sequential): the strategy or a component detaches it (.detach(), "
            "torch.no_grad(), .item(), a tensor built anew from values), so training cannot "
            "learn through it", **nums)
    return [k for k in keys if k in got]


@contextmanager
def _forced_backend(name):
    """Set ATLAS_BACKEND for the duration of a call (None: leave it alone)."""
    if name is None:
        yield
        return
    from atlas_core.backends import FORCE_ENV

    before = os.environ.get(FORCE_ENV)
    os.environ[FORCE_ENV] = name
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(FORCE_ENV, None)
        else:
            os.environ[FORCE_ENV] = before


REDUCTION_KEYS = {"name", "equals", "params", "gates", "atol", "summary"}


def _reductions(subject) -> list[dict]:
    declared = list(subject.component.extra.get("reductions", ()) if subject.component else ())
    return declared + [dict(r) for r in subject.case.reductions]


@register(
    "check_reductions",
    "every reduction a component declares holds: the rule with the declared params and constant "
    "gates computes what the 'equals' rule computes (outputs and the state entries both have), "
    "through core:sequential.",
    RULE_BEARING,
    applies=lambda s: s.component is not None and bool(_reductions(s)),
)
def check_reductions(subject) -> None:
    subject.require_buildable()
    dtype = config_dtype()
    for red in _reductions(subject):
        unknown = sorted(set(red) - REDUCTION_KEYS)
        if unknown or "name" not in red or "equals" not in red:
            raise Failure(f"reduction {red!r} is malformed: it needs 'name' and 'equals' and may have "
                          f"{sorted(REDUCTION_KEYS - {'name', 'equals'})}" + (f"; unknown keys {unknown}" if unknown else ""))
        name = red["name"]
        spec_a = subject.rule_spec(params=red.get("params"))
        equals = red["equals"]
        if isinstance(equals, str):
            spec_b = {"use": equals}
        elif "use" in equals and not isinstance(spec_a, dict):
            spec_b = dict(equals)
        else:
            spec_b = {**spec_a, **equals} if isinstance(spec_a, dict) else dict(equals)
        try:
            rule_a = subject.build_rule(dtype=dtype, spec=spec_a)
            rule_b = subject.build_rule(dtype=dtype, spec=spec_b)
        except Exception as exc:  # noqa: BLE001
            raise Failure(f"reduction {name!r}: a side does not build: {type(exc).__name__}: {exc}")
        flat_a = subject.inputs(rule_a)
        for gate, value in (red.get("gates") or {}).items():
            key = f"gates.{gate}"
            if key not in flat_a:
                raise Failure(f"reduction {name!r} sets gate {gate!r}, which the rule does not use")
            flat_a[key] = torch.full_like(flat_a[key], float(value))
        flat_b = subject.inputs(rule_b)
        flat_b = {k: flat_a.get(k, x) for k, x in flat_b.items()}
        out_a = subject.run(rule_a, flat_a)
        out_b = subject.run(rule_b, flat_b)
        common = ["y"] + sorted(k for k in out_a if k != "y" and k in out_b)
        tol = float(red.get("atol", CONFIG.tolerance("exact")))
        I.compare(out_a, out_b, tol, f"reduction {name!r} does not hold ({spec_a} vs {spec_b})", keys=common,
                  **_nums(subject, SEQUENTIAL))


@register(
    "check_backend_matches_reference",
    "a kernel backend that is available and accepts the call computes what its strategy's PyTorch "
    "code computes (backend = 'torch'): outputs, final state and gradients, in float32.",
    {"backend"},
)
def check_backend_matches_reference(subject) -> None:
    subject.require_buildable()
    comp = subject.component
    strategy = comp.extra.get("strategy")
    if not strategy:
        raise Failure(f"backend {comp.name} does not name the strategy it serves (extra strategy=...)")
    be = subject.registry.build("backend", comp.name)
    ok, why = be.is_available()
    if not ok:
        raise Skip(f"backend {comp.name} is not available here: {why}")
    scomp = subject.registry.get("strategy", strategy)
    fields = set(getattr(scomp.load_params(), "model_fields", {}) or {})
    base = {"use": scomp.name, **({"chunk_size": 3} if "chunk_size" in fields else {})}
    kernel = Variant(f"{scomp.name}[{comp.name}]", base)
    torch_ref = Variant(f"{scomp.name}[torch]", base)
    # kernels run in float32 (Triton's interpreter and most kernels have no float64 path)
    rule = subject.build_rule(dtype=torch.float32)
    flat = subject.inputs(rule, dtype=torch.float32)
    from atlas_core.errors import StrategyError

    def call(variant, which, fn):
        # force the backend through the strategy's `backend` param, or through ATLAS_BACKEND for
        # a strategy without one (the dispatcher reads it on every call)
        if "backend" in fields:
            return fn(Variant(variant.label, {**variant.spec, "backend": which}))
        with _forced_backend(which):
            return fn(variant)

    try:
        got = call(kernel, comp.name, lambda v: subject.run(rule, flat, v))
    except StrategyError as exc:
        raise Skip(f"backend {comp.name} refused the test call: {exc}")
    want = call(torch_ref, "torch", lambda v: subject.run(rule, flat, v))
    tol = TOLERANCES["float32"]
    I.compare(got, want, tol["chunked"], f"backend {comp.name} differs from the PyTorch code",
              strategy=kernel.label, dtype="float32", sizes=subject.sizes_text())
    warm = subject.warm_state(rule, dtype=torch.float32)
    _, g1 = call(kernel, comp.name, lambda v: loss_and_grads(subject, rule, flat, v, warm))
    _, g2 = call(torch_ref, "torch", lambda v: loss_and_grads(subject, rule, flat, v, warm))
    keys = [k for k in g2 if g2[k] is not None and g1[k] is not None]
    I.compare({k: g1[k] for k in keys}, {k: g2[k] for k in keys}, tol["grad"],
              f"gradients through backend {comp.name} differ from the PyTorch code",
              strategy=kernel.label, dtype="float32", sizes=subject.sizes_text())
