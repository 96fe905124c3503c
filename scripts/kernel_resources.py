"""Compile the cuda plugin's Triton kernels ahead of time for a GPU target (no GPU needed) and
report, per configuration, shared memory, registers, stack and spills (docs/kernels.md
"Resources on sm_90").

    python scripts/kernel_resources.py                          # sm_90 boundary configurations
    python scripts/kernel_resources.py --matrix full --arch 80  # every D x C x window x dtype, A100
    python scripts/kernel_resources.py --json docs/kernel_resources_sm90.json --markdown

``--json`` merges the rows into a results file (rows keyed by kernel source, options, target and
Triton version; tests/cuda_backend/test_compile.py reuses matching rows instead of compiling
again). ``--markdown`` prints the table for docs/kernels.md. Large tiles take minutes each to
compile (Triton caches them in ~/.triton/cache).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.pop("TRITON_INTERPRET", None)  # ahead-of-time compilation needs real jit functions


def markdown(rows: list[dict]) -> str:
    out = ["| kernel configuration | warps | shared B | of limit | registers | stack B | spill st/ld B |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        share = f"{100 * r['shared'] / r['limit']:.0f}%" if r.get("limit") else "-"
        out.append(f"| {r['label']} | {r['num_warps']} | {r['shared']:,} | {share} | {r['registers']} | "
                   f"{r['stack']:,} | {r['spill_stores']:,} / {r['spill_loads']:,} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability: 90 (H100), 80 (A100), ...")
    ap.add_argument("--matrix", choices=["boundary", "full"], default="boundary")
    ap.add_argument("--only", default="", help="keep configurations whose label contains this text")
    ap.add_argument("--json", default=None, help="merge the rows into this results file")
    ap.add_argument("--markdown", action="store_true", help="print the docs/kernels.md table")
    args = ap.parse_args(argv)

    from atlas_plugins.cuda_backend import compile_check as cc

    cfgs = cc.boundary_configs() if args.matrix == "boundary" else cc.kernel_configs()
    cfgs = [c for c in cfgs if args.only in c.label]
    known = cc.load_rows(args.json)
    rows = []
    for cfg in cfgs:
        t0 = time.time()
        r = cc.row(cfg, args.arch, known)
        r.pop("recorded", None)
        rows.append(r)
        over = r["limit"] is not None and r["shared"] > r["limit"]
        print(f"{r['label']}: shared {r['shared']:,} B{' OVER THE LIMIT' if over else ''}, "
              f"{r['registers']} registers, stack {r['stack']} B, spills {r['spill_stores']}/"
              f"{r['spill_loads']} B ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
        if args.json:  # after every row: a long run keeps what it measured
            known[r["key"]] = r
            with open(args.json, "w") as f:
                json.dump(sorted(known.values(), key=lambda x: x["label"]), f, indent=1)
                f.write("\n")
    if args.markdown:
        print(markdown(rows))
    return 1 if any(r["limit"] is not None and r["shared"] > r["limit"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
