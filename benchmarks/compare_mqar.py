"""Train the MQAR comparison specs on one setting and print the table of docs/mqar_comparison.md.

    OMP_NUM_THREADS=1 python benchmarks/compare_mqar.py                        # suite "main"
    OMP_NUM_THREADS=1 python benchmarks/compare_mqar.py --suite small_state
    OMP_NUM_THREADS=1 python benchmarks/compare_mqar.py --suite zoo --seeds 0 1 2
    python benchmarks/compare_mqar.py --steps 1500 --task '{use = "mqar", num_pairs = 16, seq_len = 128}'

Every spec of a suite (``benchmarks/mqar/<suite>/``, in the order of `ORDER`; or the files named
with ``--spec``) trains with the same task,
steps, batch size and seed; the output is a Markdown table (rule, memory and state floats per
layer, parameters, held-out accuracy, eval loss, training time) followed by the command line and
the machine it ran on. Same as ``atlas compare SPEC... --markdown``, with the default spec list.
With ``--seeds`` each spec trains once per seed and the table gives each seed's accuracy, their
mean and their spread (max - min). fla's own models in the same harness:
``benchmarks/mqar/fla_models.py``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = ["delta", "delta_exact", "hebbian", "titans", "titans_tuned", "titans_tuned_exact", "titans_half",
         "titans_half_exact",
         # suite "zoo": the field's published rules (plugins/zoo) at their own defaults, then as
         # fla's layers and DeltaNet with the core's layer
         "linear_attention", "retnet", "simple_gla", "gla", "deltanet", "gated_deltanet", "kda",
         "longhorn", "gated_delta_product", "rwkv7", "deltanet_fla", "gated_deltanet_fla",
         "deltanet_core_layer"]


def seeds_table(by_seed: list[list[dict]], seeds: list[int]) -> str:
    """One row per spec: parameters, each seed's accuracy, their mean and spread (max - min)."""
    head = ("| spec | rule | params | " + " | ".join(f"seed {s}" for s in seeds)
            + " | mean | spread |\n|---|---|---:|" + "---:|" * (len(seeds) + 2))
    lines = [head]
    for rows in zip(*by_seed):
        acc = [r["accuracy"] for r in rows]
        lines.append(f"| {rows[0]['name']} | {rows[0]['rule']} | {rows[0]['params']:,} | "
                     + " | ".join(f"{a:.3f}" for a in acc)
                     + f" | {sum(acc) / len(acc):.3f} | {max(acc) - min(acc):.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", default="main", help="a folder of benchmarks/mqar/ (main, small_state, zoo)")
    ap.add_argument("--spec", action="append", help="a spec file (repeatable), instead of a suite")
    ap.add_argument("--task", help="inline TOML table of the task (default: the specs' own)")
    ap.add_argument("--steps", type=int, help="optimizer steps per spec (default: the specs' own)")
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, nargs="+", help="train each spec once per seed; mean and spread")
    ap.add_argument("--out", help="directory for the runs (default: a temporary one)")
    args = ap.parse_args(argv)

    import torch

    from atlas_core.train.compare import compare, markdown_table
    from atlas_core.train.inference import parse_task_option

    suite = HERE / "mqar" / args.suite
    if not args.spec and not suite.is_dir():
        ap.error(f"no suite {args.suite!r}: choose one of {sorted(p.name for p in (HERE / 'mqar').iterdir())}")
    specs = args.spec or [str(suite / f"{name}.toml") for name in ORDER
                          if (suite / f"{name}.toml").exists()]
    start = time.time()

    def progress(row):
        print(f"{row['name']}: {row['rule']} accuracy {row['accuracy']:.3f} "
              f"({row['time_s']:.0f} s)", file=sys.stderr, flush=True)

    if args.seeds:
        by_seed = [compare(specs, task=parse_task_option(args.task), steps=args.steps,
                           batch_size=args.batch_size, seed=s, out=args.out, on_row=progress)
                   for s in args.seeds]
        print(f"Task: `{by_seed[0][0]['task']}`, {by_seed[0][0]['steps']} steps, seeds "
              f"{', '.join(map(str, args.seeds))}.\n")
        print(seeds_table(by_seed, args.seeds))
    else:
        rows = compare(specs, task=parse_task_option(args.task), steps=args.steps,
                       batch_size=args.batch_size, seed=args.seed, out=args.out, on_row=progress)
        print(f"Task: `{rows[0]['task']}`, {rows[0]['steps']} steps, seed {args.seed}.\n")
        print(markdown_table(rows))
    threads = torch.get_num_threads()
    print(f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{threads} intra-op thread{'s' if threads != 1 else ''}; total {time.time() - start:.0f} s.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
