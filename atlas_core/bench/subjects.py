"""What the benchmark runs: a `Subject` is one way of computing a case (a strategy, a layer, a
baseline, a decoding model), with its own float64 equivalence check.

- `StrategySubject`: ``rule(q, k, v, gates, strategy=...)`` for one registered strategy, on the
  case's rule or on the case's rule rebuilt with ``anchor = A`` (`StrategySubject.anchor`: an
  *anchored* subject, e.g. ``core:chunkwise(C=64) on anchor=64`` for a per-token rule that
  ``core:chunkwise`` refuses at C = 64);
- `LayerSubject`: the project's `MemoryLayer` around the case's rule (``x: [B, T, d_model]``);
- `DecodeSubject`: a built ``core:lm`` model decoding one token per ``model.step`` call;
- baselines (``benchmarks/baselines/``) subclass `Subject` and are loaded by `load_baselines`.

The equivalence gate (`check_against_rule`) has one reference: ``core:sequential`` on the same
rule — the rule the subject runs, anchored or not (a strategy never changes the function). Before
any timing the subject runs a small float64 problem, as one call and as two calls cut inside a
chunk with the state carried, and its outputs and final state are compared with
``core:sequential`` on that rule. A subject that differs is marked FAILED, and the benchmark
reports no speedup for it.

The check runs on the benchmark's device (`device.current_device`). On a GPU it runs twice: in
float64 (the algorithm, tolerance `CHECK_TOL`), and in float32, the dtype that is timed and that
the GPU kernel backends serve (they refuse float64, so only this run reaches them), against the
same float64 reference with the float32 tolerance of `CHECK_TOLS`. TF32 is switched off inside the
check (``torch.backends.cuda.matmul`` and ``cudnn``): the tolerance is for IEEE float32.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from .cases import Case, Inputs, make_inputs
from .device import current_device, is_cuda

CHECK_TOL = 1e-8  # float64: max |diff| <= CHECK_TOL * (1 + max |reference|)
#: the gate's tolerance per dtype the subject runs in (the reference is always float64); the
#: float32 check runs on a GPU only (`check_dtypes`)
CHECK_TOLS = {torch.float64: CHECK_TOL, torch.float32: 1e-4}
CHECK_SIZES = dict(B=1, H=2, Dk=8, Dv=8)


def check_dtypes(device=None) -> tuple[torch.dtype, ...]:
    """The dtypes a subject's equivalence check runs in on ``device`` (None: the benchmark's):
    float64 on the CPU; float64 and float32 (what is timed) on a GPU."""
    device = current_device() if device is None else device
    return (torch.float64, torch.float32) if is_cuda(device) else (torch.float64,)


@contextlib.contextmanager
def _ieee_float32(device):
    """TF32 off for the block on a CUDA device (the float32 tolerance is for IEEE float32)."""
    if not is_cuda(device):
        yield
        return
    prev = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev


def _on(device) -> str:
    """"; on cuda:0" for a check that ran on a GPU (empty on the CPU: the detail is unchanged)."""
    return f"; on {device}, float32 too" if is_cuda(device) else ""


@dataclass
class Check:
    status: str  # "passed" | "FAILED" | "reference" | "external" | "error" | "skipped"
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
    group: str = "strategy"  # "strategy" | "layer" | "baseline" | "decode"
    #: the strategy's chunk size (None: not chunked)
    chunk_size: int | None = None
    #: the anchor of the rule the subject runs (None: the case's rule as specified)
    anchor: int | None = None

    def supports(self, case: Case) -> tuple[bool, str]:
        return True, ""

    def setup(self, case: Case, sizes: dict[str, int], dtype: torch.dtype) -> Any:
        """Build what the forward needs (a rule, a module) for these sizes, on the benchmark's
        device (`device.current_device`; the runner moves a module built elsewhere there);
        called once per case."""
        return case.rule(sizes["H"], sizes["Dk"], sizes["Dv"], dtype, anchor=self.anchor,
                         device=current_device())

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

    #: a subject with its own measurement (`DecodeSubject`) implements
    #: ``measure(ctx, case, config, T, row) -> None`` instead of the forward / fwd+bwd timing
    measure = None


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


def on_rule(anchor: int | None) -> str:
    """" on the rule with anchor = A" (empty for the case's own rule)."""
    return "" if anchor is None else f" on the rule with anchor = {anchor}"


def check_against_rule(case: Case, run: Callable[..., tuple], chunk_size: int | None, *,
                       anchor: int | None = None, split: bool = True, T: int | None = None) -> Check:
    """The float64 gate: the subject equals ``core:sequential`` on the rule it runs.

    ``run(rule, inputs, strategy, state=None)`` returns ``(y, state)`` computed by the subject
    (strategy None: the subject's own setting; else that strategy's value), continuing from
    ``state``. The rule is the case's, rebuilt with ``anchor`` when given. With ``split`` the
    subject also runs the problem as two calls cut inside a chunk (at C + C // 2 + 1 tokens),
    the second given the first's state; both must equal one call of ``core:sequential``.

    Rule and inputs are on the benchmark's device; the subject runs in each dtype of
    `check_dtypes` (float64; on a GPU float32 too), always against the float64 reference, within
    that dtype's `CHECK_TOLS`. ``max_err`` is the float64 one."""
    device = current_device()
    dtypes = check_dtypes(device)
    C = chunk_size or 1
    T = T or min(max(2 * C + 5, 37), 160)
    ref = "core:sequential" + on_rule(anchor)
    cut = C + C // 2 + 1
    try:
        with torch.no_grad(), _ieee_float32(device):
            seq = None
            errs: dict[torch.dtype, float] = {}
            for dtype in dtypes:
                rule = case.rule(CHECK_SIZES["H"], CHECK_SIZES["Dk"], CHECK_SIZES["Dv"], dtype,
                                 anchor=anchor, device=device)
                inp = make_inputs(case, rule.gate_names, T=T, dtype=dtype, seed=1, device=device,
                                  **CHECK_SIZES)
                tol, name = CHECK_TOLS[dtype], ("" if dtype == torch.float64 else f" in {_short(dtype)}")
                got = run(rule, inp, None)
                if seq is None:  # the first dtype is float64: the reference
                    seq = run(rule, inp, "core:sequential")
                    if not all(torch.isfinite(t).all() for t in [seq[0], *seq[1].values()]):
                        return Check("error", f"{ref} gave non-finite values on the check inputs")
                err = _max_rel_err(got, seq)
                if err > tol:
                    return Check("FAILED", f"differs from {ref}{name} by {err:.2e} (T={T}"
                                 f"{'' if not name else f', tolerance {tol:.0e}'})", errs.get(torch.float64, err))
                if split and 0 < cut < T:
                    a = run(rule, _time_slice(inp, 0, cut), None)
                    b = run(rule, _time_slice(inp, cut, None), None, state=a[1])
                    joined = (torch.cat([a[0], b[0]], dim=1), b[1])
                    err2 = _max_rel_err(joined, seq)
                    if err2 > tol:
                        return Check("FAILED", f"one call equals {ref}{name}, but two calls cut at "
                                     f"token {cut} differ from it by {err2:.2e} (T={T})",
                                     errs.get(torch.float64, err2))
                    err = max(err, err2)
                errs[dtype] = err
            detail = f"equals {ref} (T={T}"
            if split and 0 < cut < T:
                detail += f"; also as two calls cut at token {cut}"
            detail += _on(device)
            if len(errs) > 1:
                detail += ": " + ", ".join(f"{_short(d)} {e:.1e} <= {CHECK_TOLS[d]:.0e}" for d, e in errs.items())
            return Check("passed", detail + ")", errs[torch.float64])
    except Exception as exc:  # noqa: BLE001 - a crash is a failed check, reported with its reason
        return Check("error", f"{type(exc).__name__}: {exc}")


def _short(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _time_slice(inp: Inputs, start: int, stop: int | None) -> Inputs:
    cut = lambda t: None if t is None else t[:, start:stop]  # noqa: E731
    return Inputs(q=cut(inp.q), k=cut(inp.k), v=cut(inp.v),
                  gates={n: cut(g) for n, g in inp.gates.items()}, x=cut(inp.x), dy=cut(inp.dy))


def _strategy_value(name: str, params: dict[str, Any]) -> Any:
    return {"use": name, **params} if params else name


class StrategySubject(Subject):
    """``rule(q, k, v, gates, strategy=...)`` with one strategy (a registered name + params, or a
    Strategy object), on the case's rule or (``anchor``) on it rebuilt with that anchor."""

    group = "strategy"

    def __init__(self, strategy: Any, params: dict[str, Any] | None = None, label: str | None = None,
                 anchor: int | None = None):
        self.strategy = strategy
        self.params = dict(params or {})
        self.chunk_size = self.params.get("chunk_size") or getattr(strategy, "chunk_size", None)
        self.anchor = anchor
        base = strategy if isinstance(strategy, str) else getattr(strategy, "name", type(strategy).__name__)
        self.strategy_name = base
        self.name = label or ((f"{base}(C={self.chunk_size})" if self.chunk_size else base)
                              + (f" on anchor={anchor}" if anchor is not None else ""))

    def _value(self, **override):
        if not isinstance(self.strategy, str):
            return self.strategy
        return _strategy_value(self.strategy, {**self.params, **override})

    def supports(self, case: Case) -> tuple[bool, str]:
        if case.kind != "rule":
            return False, f"a rule-level strategy; this case is a {case.kind}"
        from ..strategies.base import build_strategy

        try:
            rule = case.rule(CHECK_SIZES["H"], CHECK_SIZES["Dk"], CHECK_SIZES["Dv"], anchor=self.anchor)
            strat = self._value()
            strat = build_strategy(strat) if not hasattr(strat, "supports") else strat
        except Exception as exc:  # noqa: BLE001
            return False, str(exc)
        return strat.supports(rule)

    def forward(self, rule, inp: Inputs) -> torch.Tensor:
        y, _ = rule(inp.q, inp.k, inp.v, gates=inp.gates, strategy=self._value())
        return y

    def check(self, case: Case) -> Check:
        if self.strategy == "core:sequential" and self.anchor is None:
            return Check("reference", "the readable loop itself (tested against hand-written loops)")

        def run(rule, inp, strategy, state=None):
            value = self._value() if strategy is None else strategy
            return rule(inp.q, inp.k, inp.v, gates=inp.gates, state=state, strategy=value)

        return check_against_rule(case, run, self.chunk_size, anchor=self.anchor)


class LayerSubject(Subject):
    """The project's `MemoryLayer` (projections, short conv, q/k norm, gates, output norm and gate)
    around the case's rule (rebuilt with ``anchor`` when given), with a given strategy."""

    group = "layer"

    def __init__(self, strategy: Any, params: dict[str, Any] | None = None, label: str | None = None,
                 anchor: int | None = None):
        self.inner = StrategySubject(strategy, params, anchor=anchor)
        self.chunk_size = self.inner.chunk_size
        self.anchor = anchor
        self.name = label or f"atlas MemoryLayer, {self.inner.name}"

    def supports(self, case: Case) -> tuple[bool, str]:
        if case.kind != "layer":
            return False, "a layer subject; this case is a rule"
        from ..strategies.base import build_strategy

        try:
            rule = case.rule(CHECK_SIZES["H"], CHECK_SIZES["Dk"], CHECK_SIZES["Dv"], anchor=self.anchor)
            return build_strategy(self.inner._value()).supports(rule)
        except Exception as exc:  # noqa: BLE001
            return False, str(exc)

    def _layer(self, case: Case, sizes: dict[str, int], dtype, strategy):
        from ..layer import LayerParams, MemoryLayer
        from ..rule import build_rule

        with torch.random.fork_rng():
            torch.manual_seed(0)
            rule = build_rule(case.rule_spec(self.anchor))
            layer = MemoryLayer(sizes["H"] * sizes["Dk"], sizes["H"], rule,
                                LayerParams(d_key=sizes["Dk"], d_value=sizes["Dv"], **case.layer),
                                strategy=strategy)
        return layer.to(dtype)

    def setup(self, case: Case, sizes: dict[str, int], dtype: torch.dtype):
        return self._layer(case, sizes, dtype, self.inner._value()).to(current_device())

    def forward(self, layer, inp: Inputs) -> torch.Tensor:
        return layer(inp.x)[0]

    def check(self, case: Case) -> Check:
        # one layer per dtype of the check (same weights: built in float64 on the CPU, then cast)
        layers = {d: self._layer(case, CHECK_SIZES, torch.float64, self.inner._value()).to(d).to(current_device())
                  for d in check_dtypes()}

        def run(rule_unused, inp, strategy, state=None):
            # the layer runs its bound runner: swap it for core:sequential on the same rule
            layer = layers[inp.x.dtype]
            own = layer.runner
            layer.runner = own if strategy is None else layer.rule.runner(strategy)
            try:
                return layer(inp.x, state)
            finally:
                layer.runner = own

        return check_against_rule(case, run, self.chunk_size, anchor=self.anchor)


class DecodeSubject(Subject):
    """Decoding with a built model (``core:lm`` around a decode case's rule, strategy
    ``core:chunkwise`` at ``chunk_size``): after a T-token prompt (one `model.step` call, not
    timed), `decode_tokens` one-token `model.step` calls with the carried state, fed fixed tokens
    (the same for every chunk size). The row's ``fwd ms`` is milliseconds per decoded token (the
    fastest of the runs of the whole loop, divided by its tokens); there is no fwd+bwd."""

    group = "decode"

    def __init__(self, chunk_size: int, decode_tokens: int = 16, strategy: str = "core:chunkwise"):
        self.chunk_size = chunk_size
        self.decode_tokens = decode_tokens
        self.strategy = strategy
        self.name = f"model.step, {strategy}(C={chunk_size})"

    def _value(self, chunk_size: int | None = None):
        return {"use": self.strategy, "chunk_size": chunk_size or self.chunk_size}

    def supports(self, case: Case) -> tuple[bool, str]:
        if case.kind != "decode":
            return False, "a decode subject; this case is not decoding"
        from ..strategies.base import build_strategy

        try:
            rule = case.rule(CHECK_SIZES["H"], CHECK_SIZES["Dk"], CHECK_SIZES["Dv"])
            return build_strategy(self._value()).supports(rule)
        except Exception as exc:  # noqa: BLE001
            return False, str(exc)

    def build(self, case: Case, sizes: dict[str, int], dtype, strategy=None):
        from ..model import build_model

        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = build_model(case.model_spec(sizes, strategy or self._value()))
        return model.to(dtype).eval()

    def setup(self, case: Case, sizes: dict[str, int], dtype: torch.dtype):
        return self.build(case, sizes, dtype).to(current_device())

    def tokens(self, B: int, n: int) -> torch.Tensor:
        """The decoded tokens: fixed ids (seed 7), whatever the chunk size and the logits."""
        from .cases import DECODE_MODEL

        g = torch.Generator().manual_seed(7)
        return torch.randint(0, DECODE_MODEL["vocab_size"], (B, n), generator=g)

    def decode(self, model, prompt: torch.Tensor, tokens: torch.Tensor):
        """Logits of the prompt's last token and of every decoded token ``[B, 1 + n, vocab]``."""
        with torch.no_grad():
            logits, state = model.step(prompt, None)
            out = [logits[:, -1:]]
            for i in range(tokens.shape[1]):
                logits, state = model.step(tokens[:, i : i + 1], state)
                out.append(logits)
        return torch.cat(out, dim=1)

    def parameters(self, ctx: Any) -> list[torch.Tensor]:
        return []

    def measure(self, model, case: Case, config: Any, T: int, row: Any) -> None:
        from .device import clock

        device = current_device()
        inp = make_inputs(case, (), T=T, device=device, **config.sizes)
        toks = self.tokens(config.batch, self.decode_tokens).to(device)
        with torch.no_grad():
            _, start = model.step(inp.x, None)  # the prompt: not timed

            def loop():
                state = start
                for i in range(toks.shape[1]):
                    _, state = model.step(toks[:, i : i + 1], state)

            best, runs = float("inf"), 0
            for _ in range(1 + config.repeats):
                t0 = clock(device)
                loop()
                best = min(best, clock(device) - t0)
                runs += 1
        row.fwd_ms = best / toks.shape[1] * 1e3
        row.runs = runs
        row.note = f"fwd ms = ms per one-token model.step ({toks.shape[1]} tokens after a {T}-token prompt)"

    def check(self, case: Case) -> Check:
        """Every logit of the prompt and of the decoded tokens equals the same model (same
        weights) run by core:sequential, float64 (a strategy never changes the function); on a
        GPU the model in float32 too, against the same float64 reference (`CHECK_TOLS`)."""
        device = current_device()
        try:
            sizes = dict(CHECK_SIZES)
            seq = self.build(case, sizes, torch.float64, strategy="core:sequential").to(device)
            T = min(max(2 * self.chunk_size + 5, 37), 160)
            prompt = make_inputs(case, (), T=T, device=device, **sizes).x
            toks = self.tokens(sizes["B"], 8).to(device)
            with _ieee_float32(device):
                want = self.decode(seq, prompt, toks)
                errs = {}
                for dtype in check_dtypes(device):
                    model = self.build(case, sizes, torch.float64).to(dtype).to(device)
                    got = self.decode(model, prompt, toks).double()
                    err = (got - want).abs().max().item() / (1.0 + want.abs().max().item())
                    if not err <= CHECK_TOLS[dtype]:
                        name = "" if dtype == torch.float64 else f" in {_short(dtype)}"
                        return Check("FAILED", f"decoded logits{name} differ from the model under "
                                     f"core:sequential by {err:.2e} (prompt T={T}, 8 one-token steps)",
                                     errs.get(torch.float64, err))
                    errs[dtype] = err
            detail = f"prompt T={T}, 8 one-token steps{_on(device)}"
            if len(errs) > 1:
                detail += ": " + ", ".join(f"{_short(d)} {e:.1e} <= {CHECK_TOLS[d]:.0e}" for d, e in errs.items())
            return Check("passed", f"decoded logits equal the model under core:sequential ({detail})",
                         errs[torch.float64])
        except Exception as exc:  # noqa: BLE001
            return Check("error", f"{type(exc).__name__}: {exc}")


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
