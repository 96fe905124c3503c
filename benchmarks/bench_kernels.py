"""Time the ``cuda`` plugin's Triton kernels against the PyTorch strategies they accelerate, and
report achieved FLOP/s and bytes/s (the roofline numbers derived in docs/kernels.md).

    python benchmarks/bench_kernels.py                                   # on a CUDA machine
    python benchmarks/bench_kernels.py --batch 4 --heads 8 --length 8192 --dim 128 --dtypes bf16
    python benchmarks/bench_kernels.py --out docs/kernels_h100.json      # also write the rows
    python benchmarks/bench_kernels.py --interpret                       # CPU smoke run (tiny)

Kernels and their PyTorch baselines:
    chunk_linear   cuda:chunk_linear  vs  core:chunkwise's PyTorch code (Chunkwise.run_torch), for
                   l2 + gd, l2 + momentum and the Omega window (l2 + gd, windows from --windows)
    mru_scan       cuda:mru_scan      vs  mru:brent_kung (the MRU's default PyTorch scan)

Each case is timed forward only and forward + backward (the gradient of y against a fixed random
cotangent). FLOP/s use the model FLOP counts of `chunk_linear_cost` / `mru_cost` (useful products
of the real sizes, not the padded tiles) for both implementations, so their ratio is the speedup;
bytes/s use the kernel's compulsory HBM traffic under its memory plan and are reported for the
kernel only. ``--interpret`` runs everything in Triton's CPU interpreter at tiny sizes: it checks
that the script works, its timings mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=64, help="Dk = Dv of chunk_linear")
    ap.add_argument("--chunk", type=int, default=64, help="chunk size C of core:chunkwise")
    ap.add_argument("--windows", default="1,16", help="Omega windows c to time (1 = plain bias)")
    ap.add_argument("--dtypes", default="fp32,bf16", help="comma list of fp32, bf16, fp16")
    ap.add_argument("--mru-dims", default="4,16", help="MRU state sizes d")
    ap.add_argument("--only", choices=["chunk_linear", "mru_scan"], default=None)
    ap.add_argument("--cases", default=None,
                    help="comma list of chunk_linear cases to time (l2-gd, l2-momentum, omega<c>-l2-gd); default: all")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--interpret", action="store_true", help="CPU interpreter smoke run, tiny sizes")
    args = ap.parse_args(argv)
    if args.interpret:
        args.batch, args.heads, args.length, args.dim, args.chunk = 1, 1, 24, 16, 8
        args.windows, args.mru_dims = "1,4", "4"
    return args


# -- cost models (docs/kernels.md derives them) ---------------------------------------------------
def _mm(*dims):
    """FLOPs of one matrix product with dimensions (rows, inner, cols)."""
    return 2 * math.prod(dims)


def chunk_linear_cost(T, C, c, K, V, *, momentum, l2, backward, s_in):
    """(FLOPs, bytes) of one (batch, head) of `chunk_linear`; s_in = bytes per input element."""
    NT = math.ceil(T / C)
    n = T / NT  # average tokens per chunk
    m = n + c - 1
    fwd = [(m, K, V) if l2 else None, (n, K, m), (n, K, V), (n, m, V), (n, n, m), (V, m, K)]
    if momentum:
        fwd += [(n, n, m), (n, K, V), (V, m, K)]
    flops = NT * sum(_mm(*t) for t in fwd if t)
    rows = NT * m  # extended rows loaded per pass
    states = (2 if momentum else 1) * NT * K * V * 4
    gates = (3 if momentum else 2) * T * 4 + rows * 4
    byts = T * K * s_in + rows * (K + V) * s_in + gates + T * V * s_in + states
    if not backward:
        return flops, byts
    bwd = [(m, K, V) if l2 else None, (n, K, m), (n, n, m),  # recomputation
           (n, V, m), (m, n, V), (n, V, K), (n, m, K), (m, n, K), (n, K, V), (V, n, K),
           (m, V, K), (m, K, V), (m, V, K) if l2 else None, (V, m, K) if l2 else None,
           (n, n, m), (n, m, n)]
    if momentum:
        bwd += [(n, n, m), (n, K, V), (n, V, K), (V, n, K), (m, V, K), (m, K, V), (n, n, m), (n, m, n)]
    flops += NT * sum(_mm(*t) for t in bwd if t)
    head = NT * (c - 1) * (K + V + 1) * 4 * 3  # look-back rows: written, re-read, added in
    byts += (T * K * s_in + rows * (K + V) * s_in + gates + T * V * s_in + states  # re-read + dy
             + T * K * 4 + T * (K + V + 1) * 4 + (3 if momentum else 2) * T * 4 + head)
    return flops, byts


def mru_cost(T, d, C, *, backward, s_in):
    """(FLOPs, bytes) of one (batch, head) of `mru_scan` (chunk C of the kernel's local phases)."""
    NT = math.ceil(T / C)
    flops = 2 * T * _mm(d, d, d) + NT * _mm(d, d, d)
    cast = T * d * d * (4 + s_in) if s_in != 4 else 0  # float32 result -> input dtype
    # X read, H written (local prefixes), H read and rewritten; chunk totals and starts
    byts = T * d * d * (s_in + 4 * 3) + 2 * NT * d * d * 4 + cast
    if backward:
        flops += 3 * T * _mm(d, d, d) + NT * _mm(d, d, d)
        # local pass reads X, dH; apply pass reads X, dH, H and writes dX; carries
        byts += T * d * d * (4 * s_in + 4 * 2) + 3 * NT * d * d * 4 + cast
    return flops, byts


# -- timing ---------------------------------------------------------------------------------------
def bench(fn, interpret):
    """Milliseconds per call: triton's do_bench on a GPU, one wall-clock call in the interpreter."""
    if interpret:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100)


