"""``atlas bench``: time and peak memory of every strategy of each rule against sequence length.

    atlas bench                                    # the full sweep of docs/benchmarks.md
    atlas bench --rules delta,titans --lengths 512,1024 --plot bench.png
    atlas bench --format json > bench.json

Each rule runs every registered strategy that accepts it side by side (third-party ones only when
named in --strategies or allowed by ATLAS_ALLOW_STRATEGIES; a chunked strategy that
refuses the rule at the chunk size C runs the same rule with ``anchor = C``), plus the baselines of
a source checkout (``benchmarks/baselines``: the seed 000 algorithm, fla-core's chunked gated
delta rule and titans-pytorch's NeuralMemory when installed); the ``decode`` case times one-token
``model.step`` calls of a built model at two chunk sizes. Before timing, each subject passes a
float64 equivalence check against ``core:sequential`` on the rule it runs; a failure is marked and
gets no speedup. Peak memory is the peak of live tensor bytes (`atlas_core.bench.memory`), which
works on the CPU. ``--device cuda`` (or ``auto``) runs everything on a GPU: inputs, rules, layers,
models and the equivalence check (there also in float32, the dtype that is timed), every timed
region synchronised, peak memory from CUDA's ``max_memory_allocated``; the report names the GPU. The library lives in `atlas_core.bench`; ``benchmarks/bench_strategies.py`` is
the same run as a script. The targets whose rows were measured are printed after the table
(the others are counted in one line; ``--format json`` lists every target, ``ok`` null when
not evaluated). With the ``atlas`` rule, its tokens/s are printed next to the bound its
multiply-add count and a plain matmul of the same shapes, timed in the same run, give
(`atlas_core.bench.atlas_cost`); ``--atlas-long`` adds one fwd+bwd of Atlas under its default
strategy at longer lengths, with its peak memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from .common import Failed, FormatOption, emit, examples, log, out_console

EPILOG = examples(
    "atlas bench --rules delta,titans --lengths 512,1024,2048",
    "atlas bench --device cuda --json bench.json",
    "atlas bench --lengths 512,1024 --plot docs/img/bench.png --json bench.json",
    "atlas bench --rules atlas --lengths 256 --atlas-long 4096,16384",
)


def _ints(text: str, name: str) -> list[int]:
    """Comma-separated positive integers (at least one)."""
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a comma-separated list of integers", param_hint=name)
    if not values or min(values) < 1:
        raise typer.BadParameter(f"{text!r}: give positive integers, e.g. 512,1024", param_hint=name)
    return values


def _human(data: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from atlas_core.bench.report import COLUMNS, format_cell, atlas_cost_lines

    con = out_console()
    m = data["machine"]
    gpu = m.get("device", "cpu") != "cpu"
    peak = "CUDA max_memory_allocated" if gpu else "live tensor bytes"
    where = f" on {m.get('device_name')}" if gpu else ""
    table = Table(title=f"atlas bench{where} (fwd: no_grad forward; fwd+bwd: training step; peak: {peak})")
    for _, head in COLUMNS:
        table.add_column(head, overflow="fold")
    for r in data["rows"]:
        cells = [format_cell(k, r[k]) for k, _ in COLUMNS]
        if r["check"] not in ("passed", "reference", "external", "skipped"):
            cells[3] = f"[red]{cells[3]}[/]"
        table.add_row(*[c if i == 3 else escape(c) for i, c in enumerate(cells)])
    con.print(table)
    for c in data["checks"]:
        if c["status"] not in ("passed", "reference"):
            con.print(f"check {c['status']}: {escape('[' + c['case'] + ']')} {escape(c['subject'])}: "
                      f"{escape(c['detail'])}")
    measured = [t for t in data["targets"] if t["ok"] is not None]
    if measured:
        con.print("targets:")
    for t in measured:
        mark = "[green]met[/]" if t["ok"] else "[red]not met[/]"
        con.print(f"  {mark}  {escape(t['target'])}: {escape(t['measured'])}")
    skipped = len(data["targets"]) - len(measured)
    if skipped:  # a target needs rows at the sizes it names (docs/benchmarks.md); JSON lists all
        con.print(f"{skipped} of {len(data['targets'])} targets not evaluated: their rules or "
                  "lengths were not in this run (see docs/benchmarks.md)", markup=False,
                  highlight=False)
    for line in atlas_cost_lines(data):
        con.print(line, markup=False, highlight=False)
    for p in data["problems"]:
        con.print(f"[yellow]baseline not loaded[/]: {escape(p)}")
    device = f"device {m.get('device')} ({m.get('device_name')}); host " if gpu else ""
    con.print(f"{device}{m['cpu']}, {m['torch_threads']} thread(s), torch {m['torch']}, load average "
              f"{m.get('load_avg_start')} -> {m.get('load_avg_end')}, {data['seconds']:.0f} s",
              markup=False, highlight=False)


def bench(
    ctx: typer.Context,
    rules: Annotated[str, typer.Option(help="comma-separated rules: titans, titans_deep, omega16, "
                                       "atlas, atlas_linear, delta, titans_deep_layer, decode")] =
        "titans,titans_deep,omega16,atlas,delta,titans_deep_layer,decode",
    lengths: Annotated[str, typer.Option(help="comma-separated sequence lengths T")] =
        "512,1024,2048,4096,8192,16384",
    batch: Annotated[int, typer.Option(min=1, help="batch size B")] = 2,
    heads: Annotated[int, typer.Option(min=1, help="heads H")] = 4,
    dim: Annotated[int, typer.Option(min=1, help="per-head key and value size (Dk = Dv)")] = 64,
    chunk: Annotated[int, typer.Option(min=1, help="chunk size C of the chunked strategies (a rule "
                                       "they refuse at C runs with anchor = C)")] = 64,
    exact_chunks: Annotated[str, typer.Option(help="more chunk sizes for the strategies declaring "
                                              "'exact' (core:exact_chunk)")] = "16,32,64,128",
    decode_chunks: Annotated[str, typer.Option(help="chunk sizes of the decode case's model")] = "16,1024",
    decode_tokens: Annotated[int, typer.Option(min=1, help="one-token steps timed per decode row")] = 16,
    atlas_long: Annotated[Optional[str], typer.Option(
        help="also run Atlas (atlas_muon:atlas, default strategy) once at these longer lengths, "
        "e.g. 4096,16384: fwd+bwd time and peak memory (slow: minutes per length on a CPU)")] = None,
    strategies: Annotated[Optional[str], typer.Option(
        help="only these registered strategies (comma-separated names); default: all that apply")] = None,
    seq_max: Annotated[Optional[int], typer.Option(
        min=1, help="longest T for core:sequential (default: 4096 on the CPU, 512 on a GPU)",
        show_default=False)] = None,
    repeats: Annotated[Optional[int], typer.Option(
        min=1, help="timed runs per point after the first, the fastest reported (default: 3 on the "
        "CPU, 1 on a GPU)", show_default=False)] = None,
    budget: Annotated[float, typer.Option(help="seconds: a subject slower than this per fwd+bwd "
                                          "is not run at longer T")] = 120.0,
    max_mem_gib: Annotated[float, typer.Option(help="skip runs a subject expects to need more")] = 6.0,
    device: Annotated[str, typer.Option(
        help="where to run: cpu, cuda (a GPU; every timed region synchronised, peak memory from "
        "torch.cuda.max_memory_allocated) or auto (cuda when available, else cpu)")] = "cpu",
    threads: Annotated[Optional[int], typer.Option(min=1, help="torch intra-op threads (the CPU "
                                                   "side, whatever --device)")] = None,
    memory: Annotated[bool, typer.Option("--memory/--no-memory", help="measure peak memory")] = True,
    check: Annotated[bool, typer.Option("--check/--no-check", help="run the equivalence gate")] = True,
    baselines: Annotated[Optional[Path], typer.Option(
        help="folder of baseline modules (default: benchmarks/baselines of the source checkout)")] = None,
    no_baselines: Annotated[bool, typer.Option("--no-baselines", help="strategies only")] = False,
    compile: Annotated[bool, typer.Option("--compile", help="run each subject through torch.compile")] = False,
    plot: Annotated[Optional[Path], typer.Option(help="write the PNG plot here")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="also write the JSON here")] = None,
    fmt: FormatOption = None,
) -> None:
    """Time and peak memory against sequence length, every strategy side by side
    (`atlas bench inference`: decoding and prefill at published sizes)."""
    if ctx.invoked_subcommand is not None:
        return
    from atlas_core.bench import BenchConfig, run_bench
    from atlas_core.bench.device import DeviceError, resolve_device
    from atlas_core.bench.runner import device_defaults
    from atlas_core.bench.report import plot as make_plot
    from atlas_core.bench.subjects import default_baselines_dir, load_baselines

    try:
        dev = resolve_device(device, option="--device")
    except DeviceError as exc:  # a usage error: exit 2, one message naming the option and the fix
        raise typer.BadParameter(f"{exc.value!r}: {exc.reason}; {exc.fix}", param_hint="--device") from None
    cfg = BenchConfig(
        rules=[r.strip() for r in rules.split(",") if r.strip()], lengths=_ints(lengths, "--lengths"),
        batch=batch, heads=heads, dim=dim, chunk=chunk,
        seq_max=seq_max if seq_max is not None else device_defaults(dev)["seq_max"],
        repeats=repeats if repeats is not None else device_defaults(dev)["repeats"],
        budget_s=budget, max_mem_gib=max_mem_gib, memory=memory, check=check, threads=threads,
        compile=compile, exact_chunks=_ints(exact_chunks, "--exact-chunks"),
        decode_chunks=_ints(decode_chunks, "--decode-chunks"), decode_tokens=decode_tokens,
        atlas_long=_ints(atlas_long, "--atlas-long") if atlas_long else [],
        strategies=[s.strip() for s in strategies.split(",")] if strategies else None,
        device=str(dev),
    )
    cfg.validate()
    subjects, problems = [], []
    if not no_baselines:
        subjects, problems = load_baselines(baselines or default_baselines_dir(), cfg)
    result = run_bench(cfg, subjects, progress=log, problems=problems)
    data = result.to_dict()
    if plot is not None:
        plot.parent.mkdir(parents=True, exist_ok=True)
        make_plot(result, plot)
        log(f"plot written to {plot}")
    if json_out is not None:
        import json

        json_out.write_text(json.dumps(data, indent=2, default=str) + "\n")
        log(f"JSON written to {json_out}")
    emit(data, fmt, _human)
    failed = [c for c in data["checks"] if c["status"] in ("FAILED", "error")]
    if failed:
        log(f"{len(failed)} subject(s) failed the equivalence check: no speedup reported for them")
        raise Failed()


def register(app: typer.Typer) -> None:
    """Mount ``atlas bench`` (and ``atlas bench inference``) on the root app."""
    from .bench_inference import register as register_inference

    group = typer.Typer(invoke_without_command=True, no_args_is_help=False)
    group.callback(invoke_without_command=True, epilog=EPILOG)(bench)
    register_inference(group)
    app.add_typer(group, name="bench")
