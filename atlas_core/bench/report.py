"""Reading a `BenchResult`: the performance targets, a plain or Markdown table, and a PNG plot."""

from __future__ import annotations

from typing import Any

COLUMNS = [
    ("case", "rule"), ("subject", "subject"), ("T", "T"), ("check", "check"),
    ("fwd_ms", "fwd ms"), ("train_ms", "fwd+bwd ms"), ("speedup", "speedup"),
    ("peak_fwd_mib", "peak fwd MiB"), ("peak_train_mib", "peak fwd+bwd MiB"), ("note", "note"),
]


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "speedup":
        return f"{value:.1f}x"
    if isinstance(value, float):
        return f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    return str(value)


def table_rows(result) -> list[list[str]]:
    return [[_fmt(k, getattr(r, k)) for k, _ in COLUMNS] for r in result.rows]


def to_text(result) -> str:
    head = [h for _, h in COLUMNS]
    body = table_rows(result)
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [line(head), line(["-" * w for w in widths])] + [line(b) for b in body]
    return "\n".join(out)


def to_markdown(result) -> str:
    head = [h for _, h in COLUMNS]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for b in table_rows(result):
        out.append("| " + " | ".join(c.replace("|", "/") for c in b) + " |")
    return "\n".join(out)


def _find(result, case: str, prefix: str, T: int):
    for r in result.rows:
        if r.case == case and r.subject.startswith(prefix) and r.T == T and r.status == "ok":
            return r
    return None


def _lengths(result, case: str, prefix: str) -> list[int]:
    return sorted({r.T for r in result.rows if r.case == case and r.subject.startswith(prefix)
                   and r.status == "ok"})