def chunk_linear_cases(args, torch, device):
    import atlas_core as ac
    from atlas_core.rule import MemoryInputs
    from atlas_core.strategies.chunkwise import Chunkwise, ChunkwiseParams
    from atlas_plugins.cuda_backend.chunk_linear import chunk_linear

    B, H, T, D, C = args.batch, args.heads, args.length, args.dim, args.chunk
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    configs = [("l2-gd", "gd", 1), ("l2-momentum", "momentum", 1)]
    configs += [(f"omega{c}-l2-gd", "gd", c) for c in map(int, args.windows.split(",")) if c > 1]
    if args.cases:
        wanted = set(args.cases.split(","))
        unknown = wanted - {label for label, _, _ in configs}
        if unknown:
            sys.exit(f"bench_kernels: --cases {','.join(sorted(unknown))}: no such case; the cases are "
                     + ", ".join(label for label, _, _ in configs))
        configs = [cfg for cfg in configs if cfg[0] in wanted]
    for label, alg, c in configs:
        bias = "core:l2" if c == 1 else {"use": "omega:window", "window": c, "inner": "core:l2", "gamma": "gate"}
        rule = ac.build_rule({"bias": bias, "retention": "core:decay", "algorithm": f"core:{alg}"},
                             heads=H, d_key=D, d_value=D)
        mom = alg == "momentum"
        for dname in args.dtypes.split(","):
            dt = dtypes[dname]
            g = torch.Generator(device=device).manual_seed(0)

            def rnd(*shape, lo=None):
                x = torch.rand(*shape, generator=g, device=device)
                return lo + (1 - lo) * 0.9 * x if lo is not None else x

            psi = torch.nn.functional.normalize(torch.randn(B, H, T, D, device=device), dim=-1)
            xk = torch.nn.functional.normalize(torch.randn(B, H, T + c - 1, D, device=device), dim=-1)
            xv = torch.randn(B, H, T + c - 1, D, device=device)
            xg, alpha, theta = rnd(B, H, T + c - 1, lo=0.3), rnd(B, H, T, lo=0.9), 0.05 * rnd(B, H, T)
            eta = rnd(B, H, T, lo=0.5) if mom else None
            m0 = torch.zeros(B, H, D, D, device=device)
            z0 = torch.zeros_like(m0) if mom else None
            lag = rule.bias.lag_weights(torch.float32, device)
            leaves = [t.to(dt).requires_grad_(True) for t in (psi, xk, xv)]
            dy = torch.randn(B, H, T, D, device=device)

            def kernel(backward):
                y, _, _ = chunk_linear(*leaves, xg, alpha, theta, eta, lag, m0, z0, chunk_size=C)
                if backward:
                    y.backward(dy.to(y.dtype))

            ref_leaves = [t.detach().float().requires_grad_(True) for t in leaves]  # the rule upcasts

            def reference(backward):
                gates = {"theta": theta, "alpha": alpha, **({"eta": eta} if mom else {})}
                state = {"M": m0, **({"Z.M": z0} if mom else {})}
                if c > 1:
                    state.update({"window.k": ref_leaves[1][:, :, : c - 1], "window.v": ref_leaves[2][:, :, : c - 1],
                                  "window.gamma": xg[:, :, : c - 1]})
                p = MemoryInputs(psi=ref_leaves[0], phik=ref_leaves[1][:, :, c - 1:], v=ref_leaves[2][:, :, c - 1:],
                                 alpha=alpha, gamma=xg[:, :, c - 1:], gates=gates, state=state)
                y, _ = Chunkwise(ChunkwiseParams(chunk_size=C)).run_torch(rule, p)
                if backward:
                    y.backward(dy)

            s_in = torch.finfo(dt).bits // 8
            for backward in (False, True):
                flops, byts = chunk_linear_cost(T, C, c, D, D, momentum=mom, l2=True, backward=backward, s_in=s_in)
                yield dict(kernel="chunk_linear", case=label, dtype=dname, pass_="fwd+bwd" if backward else "fwd",
                           shape=f"B{B} H{H} T{T} D{D} C{C} c{c}", flops=flops * B * H, bytes=byts * B * H,
                           run_kernel=lambda b=backward: kernel(b), run_torch=lambda b=backward: reference(b))


