"""Running the benchmark: every subject of every case over the sequence lengths, side by side.

The subjects of a case (`default_subjects`): every registered strategy that accepts the case's
rule at the configured chunk size C (bundled ones, and third-party ones only when named in
``strategies`` or allowed by ``ATLAS_ALLOW_STRATEGIES``, as for ``"auto"``); a chunked strategy that refuses the rule at C (a per-token
rule, or a preset whose anchor C does not divide) runs the same rule rebuilt with ``anchor = C``
(an anchored subject, e.g. ``core:chunkwise(C=64) on anchor=64``); strategies declaring the
capability ``"exact"`` (``core:exact_chunk``) run at every chunk size of ``exact_chunks`` too. A
decode case runs a built model at each chunk size of ``decode_chunks``.

For each case the subjects that support it are first checked (`Subject.check`, float64, against
``core:sequential`` on the rule the subject runs); then for each length T, in increasing order:

- **time**: ``fwd`` is the forward under ``torch.no_grad()`` (inference); ``fwd+bwd`` is the forward
  with autograd plus ``backward`` of ``<y, dy>`` into every input and learned parameter (training).
  The fastest of ``1 + repeats`` runs (of two runs when the first took longer than
  `BenchConfig.slow_s`); wall-clock seconds (`device.clock`: ``time.perf_counter``, after
  ``torch.cuda.synchronize`` on a GPU). The minimum, because noise only adds time: on a virtual
  machine the first touch of fresh memory can cost several times the run itself, so a single cold
  run would misreport the memory-hungry subjects.
- **peak memory**: one more forward and one more fwd+bwd under `memory.peak_bytes`: on the CPU the
  peak of live tensor bytes created by the call (`memory.LiveTensorBytes`), on a GPU the CUDA
  allocator's ``max_memory_allocated`` minus what was allocated before the call (inputs and
  parameters excluded either way).
- **decoding** (decode cases): ``fwd ms`` is milliseconds per one-token ``model.step`` after a
  T-token prompt (`subjects.DecodeSubject.measure`); no fwd+bwd, no peak memory.

Device (`BenchConfig.device`: ``cpu``, ``cuda`` or ``auto``): inputs, gates, rules, layers and
models are built on it (inputs are drawn on the CPU from a fixed seed, then moved, so every device
sees the same numbers), and so is the equivalence check (`subjects.check_against_rule`). A subject
that cannot run on a GPU (its check raises there, while on the CPU it passes) is skipped with the
reason. ``threads`` is the CPU's intra-op thread count whatever the device.

Limits (each reported, nothing is extrapolated): ``core:sequential`` stops at ``seq_max``; a
subject whose fwd+bwd took longer than ``budget_s`` is not run at longer T; a subject that declares
a memory estimate above ``max_mem_gib`` is skipped at that T. The speedup of a row is ``fwd+bwd``
of ``core:sequential`` at the same T divided by the row's, reported only when both were measured
and the row's equivalence check passed (for an anchored subject: ``core:sequential`` on the
case's rule, whose loop costs the same at any anchor).
"""

from __future__ import annotations

import gc
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from .cases import DECODE_CHUNKS, DEFAULT_RULES, Case, get_case, make_inputs
from .device import DEVICES, clock, cpu_name, current_device, device_info, resolve_device, use_device
from .memory import peak_bytes
from .subjects import Check, DecodeSubject, LayerSubject, StrategySubject, Subject

MIB = 1024.0 ** 2
#: the defaults of ``seq_max`` and ``repeats`` by device type (`device_defaults`). On a GPU the
#: per-token loop of ``core:sequential`` is bound by kernel launches (hundreds per token), not by
#: arithmetic: it is timed up to T = 512 there, and each point is the faster of a first run and
#: one more (GPU timings vary less than a shared CPU's), so that the default sweep takes minutes.
DEVICE_DEFAULTS = {"cpu": {"seq_max": 4096, "repeats": 3}, "cuda": {"seq_max": 512, "repeats": 1}}


def device_defaults(device: Any) -> dict[str, int]:
    """``{"seq_max": ..., "repeats": ...}`` for ``device`` (`DEVICE_DEFAULTS`; the CPU's for
    anything but CUDA)."""
    return dict(DEVICE_DEFAULTS.get(torch.device(device).type, DEVICE_DEFAULTS["cpu"]))


