"""Time and peak memory of the MRU scans against the loop, forward and forward + backward.

    python benchmarks/bench_mru.py                      # T = 256 .. 16384, d = 4, CPU
    python benchmarks/bench_mru.py --lengths 1024,4096 --d 8 --heads 2

Strategies (all exact; see docs/mru.md):
    loop            the readable reference, H_t = H_{t-1} X_t in a Python loop, plain autograd
    sequential      the same loop, with the closed-form backward (a reverse loop)
    hillis_steele   parallel scan, ceil(log2 T) levels, ~T log2 T products
    brent_kung      parallel scan, <= 2 log2 T levels, < 2T products
    sklansky        parallel scan, ceil(log2 T) levels, ~T/2 log2 T products

Each (strategy, T) runs in a fresh subprocess so that its peak memory can be read from the
process's resident-set high-water mark (``ru_maxrss``): the number reported is how far one
forward + backward pushes the peak above what the process held just before (inputs allocated,
kernels warmed up on a short sequence). Times are the median of ``--repeats`` runs. On a CPU the
"levels" column is the sequential depth a parallel machine would see; a CPU runs each level's
products with a few threads, so the scans win by replacing T Python-level steps with about
log2 T large batched matrix products.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

STRATEGIES = ["loop", "sequential", "hillis_steele", "brent_kung", "sklansky"]


def _rss_mib() -> float:
    # Linux reports ru_maxrss in KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_one(strategy: str, T: int, d: int, heads: int, batch: int, repeats: int) -> dict:
    """Measure one configuration in this process (called in a child process)."""
    import torch

    from atlas_plugins.mru.cumprod import cumprod
    from atlas_plugins.mru.scans import count_steps

    gen = torch.Generator().manual_seed(0)
    A = torch.randn(batch, heads, T, d, d, generator=gen)
    X = torch.linalg.matrix_exp(A - A.mT)  # rotations: the product stays O(1) at any T
    G = torch.randn(batch, heads, T, d, d, generator=gen)
    X.requires_grad_()
    warm = X.detach()[:, :, :8].clone().requires_grad_()
    cumprod(warm, None, strategy).backward(G[:, :, :8])  # load kernels, allocator warm-up
    del A

    base = _rss_mib()
    H = cumprod(X, None, strategy)
    H.backward(G)
    peak = _rss_mib() - base
    del H
    X.grad = None

    def timed(fn) -> float:
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return statistics.median(out) * 1e3

    def fwd():
        with torch.no_grad():
            cumprod(X.detach(), None, strategy)

    def fwd_bwd():
        X.grad = None
        cumprod(X, None, strategy).backward(G)

    levels = T if strategy == "loop" else count_steps(strategy, T)[0]
    return {
        "strategy": strategy, "T": T, "levels": levels,
        "fwd_ms": timed(fwd), "fwd_bwd_ms": timed(fwd_bwd), "peak_mib": peak,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="256,1024,4096,16384", help="comma-separated T values")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--d", type=int, default=4, help="matrix order d_o")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads per run")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:  # one configuration, JSON on stdout
        import torch

        torch.set_num_threads(args.threads)
        strategy, T = args.child.split(",")
        print(json.dumps(run_one(strategy, int(T), args.d, args.heads, args.batch, args.repeats)))
        return

    import torch

    lengths = [int(t) for t in args.lengths.split(",")]
    strategies = [s for s in args.strategies.split(",") if s]
    for s in strategies:
        if s not in STRATEGIES:
            ap.error(f"unknown strategy {s!r}; choose from {', '.join(STRATEGIES)}")
    print(f"# MRU scans: B={args.batch}, heads={args.heads}, d={args.d}, float32, CPU "
          f"({platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{args.threads} thread(s)), median of {args.repeats}")
    header = f"{'T':>6}  {'strategy':<14} {'levels':>6}  {'fwd ms':>9}  {'fwd+bwd ms':>10}  {'peak MiB':>8}"
    print(header)
    print("-" * len(header))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    for T in lengths:
        for s in strategies:
            cmd = [sys.executable, __file__, "--child", f"{s},{T}", "--d", str(args.d),
                   "--heads", str(args.heads), "--batch", str(args.batch),
                   "--repeats", str(args.repeats), "--threads", str(args.threads)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            if proc.returncode:
                print(f"{T:>6}  {s:<14} failed: {proc.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"{T:>6}  {s:<14} {r['levels']:>6}  {r['fwd_ms']:>9.1f}  {r['fwd_bwd_ms']:>10.1f}  "
                  f"{r['peak_mib']:>8.1f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
