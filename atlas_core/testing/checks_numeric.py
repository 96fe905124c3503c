"""Checks on what a rule computes: shapes and dtypes, causality, determinism, bf16, stability.

Every check runs the rule through ``core:sequential`` and through each other strategy that
supports it (for a strategy under test: that strategy), on tiny random calls (docs/plugins.md
lists the sizes). Numbers in failure messages come from `inputs.compare`.
"""

from __future__ import annotations

import math

import torch

from . import inputs as I
from .config import CONFIG
from .results import RULE_BEARING, Failure, register


def _dtype():
    return getattr(torch, CONFIG.dtype)


def _nums(subject, variant, dtype=None, B=None, T=None):
    return {
        "strategy": variant.title,
        "dtype": str(dtype or _dtype()).replace("torch.", ""),
        "sizes": subject.sizes_text(B, T),
    }


@register(
    "check_shapes_and_dtypes",
    "y has the inputs' batch and time axes ([B, T, H, Dv] for a composed rule) and dtype; the "
    "state maps names to tensors with the batch first, keeps its keys and shapes from call to call, "
    "and is accepted back; T = 1 and B = 1 work.",
    RULE_BEARING,
)
def check_shapes_and_dtypes(subject) -> None:
    subject.require_buildable()
    from atlas_core.errors import SpecError

    builds = []
    for dtype in (torch.float32, torch.float64):
        builds.append((dtype, subject.build_rule(dtype=dtype)))
    try:  # a distinct value size catches transposed axes; some structures need Dv == Dphi
        s = subject.sizes()
        builds.append((torch.float64, subject.build_rule(dtype=torch.float64, sizes={"Dv": s["Dk"] + 1})))
    except SpecError:
        pass
    for dtype, rule in builds:
        for variant in subject.run_variants(rule):
            for B, T in ((subject.sizes()["B"], subject.sizes()["T"]), (1, 1)):
                flat = subject.inputs(rule, B=B, T=T, dtype=dtype)
                nums = _nums(subject, variant, dtype, B, T)
                if subject.composed(rule):
                    nums["sizes"] += f" (Dphi={rule.structure.d_in}, Dv={rule.structure.d_out})"
                out = subject.run(rule, flat, variant)
                y = out["y"]
                if subject.composed(rule):
                    want = (B, T, rule.structure.heads, rule.structure.d_out)
                    if tuple(y.shape) != want:
                        raise Failure(f"y has shape {tuple(y.shape)}, expected [B, T, H, Dv] = {list(want)}", **nums)
                elif tuple(y.shape[:2]) != (B, T):
                    raise Failure(f"y has shape {tuple(y.shape)}, expected [B, T, ...] with B={B}, T={T}", **nums)
                if y.dtype != dtype:
                    raise Failure(f"y has dtype {y.dtype}, expected the inputs' dtype {dtype}", **nums)
                if y.device.type != torch.device(CONFIG.device).type:
                    raise Failure(f"y is on {y.device}, the inputs on {CONFIG.device}", **nums)
                state = I.state_of(out)
                for key, x in state.items():
                    if x.dim() == 0 or x.shape[0] != B:
                        raise Failure(f"state[{key!r}] has shape {tuple(x.shape)}; the batch ({B}) must come first", **nums)
                    if not x.is_floating_point():
                        raise Failure(f"state[{key!r}] has dtype {x.dtype}, not a floating-point dtype", **nums)
                again = I.state_of(subject.run(rule, flat, variant, state=state))
                if set(again) != set(state):
                    raise Failure(f"the state's keys changed between calls: {sorted(state)} -> {sorted(again)}", **nums)
                for key in state:
                    if again[key].shape != state[key].shape:
                        raise Failure(f"state[{key!r}] changed shape between calls: {tuple(state[key].shape)} -> "
                                      f"{tuple(again[key].shape)}", **nums)