def mru_cases(args, torch, device):
    from atlas_plugins.cuda_backend.backend_mru import SCAN_CHUNK
    from atlas_plugins.cuda_backend.mru_scan import mru_scan
    from atlas_plugins.mru.cumprod import FUNCTIONS

    B, H, T = args.batch, args.heads, args.length
    for d in map(int, args.mru_dims.split(",")):
        for dname in args.dtypes.split(","):
            dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dname]
            X = torch.eye(d, device=device) + 0.1 * torch.randn(B, H, T, d, d, device=device) / d**0.5
            Xk = X.to(dt).requires_grad_(True)
            Xr = X.clone().requires_grad_(True)
            dH = torch.randn(B, H, T, d, d, device=device)

            def kernel(backward):
                out = mru_scan(Xk, None, chunk=SCAN_CHUNK)
                if backward:
                    out.backward(dH.to(out.dtype))

            def reference(backward):
                out = FUNCTIONS["brent_kung"].apply(Xr, None)
                if backward:
                    out.backward(dH)

            s_in = torch.finfo(dt).bits // 8
            for backward in (False, True):
                flops, byts = mru_cost(T, d, SCAN_CHUNK, backward=backward, s_in=s_in)
                yield dict(kernel="mru_scan", case=f"d{d}", dtype=dname, pass_="fwd+bwd" if backward else "fwd",
                           shape=f"B{B} H{H} T{T} d{d}", flops=flops * B * H, bytes=byts * B * H,
                           run_kernel=lambda b=backward: kernel(b), run_torch=lambda b=backward: reference(b))


def main(argv=None):
    args = parse_args(argv)
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    import torch

    if not args.interpret and not torch.cuda.is_available():
        sys.exit("bench_kernels: no CUDA device; use --interpret for a CPU smoke run")
    device = "cpu" if args.interpret else "cuda"
    name = "Triton interpreter (CPU)" if args.interpret else torch.cuda.get_device_name()
    print(f"# device: {name}; torch {torch.__version__}", file=sys.stderr)
    gens = []
    if args.only in (None, "chunk_linear"):
        gens.append(chunk_linear_cases(args, torch, device))
    if args.only in (None, "mru_scan"):
        gens.append(mru_cases(args, torch, device))
    rows = []
    head = f"{'kernel':<13}{'case':<16}{'dtype':<6}{'pass':<9}{'triton ms':>10}{'torch ms':>10}{'speedup':>8}{'TFLOP/s':>9}{'GB/s':>8}  shape"
    print(head)
    for gen in gens:
        for case in gen:
            t_k = bench(case.pop("run_kernel"), args.interpret)
            t_t = bench(case.pop("run_torch"), args.interpret)
            row = dict(case, triton_ms=t_k, torch_ms=t_t, speedup=t_t / t_k,
                       triton_tflops=case["flops"] / t_k / 1e9, torch_tflops=case["flops"] / t_t / 1e9,
                       triton_gbps=case["bytes"] / t_k / 1e6)
            rows.append(row)
            print(f"{row['kernel']:<13}{row['case']:<16}{row['dtype']:<6}{row['pass_']:<9}{t_k:>10.3f}{t_t:>10.3f}"
                  f"{row['speedup']:>8.2f}{row['triton_tflops']:>9.2f}{row['triton_gbps']:>8.0f}  {row['shape']}",
                  flush=True)
            if not args.interpret:
                torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"device": name, "rows": rows}, fh, indent=1)
    return rows


if __name__ == "__main__":
    main()