@dataclass
class BenchConfig:
    rules: list[str] = field(default_factory=lambda: list(DEFAULT_RULES))
    lengths: list[int] = field(default_factory=lambda: [512, 1024, 2048, 4096, 8192, 16384])
    batch: int = 2
    heads: int = 4
    dim: int = 64  # Dk = Dv
    chunk: int = 64
    seq_max: int = 4096
    repeats: int = 3
    slow_s: float = 5.0
    budget_s: float = 120.0
    max_mem_gib: float = 6.0
    memory: bool = True
    check: bool = True
    threads: int | None = None
    compile: bool = False
    strategies: list[str] | None = None  # None: every registered strategy that supports the rule
    #: chunk sizes of the strategies declaring "exact" (besides ``chunk``): their best is a target
    exact_chunks: list[int] = field(default_factory=lambda: [16, 32, 64, 128])
    #: chunk sizes a decode case's model is built with, and the one-token steps timed after the prompt
    decode_chunks: list[int] = field(default_factory=lambda: list(DECODE_CHUNKS))
    decode_tokens: int = 16
    #: lengths at which Atlas (``atlas_muon:atlas``, its default strategy) runs one fwd+bwd under
    #: the peak-memory probe (`long_memory_rows`); empty: none
    atlas_long: list[int] = field(default_factory=list)
    #: where the benchmark runs: "cpu", "cuda" (or "cuda:N") or "auto" (CUDA when available);
    #: `run_bench` records the resolved one
    device: str = "cpu"

    @property
    def sizes(self) -> dict[str, int]:
        return {"B": self.batch, "H": self.heads, "Dk": self.dim, "Dv": self.dim}

    def validate(self) -> None:
        for name in ("batch", "heads", "dim", "chunk", "repeats", "seq_max", "decode_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        for name in ("exact_chunks", "decode_chunks"):
            if any(c < 1 for c in getattr(self, name)):
                raise ValueError(f"{name}={getattr(self, name)} must be positive chunk sizes")
        if not self.lengths or min(self.lengths) < 1:
            raise ValueError(f"lengths={self.lengths} must be positive sequence lengths")
        if any(T < 1 for T in self.atlas_long):
            raise ValueError(f"atlas_long={self.atlas_long} must be positive sequence lengths")
        if not isinstance(self.device, str) or not (self.device.strip().lower() in DEVICES
                                                    or self.device.strip().lower().startswith("cuda:")):
            raise ValueError(f"device={self.device!r} is not a benchmark device; choose one of "
                             f"{', '.join(DEVICES)}")
        for name in self.rules:
            get_case(name)


@dataclass
class Row:
    case: str
    subject: str
    group: str
    T: int
    status: str = "ok"  # "ok" | "skipped" | "error"
    fwd_ms: float | None = None
    train_ms: float | None = None
    runs: int = 0
    peak_fwd_mib: float | None = None
    peak_train_mib: float | None = None
    check: str = ""
    speedup: float | None = None  # fwd+bwd of core:sequential / this row's, same case and T
    note: str = ""


@dataclass
class BenchResult:
    config: dict[str, Any]
    machine: dict[str, Any]
    checks: list[dict[str, Any]]
    rows: list[Row]
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: Atlas rows' tokens/s next to the FLOP-count bound (`atlas_cost.cost_rows`), and the plain
    #: matmul rate the bound uses
    atlas_cost: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from .report import targets

        problems = list(self.problems)
        try:
            tg = targets(self)
        except Exception as exc:  # noqa: BLE001 - a report bug must not lose the measurements
            tg, problems = [], problems + [f"targets: {type(exc).__name__}: {exc}"]
        return {"config": self.config, "machine": self.machine, "checks": self.checks,
                "rows": [asdict(r) for r in self.rows], "targets": tg,
                "atlas_cost": self.atlas_cost, "problems": problems, "seconds": self.seconds}


def machine_info(device: Any = "cpu") -> dict[str, Any]:
    """The machine the figures come from: CPU, threads, versions, load, and the device the
    benchmark ran on (`device.device_info`: ``device``, ``device_name``; on a GPU its memory too)."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "load_avg_start": load, **device_info(device)}


def _accepting(make, case: Case, C: int) -> Subject | None:
    """``make(anchor)`` on the case's rule if it accepts it, else on the rule rebuilt with
    ``anchor = C`` (a composed rule) if that is accepted, else None."""
    sub = make(None)
    if sub.supports(case)[0]:
        return sub
    if C > 1 and _composed(case):
        sub = make(C)
        if sub.supports(case)[0]:
            return sub
    return None


def _is_composed(rule: Any) -> bool:
    from ..rule import Rule

    return isinstance(rule, Rule) and rule.composed


def _composed(case: Case) -> bool:
    try:
        return _is_composed(case.rule(2, 8, 8))
    except Exception:  # noqa: BLE001 - a rule that does not build is reported by its subjects
        return False


_noted: set[str] = set()


def _note_third_party(comp: Any) -> None:
    """Say once per process that a third-party strategy is left out of the default subjects."""
    if comp.name in _noted:
        return
    _noted.add(comp.name)
    from ..strategies.trust import ALLOW_ENV, describe

    print(f"[atlas] not benchmarked: {describe(comp)}; name it in --strategies or allow it with "
          f"{ALLOW_ENV}={comp.namespace}", file=sys.stderr, flush=True)


def default_subjects(config: BenchConfig, case: Case) -> list[Subject]:
    """The subjects of a case: every registered strategy that accepts the case's rule at the
    config's chunk size, or else the rule rebuilt with ``anchor = chunk`` (an anchored subject);
    "exact" strategies also at ``exact_chunks``. A layer case: the layer with core:chunkwise
    (anchored likewise). A decode case: a built model at each of ``decode_chunks``."""
    from ..host.manager import get_registry

    C = config.chunk
    if case.kind == "layer":
        sub = _accepting(lambda a: LayerSubject("core:chunkwise", {"chunk_size": C}, anchor=a), case, C)
        return [sub] if sub is not None else []
    if case.kind == "decode":
        subs = [DecodeSubject(c, config.decode_tokens) for c in dict.fromkeys(config.decode_chunks)]
        return [s for s in subs if s.supports(case)[0]]
    from ..strategies.trust import allowed, env_allowed

    reg = get_registry()
    out: list[Subject] = []
    allow = env_allowed()
    for comp in sorted(reg.all("strategy"), key=lambda c: (c.priority, c.name)):
        if config.strategies is not None and comp.name not in config.strategies:
            continue
        if config.strategies is None and not allowed(comp, allow):
            _note_third_party(comp)
            continue
        model = comp.load_params()
        fields = getattr(model, "model_fields", {}) if model is not None else {}
        if "chunk_size" not in fields:
            subject = StrategySubject(comp.name)
            if subject.supports(case)[0]:
                out.append(subject)
            continue
        sizes = [C]
        if "exact" in comp.capabilities:
            sizes = sorted({C, *config.exact_chunks})
        for size in sizes:
            sub = _accepting(lambda a, n=comp.name, c=size: StrategySubject(n, {"chunk_size": c}, anchor=a),
                             case, size)
            if sub is not None:
                out.append(sub)
    return out


def _timed(fn: Callable[[], Any], repeats: int, slow_s: float, device: Any = None) -> tuple[float, int]:
    """The fastest of ``1 + repeats`` runs (``1 + 1`` when the first took longer than ``slow_s``).
    The minimum, because the noise of a shared machine only ever adds time: other processes, and
    the first touch of memory pages a virtual machine has not backed yet (which can make one run of
    a memory-hungry subject several times slower than the next). Each run is timed by
    `device.clock` on ``device`` (on a GPU: synchronised before each reading)."""
    times = []
    for _ in range(1 + repeats):
        t0 = clock(device)
        fn()
        times.append(clock(device) - t0)
        if len(times) == 2 and times[0] > slow_s:
            break
    return min(times), len(times)


def _measure(subject: Subject, ctx: Any, case: Case, config: BenchConfig, T: int, row: Row,
             forward: Callable, with_train: bool = True) -> None:
    device = current_device()
    rule_gates = getattr(ctx, "gate_names", ()) if case.kind == "rule" else ()
    inp = make_inputs(case, rule_gates, T=T, device=device, **config.sizes).requires_grad_()
    params = [p for p in subject.parameters(ctx) if p.requires_grad]

    def fwd():
        with torch.no_grad():
            return forward(ctx, inp)

    def train():
        inp.zero_grad()
        for p in params:
            p.grad = None
        y = forward(ctx, inp)
        (y * inp.dy).sum().backward()

    t, row.runs = _timed(fwd, config.repeats, config.slow_s, device)
    row.fwd_ms = t * 1e3
    if with_train:
        gc.collect()
        t, row.runs = _timed(train, config.repeats, config.slow_s, device)
        row.train_ms = t * 1e3
    if config.memory:
        gc.collect()
        row.peak_fwd_mib = peak_bytes(fwd, device) / MIB
        if with_train:
            inp.zero_grad()
            for p in params:
                p.grad = None
            gc.collect()
            row.peak_train_mib = peak_bytes(train, device) / MIB
    inp.zero_grad()


def _compiled(subject: Subject) -> Callable:
    """``subject.forward`` through ``torch.compile`` (the `BenchConfig.compile` switch)."""
    return torch.compile(subject.forward, dynamic=False)


def run_bench(config: BenchConfig, subjects: list[Subject] | None = None,
              progress: Callable[[str], None] | None = None, problems: list[str] | None = None
              ) -> BenchResult:
    """Run the benchmark on ``config.device`` (ValueError when it is "cuda" without CUDA).
    ``subjects`` are added to each case's default strategies (baselines); ``progress`` receives
    one line per measurement."""
    config.validate()
    device = resolve_device(config.device)
    say = progress or (lambda msg: None)
    prev_threads = torch.get_num_threads()
    torch.set_flush_denormal(True)  # decayed memories must not reach slow subnormal arithmetic
    if config.threads:
        torch.set_num_threads(config.threads)
    started = time.perf_counter()
    machine = machine_info(device)
    rows: list[Row] = []
    checks: list[dict[str, Any]] = []
    cost: dict[str, Any] = {}
    try:
        with use_device(device):
            for name in config.rules:
                case = get_case(name)
                subs = default_subjects(config, case)
                for extra in subjects or []:
                    ok, why = extra.supports(case)
                    if ok:
                        subs.append(extra)
                case_rows = []
                for sub in subs:
                    check = sub.check(case) if config.check else Check("skipped", "--no-check")
                    not_here = _not_on_device(case, sub, check, device)
                    if not_here:
                        check = Check("skipped", not_here)
                    checks.append({"case": case.name, "subject": sub.name, **check.to_dict()})
                    say(f"[{case.name}] {sub.name}: check {check.status} {check.detail}")
                    if not_here:
                        case_rows.extend(Row(case.name, sub.name, sub.group, T, "skipped", check="skipped",
                                             note=not_here) for T in sorted(config.lengths))
                        continue
                    case_rows.extend(_run_subject(config, case, sub, check, say))
                rows.extend(case_rows)
                if name == "atlas":
                    cost = _atlas_cost(config, case, subs, case_rows, say)
            if config.atlas_long:
                rows.extend(long_memory_rows(config, say))
    finally:
        torch.set_num_threads(prev_threads)
        torch.set_flush_denormal(False)
    _speedups(rows)
    try:
        machine["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    cfg = asdict(config)
    cfg["device"] = str(device)  # the resolved one ("auto" -> "cuda" or "cpu")
    return BenchResult(cfg, machine, checks, rows, list(problems or []), time.perf_counter() - started,
                       atlas_cost=cost)


def _not_on_device(case: Case, sub: Subject, check: Check, device: torch.device) -> str:
    """Why ``sub`` does not run on a GPU ``device`` (empty: it does): its check raised there but
    passes on the CPU (a subject written for the CPU). A check that raises on the CPU as well, or
    that computes different numbers, stays a failure."""
    if device.type == "cpu" or check.status != "error":
        return ""
    with use_device("cpu"):
        cpu = sub.check(case)
    if cpu.status not in ("passed", "reference", "external"):
        return ""
    return f"not run on {device}: its check raised there ({check.detail[:200]}); on the CPU it {cpu.status}"


def _atlas_cost(config: BenchConfig, case: Case, subs: list[Subject], rows: list[Row], say) -> dict[str, Any]:
    """Atlas' tokens/s next to its FLOP-count bound (`atlas_cost`), the matmul rate measured now."""
    from . import atlas_cost

    sizes = config.sizes
    rule = case.rule(sizes["H"], sizes["Dk"], sizes["Dv"])
    chunks = {s.name: getattr(s, "chunk_size", None) for s in subs if getattr(s, "chunk_size", None)}
    C = max(chunks.values(), default=config.chunk)
    device = current_device()
    rate = atlas_cost.matmul_rate(rule, C, sizes["B"], sizes["H"], device=device)
    out = atlas_cost.cost_rows(rows, rule, lambda r: chunks.get(r.subject), sizes, rate)
    parts = atlas_cost.macs_per_token(rule, C)
    say(f"[atlas] plain matmul of Newton-Schulz's shapes on {device}: {rate / 1e9:.2f} G multiply-adds/s; "
        f"{sum(parts.values()) * sizes['H'] / 1e6:.1f} M multiply-adds per token (C={C})")
    return {"matmul_macs_per_s": rate, "chunk": C, "macs_per_head_token": parts, "rows": out,
            "device": str(device)}


def long_memory_rows(config: BenchConfig, say) -> list[Row]:
    """Atlas (``atlas_muon:atlas`` under its default strategy, ``"auto"``) at each length of
    ``config.atlas_long``: one fwd+bwd under the peak-memory probe, its time included (the probe
    adds a few microseconds per operator on the CPU). Rows of group ``"long"``. On the benchmark's
    device (`device.current_device`; on a GPU the peak is CUDA's allocator counter)."""
    device = current_device()
    case = get_case("atlas")
    sizes = config.sizes
    rule = case.rule(sizes["H"], sizes["Dk"], sizes["Dv"], device=device)
    name = f"auto: {rule.runner('auto').describe()}"
    rows = []
    for T in sorted(config.atlas_long):
        row = Row(case.name, name, "long", T, check="-", runs=1,
                  note="one fwd+bwd under the memory probe (its time included)")
        inp = make_inputs(case, rule.gate_names, T=T, device=device, **sizes).requires_grad_()

        def train():
            y, _ = rule(inp.q, inp.k, inp.v, gates=inp.gates, strategy="auto")
            (y * inp.dy).sum().backward()

        gc.collect()
        try:
            t0 = clock(device)
            row.peak_train_mib = peak_bytes(train, device) / MIB
            row.train_ms = (clock(device) - t0) * 1e3
        except Exception as exc:  # noqa: BLE001 - reported in the row
            row.status, row.note = "error", f"{type(exc).__name__}: {str(exc)[:200]}"
        for p in rule.parameters():
            p.grad = None
        rows.append(row)
        say(f"[atlas long] {name} T={T}: {row.status}, fwd+bwd "
            + (f"{row.train_ms / 1e3:.1f} s, peak {row.peak_train_mib:.0f} MiB" if row.train_ms else row.note))
    return rows


def _run_subject(config: BenchConfig, case: Case, sub: Subject, check: Check, say) -> list[Row]:
    rows = []
    device = current_device()
    try:
        ctx = sub.setup(case, config.sizes, torch.float32)
        if isinstance(ctx, torch.nn.Module):  # a baseline's module built on the CPU
            ctx = ctx.to(device)
    except Exception as exc:  # noqa: BLE001 - reported in the row
        if device.type != "cpu":  # a subject written for the CPU: skipped here, with the reason
            note = f"not run on {device}: setup failed: {type(exc).__name__}: {exc}"
            say(f"[{case.name}] {sub.name}: {note}")
            return [Row(case.name, sub.name, sub.group, T, "skipped", check=check.status, note=note)
                    for T in sorted(config.lengths)]
        return [Row(case.name, sub.name, sub.group, T, "error", check=check.status,
                    note=f"setup failed: {type(exc).__name__}: {exc}") for T in config.lengths]
    forward = _compiled(sub) if config.compile else sub.forward
    stop = ""
    last_peak: dict[str, tuple[int, float]] = {}  # "train" / "fwd" -> (T, GiB) last measured
    for T in sorted(config.lengths):
        row = Row(case.name, sub.name, sub.group, T, check=check.status)
        rows.append(row)
        is_seq = getattr(sub, "strategy", None) == "core:sequential" or getattr(sub, "is_sequential", False)
        limit = config.max_mem_gib * 1024 ** 3
        est_fwd = sub.memory_estimate(case, config.sizes, T, train=False)
        est_train = sub.memory_estimate(case, config.sizes, T, train=True)
        # memory grows at least linearly in T: a run whose last measured peak, scaled to this T,
        # exceeds the limit is not started (fwd+bwd and forward judged separately)
        scaled = {k: v[1] * T / v[0] for k, v in last_peak.items()}
        if scaled.get("train", 0.0) > config.max_mem_gib and est_train is None:
            est_train = int(scaled["train"] * 1024 ** 3)
        with_train = est_train is None or est_train <= limit
        if not stop and scaled.get("fwd", 0.0) > config.max_mem_gib:
            stop = (f"not run: the forward peak at T={last_peak['fwd'][0]} "
                    f"({last_peak['fwd'][1]:.1f} GiB), scaled to T={T}, exceeds --max-mem-gib "
                    f"{config.max_mem_gib}")
        if stop:
            row.status, row.note = "skipped", stop
        elif is_seq and T > config.seq_max:
            row.status, row.note = "skipped", f"sequential loops are capped at T <= {config.seq_max}"
        elif est_fwd is not None and est_fwd > limit:
            row.status = "skipped"
            row.note = f"needs about {est_fwd / 1024 ** 3:.1f} GiB > --max-mem-gib {config.max_mem_gib}"
        else:
            if not with_train:
                row.note = (f"forward only: fwd+bwd would need about {est_train / 1024 ** 3:.1f} GiB "
                            f"> --max-mem-gib {config.max_mem_gib}")
            try:
                if sub.measure is not None:  # its own measurement (decoding)
                    sub.measure(ctx, case, config, T, row)
                else:
                    _measure(sub, ctx, case, config, T, row, forward, with_train)
            except Exception as exc:  # noqa: BLE001 - one failure must not end the benchmark
                row.status, row.note = "error", f"{type(exc).__name__}: {str(exc)[:200]}"
            if row.train_ms is not None and row.train_ms > config.budget_s * 1e3:
                stop = f"not run: fwd+bwd at T={T} took {row.train_ms / 1e3:.0f} s > budget {config.budget_s:.0f} s"
            for key, mib in (("train", row.peak_train_mib), ("fwd", row.peak_fwd_mib)):
                if mib:
                    last_peak[key] = (T, mib / 1024)
        gc.collect()
        if sub.group == "decode" and row.fwd_ms:
            say(f"[{case.name}] {sub.name} T={T}: {row.status} {row.fwd_ms:.2f} ms per decoded token")
            continue
        say(f"[{case.name}] {sub.name} T={T}: {row.status} "
            + (f"fwd {row.fwd_ms:.1f} ms, fwd+bwd " + (f"{row.train_ms:.1f} ms" if row.train_ms else "not run")
               if row.fwd_ms else row.note)
            + (f", peak fwd {row.peak_fwd_mib:.1f} MiB" if row.peak_fwd_mib is not None else "")
            + (f", peak fwd+bwd {row.peak_train_mib:.1f} MiB" if row.peak_train_mib is not None else ""))
    return rows


def _speedups(rows: list[Row]) -> None:
    seq = {(r.case, r.T): r.train_ms for r in rows
           if r.subject == "core:sequential" and r.status == "ok" and r.train_ms}
    for r in rows:
        if r.status != "ok" or r.subject == "core:sequential" or not r.train_ms:
            continue
        base = seq.get((r.case, r.T))
        if base is None:
            continue
        if r.check not in ("passed",):
            r.note = (r.note + "; " if r.note else "") + f"no speedup reported: equivalence check {r.check}"
            continue
        r.speedup = base / r.train_ms