@register(
    "check_causal",
    "the output at token t depends only on tokens <= t: replacing every input from token t0 on "
    "leaves y[:, :t0] unchanged, under every strategy.",
    RULE_BEARING,
)
def check_causal(subject) -> None:
    subject.require_buildable()
    rule = subject.build_rule(dtype=_dtype())
    T = subject.sizes()["T"]
    tol = CONFIG.tolerance("causal")
    for variant in subject.run_variants(rule):
        flat = subject.inputs(rule, seed=1)
        other = subject.inputs(rule, seed=2)
        base = subject.run(rule, flat, variant)["y"]
        for t0 in sorted({1, T // 2, T - 1}):
            changed = subject.run(rule, I.splice_future(flat, other, t0), variant)["y"]
            I.compare({"y[:, :t0]": changed[:, :t0]}, {"y[:, :t0]": base[:, :t0]}, tol,
                      f"outputs before token t0={t0} changed when tokens t >= {t0} were replaced",
                      **_nums(subject, variant))


@register(
    "check_deterministic_seed",
    "built twice under the same seed a component has the same parameters, and the same call gives "
    "bit-identical outputs and state (twice on one object, and on the two objects).",
    RULE_BEARING,
)
def check_deterministic_seed(subject) -> None:
    subject.require_buildable()
    one = subject.build_rule(seed=7, dtype=_dtype())
    two = subject.build_rule(seed=7, dtype=_dtype())
    if isinstance(one, torch.nn.Module):
        a, b = one.state_dict(), two.state_dict()
        if set(a) != set(b):
            raise Failure(f"two builds have different parameters: {sorted(a)} vs {sorted(b)}")
        for key in a:
            if not torch.equal(a[key], b[key]):
                raise Failure(f"parameter {key!r} differs between two builds under seed 7")
    for variant in subject.run_variants(one):
        flat = subject.inputs(one)
        first = subject.run(one, flat, variant)
        for label, rule in (("the same object", one), ("a second build", two)):
            again = subject.run(rule, flat, variant)
            I.compare(again, first, 0.0, f"a repeated call on {label} gave different results",
                      **_nums(subject, variant))


@register(
    "check_bf16_close_to_fp32",
    "bfloat16 inputs give bfloat16 outputs close to the float32 result on the same (rounded) "
    "inputs: max |diff| <= 0.02 * max(1, max |y_fp32|).",
    RULE_BEARING,
)
def check_bf16_close_to_fp32(subject) -> None:
    subject.require_buildable()
    rule = subject.build_rule(dtype=torch.float32)
    for variant in subject.run_variants(rule):
        flat16 = I.cast(subject.inputs(rule, dtype=torch.float32), torch.bfloat16)
        flat32 = I.cast(flat16, torch.float32)
        nums = _nums(subject, variant, torch.bfloat16)
        try:
            low = subject.run(rule, flat16, variant)
        except (TypeError, RuntimeError, ValueError) as exc:
            raise Failure(f"the rule does not run on bfloat16 inputs: {type(exc).__name__}: {exc}", **nums)
        high = subject.run(rule, flat32, variant)
        if low["y"].dtype != torch.bfloat16:
            raise Failure(f"bfloat16 inputs gave y of dtype {low['y'].dtype}", **nums)
        I.compare({"y": low["y"]}, {"y": high["y"]}, 0.02, "bfloat16 output is far from float32", **nums)


STABLE_T = 512


@register(
    "check_long_sequence_stable",
    f"over {STABLE_T} tokens with the memory layer's default gates (alpha ~ 0.95, eta ~ 0.88, "
    "theta ~ 0.01, gamma ~ 0.95; unit-norm q and k) outputs and state stay finite, and the state "
    "grows at most linearly: max |state| after T tokens <= 3 * max |state| after T/2 + 1e-3 "
    "(chunked strategies at chunk size 3, on the rule rebuilt with anchor = 6 when they refuse it "
    "as given).",
    RULE_BEARING,
)
def check_long_sequence_stable(subject) -> None:
    subject.require_buildable()
    rule = subject.build_rule(dtype=torch.float32)
    half = STABLE_T // 2
    for variant in subject.run_variants(rule):
        nums = _nums(subject, variant, torch.float32, B=1, T=STABLE_T)
        flat = subject.inputs(rule, B=1, T=STABLE_T, dtype=torch.float32, seed=3, mode="default")
        first = subject.run(rule, I.time_slice(flat, 0, half), variant)
        second = subject.run(rule, I.time_slice(flat, half, None), variant, state=I.state_of(first))
        for label, out in (("first half", first), ("second half", second)):
            for key, x in out.items():
                if not torch.isfinite(x).all():
                    bad = int((~torch.isfinite(x)).sum())
                    raise Failure(f"{key} has {bad} non-finite entries in the {label}", **nums)
        # values only: an anchor position is a counter (inputs.DISCRETE_STATE)
        s1 = max((I.max_abs(x) for k, x in I.state_of(first).items() if I.differentiable(k, x)), default=0.0)
        s2 = max((I.max_abs(x) for k, x in I.state_of(second).items() if I.differentiable(k, x)), default=0.0)
        if not math.isfinite(s2) or s2 > 3 * s1 + 1e-3:
            raise Failure(
                f"the state grows faster than linearly: max |state| = {s1:.3g} after {half} tokens, "
                f"{s2:.3g} after {STABLE_T}", **nums,
            )