def targets(result) -> list[dict[str, Any]]:
    """The issue's five performance targets, evaluated on the measured rows (``ok`` is None when
    the rows needed were not measured in this run)."""
    out = []

    def add(target, ok, measured):
        out.append({"target": target, "ok": ok, "measured": measured})

    cw = _find(result, "titans", "core:chunkwise", 4096)
    t = "titans, T=4096, fwd+bwd: core:chunkwise >= 20x faster than core:sequential"
    if cw is not None and cw.speedup is not None and cw.train_ms:
        add(t, cw.speedup >= 20, f"{cw.speedup:.1f}x")
    else:
        add(t, None, "not measured (needs core:sequential and core:chunkwise at T=4096)")

    t = "titans, T=8192: peak memory of core:chunkwise <= 1/10 of the seed 000 algorithm"
    cw, sd = _find(result, "titans", "core:chunkwise", 8192), _find(result, "titans", "seed000", 8192)
    if cw is not None and sd is not None:
        if cw.peak_train_mib is not None and sd.peak_train_mib is not None:
            kind, a, b = "fwd+bwd", cw.peak_train_mib, sd.peak_train_mib
        else:
            kind, a, b = "fwd", cw.peak_fwd_mib, sd.peak_fwd_mib
        if a is not None and b:
            add(t, a <= b / 10, f"{kind}: {a:.1f} MiB vs {b:.1f} MiB = 1/{b / max(a, 1e-9):.0f}")
        else:
            add(t, None, "peak memory not measured")
    else:
        add(t, None, "not measured (needs core:chunkwise and seed000 at T=8192)")

    t = "titans, core:chunkwise: fwd+bwd time per token at T=16384 within 1.3x of T=1024"
    a, b = _find(result, "titans", "core:chunkwise", 1024), _find(result, "titans", "core:chunkwise", 16384)
    if a is not None and b is not None and a.train_ms and b.train_ms:
        ratio = (b.train_ms / 16384) / (a.train_ms / 1024)
        add(t, ratio <= 1.3, f"{ratio:.2f}x (fwd only: {(b.fwd_ms / 16384) / (a.fwd_ms / 1024):.2f}x)")
    else:
        add(t, None, "not measured (needs T=1024 and T=16384)")

    t = (f"deep memory layer, chunk {result.config.get('chunk')}: atlas (titans:mlp) faster than "
         "titans-pytorch NeuralMemory, fwd+bwd")
    ratios, fwd = [], []
    for T in _lengths(result, "titans_deep_layer", "atlas MemoryLayer"):
        ours = _find(result, "titans_deep_layer", "atlas MemoryLayer", T)
        theirs = _find(result, "titans_deep_layer", "titans-pytorch", T)
        if ours is not None and theirs is not None and ours.train_ms and theirs.train_ms:
            ratios.append((T, theirs.train_ms / ours.train_ms))
        if ours is not None and theirs is not None and ours.fwd_ms and theirs.fwd_ms:
            fwd.append((T, theirs.fwd_ms / ours.fwd_ms))
    if ratios:
        add(t, all(r > 1 for _, r in ratios),
            "fwd+bwd " + ", ".join(f"T={T}: {r:.3f}x" for T, r in ratios)
            + "; fwd " + ", ".join(f"T={T}: {r:.3f}x" for T, r in fwd) + " (titans-pytorch time / ours)")
    else:
        add(t, None, "not measured (titans-pytorch not installed or the layer case not run)")

    t = "delta rule, T >= 4096: core:exact_chunk faster than core:chunkwise while exact"
    ratios, exact = [], True
    for T in _lengths(result, "delta", "core:exact_chunk"):
        ec, cw = _find(result, "delta", "core:exact_chunk", T), _find(result, "delta", "core:chunkwise", T)
        if T >= 4096 and ec is not None and cw is not None and ec.train_ms and cw.train_ms:
            ratios.append((T, cw.train_ms / ec.train_ms, cw.fwd_ms / ec.fwd_ms))
            exact = exact and ec.check == "passed"
    checks = [c for c in result.checks if c["case"] == "delta" and c["subject"].startswith("core:exact_chunk")]
    exact = exact and bool(checks) and checks[0]["detail"].startswith("exact")
    if ratios:
        add(t, exact and all(r > 1 for _, r, _ in ratios),
            ", ".join(f"T={T}: {r:.2f}x (fwd {f:.2f}x)" for T, r, f in ratios)
            + f" (chunkwise time / exact_chunk); exact: {exact}")
    else:
        add(t, None, "not measured (needs the delta rule at T >= 4096)")
    return out


def plot(result, path) -> None:
    """One row per case: fwd+bwd time and peak fwd+bwd memory against T (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r.case for r in result.rows))
    fig, axes = plt.subplots(len(cases), 2, figsize=(11, 3.2 * max(len(cases), 1)), squeeze=False)
    for i, case in enumerate(cases):
        subjects = list(dict.fromkeys(r.subject for r in result.rows if r.case == case))
        for sub in subjects:
            pts = [r for r in result.rows if r.case == case and r.subject == sub and r.status == "ok"]
            if not pts:
                continue
            style = "--" if any(p.check not in ("passed", "reference") for p in pts) else "-"
            Ts = [p.T for p in pts]
            axes[i][0].plot(Ts, [p.train_ms for p in pts], style, marker="o", label=sub)
            mem = [(p.T, p.peak_train_mib) for p in pts if p.peak_train_mib is not None]
            if mem:
                axes[i][1].plot(*zip(*mem), style, marker="o", label=sub)
        for j, ylabel in enumerate(["fwd+bwd time (ms)", "peak fwd+bwd memory (MiB)"]):
            ax = axes[i][j]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length T")
            ax.set_ylabel(ylabel)
            ax.set_title(case, fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
        axes[i][0].legend(fontsize=7)
    cfg = result.config
    fig.suptitle(f"B={cfg['batch']}, H={cfg['heads']}, Dk=Dv={cfg['dim']}, float32, "
                 f"{result.machine.get('torch_threads')} thread(s), {result.machine.get('cpu')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
