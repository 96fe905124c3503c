"""Time and peak memory of every strategy of each rule against sequence length, with baselines.

    python benchmarks/bench_strategies.py                           # the sweep of docs/benchmarks.md
    python benchmarks/bench_strategies.py --rules delta,titans --lengths 512,1024,2048
    python benchmarks/bench_strategies.py --markdown out.md --json out.json --plot out.png

The same run as ``atlas bench`` (library: `atlas_core.bench`), printed as a plain table, with the
baselines of ``benchmarks/baselines/`` (the seed 000 algorithm; fla-core's chunked gated delta rule
and titans-pytorch's NeuralMemory when the packages are installed). Rules: titans (linear memory,
momentum), titans_deep (titans:mlp), omega16 (OmegaNet, window 16), atlas (Muon on titans:mlp),
atlas_linear, delta (gd + l2 + decay), titans_deep_layer (the memory layer against
titans-pytorch), decode (one-token model.step calls of a built model at chunk sizes 16 and 1024),
moneta (MIRAS' Moneta, a nonlinear retention: core:chunkwise's stepped form against the loop;
not in the default sweep).
A chunked strategy that refuses a rule at the chunk size C runs the same rule with anchor = C.
Before timing, every subject passes a float64 equivalence check: it equals core:sequential on the
rule it runs; a failure is marked and gets no speedup. Nothing is extrapolated: a point that was
not run says why.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    from atlas_core.bench import BenchConfig, plot, run_bench, to_markdown, to_text
    from atlas_core.bench.report import atlas_cost_lines
    from atlas_core.bench.subjects import load_baselines

    d = BenchConfig()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rules", default=",".join(d.rules))
    ap.add_argument("--lengths", default=",".join(map(str, d.lengths)))
    ap.add_argument("--batch", type=int, default=d.batch)
    ap.add_argument("--heads", type=int, default=d.heads)
    ap.add_argument("--dim", type=int, default=d.dim, help="Dk = Dv per head")
    ap.add_argument("--chunk", type=int, default=d.chunk)
    ap.add_argument("--exact-chunks", default=",".join(map(str, d.exact_chunks)),
                    help="more chunk sizes for the strategies declaring 'exact'")
    ap.add_argument("--decode-chunks", default=",".join(map(str, d.decode_chunks)))
    ap.add_argument("--decode-tokens", type=int, default=d.decode_tokens)
    ap.add_argument("--atlas-long", default="", help="also run Atlas once at these lengths "
                    "(fwd+bwd time and peak memory), e.g. 4096,16384")
    ap.add_argument("--strategies", default=None, help="only these registered strategies")
    ap.add_argument("--seq-max", type=int, default=d.seq_max, help="longest T for core:sequential")
    ap.add_argument("--repeats", type=int, default=d.repeats)
    ap.add_argument("--budget", type=float, default=d.budget_s, help="seconds per fwd+bwd before "
                    "a subject stops growing T")
    ap.add_argument("--max-mem-gib", type=float, default=d.max_mem_gib)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--compile", action="store_true", help="torch.compile every subject")
    ap.add_argument("--plot", type=Path, default=None, help="PNG path")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None, help="write the table as Markdown")
    args = ap.parse_args(argv)

    cfg = BenchConfig(
        rules=args.rules.split(","), lengths=[int(t) for t in args.lengths.split(",")],
        batch=args.batch, heads=args.heads, dim=args.dim, chunk=args.chunk, seq_max=args.seq_max,
        repeats=args.repeats, budget_s=args.budget, max_mem_gib=args.max_mem_gib,
        threads=args.threads, memory=not args.no_memory, compile=args.compile,
        strategies=args.strategies.split(",") if args.strategies else None,
        exact_chunks=[int(c) for c in args.exact_chunks.split(",") if c],
        decode_chunks=[int(c) for c in args.decode_chunks.split(",") if c],
        decode_tokens=args.decode_tokens,
        atlas_long=[int(t) for t in args.atlas_long.split(",") if t],
    )
    subjects, problems = ([], []) if args.no_baselines else load_baselines(HERE / "baselines", cfg)
    result = run_bench(cfg, subjects, progress=lambda m: print(m, file=sys.stderr, flush=True),
                       problems=problems)
    data = result.to_dict()
    print(to_text(result))
    print()
    for c in data["checks"]:
        print(f"check [{c['case']}] {c['subject']}: {c['status']} {c['detail']}")
    print()
    measured = [t for t in data["targets"] if t["ok"] is not None]
    for t in measured:
        print(f"{'MET' if t['ok'] else 'NOT MET':8} {t['target']}: {t['measured']}")
    if len(measured) < len(data["targets"]):
        print(f"{len(data['targets']) - len(measured)} of {len(data['targets'])} targets not "
              "evaluated: their rules or lengths were not in this run (see docs/benchmarks.md)")
    for line in atlas_cost_lines(data):
        print(line)
    for p in problems:
        print(f"baseline not loaded: {p}")
    m = data["machine"]
    print(f"\n{m['cpu']}, {m['cores']} cores, {m['torch_threads']} torch thread(s), torch {m['torch']}, "
          f"load average {m['load_avg_start']} -> {m.get('load_avg_end')}, {data['seconds']:.0f} s")
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        plot(result, args.plot)
    if args.json:
        args.json.write_text(json.dumps(data, indent=2, default=str) + "\n")
    if args.markdown:
        args.markdown.write_text(to_markdown(result) + "\n")
    return 1 if any(c["status"] in ("FAILED", "error") for c in data["checks"]) else 0


if __name__ == "__main__":
    sys.exit(main())
