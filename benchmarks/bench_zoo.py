"""Each zoo rule's chunked strategy against flash-linear-attention's pure-PyTorch reference, side by side.

    python benchmarks/bench_zoo.py                       # B=1, H=4, T=2048, D=64, C=64, CPU float32
    python benchmarks/bench_zoo.py --T 4096 --threads 2 --json out.json

For every zoo preset with a chunked strategy here and a pure-PyTorch reference in fla-core 0.6.0
(``fla/ops/<rule>/naive.py``, loaded by file path as the tests do), the same inputs go through
both; the outputs are first asserted equal (float32, relative to the output's scale), then a
forward pass of each is timed (``torch.no_grad``, after a warm-up call; the fastest of
``--repeats`` calls). fla's
chunk references are used where the file has one; GLA's ``naive.py`` holds only its token loop,
and RetNet's only the parallel T x T form, so those rows compare against what exists (named in
the table). The mapping of tensors is docs/zoo.md's: our ``M = S^T``, q as given (fla's scale 1,
or q multiplied by sqrt(Dk) where fla fixes ``1/sqrt(Dk)``), ``alpha = exp(g)``, ``theta = beta``
or 1.

On a shared CPU the ratios are indicative, not a speed claim.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
from pathlib import Path

import torch


def fla_reference(rel: str):
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("fla-core is not installed (pip install fla-core==0.6.0): nothing to compare against")
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    mod_spec = importlib.util.spec_from_file_location(f"_fla_bench_{path.parent.name}", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


def _inputs(B, T, H, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=g) for _ in range(3))
    k = torch.nn.functional.normalize(k, dim=-1)
    q = q * D ** -0.5
    alpha_h = 0.9 + 0.1 * torch.rand(B, T, H, generator=g)
    alpha_k = 0.9 + 0.1 * torch.rand(B, T, H, D, generator=g)
    beta = 0.1 + 0.8 * torch.rand(B, T, H, generator=g)
    return q, k, v, alpha_h, alpha_k, beta


def cases(B, T, H, D, C):
    """(preset, our strategy, our gates, fla label, fla call) per row; fla calls return y [B, T, H, D]."""
    q, k, v, ah, ak, beta = _inputs(B, T, H, D)
    ones = torch.ones(B, T, H)
    tr = lambda x: x.transpose(1, 2)  # noqa: E731  [B, T, H, .] <-> [B, H, T, .]
    la = fla_reference("ops/linear_attn/naive.py")
    sg = fla_reference("ops/simple_gla/naive.py")
    gl = fla_reference("ops/gla/naive.py")
    dr = fla_reference("ops/delta_rule/naive.py")
    gd = fla_reference("ops/gated_delta_rule/naive.py")
    kd = fla_reference("ops/kda/naive.py")
    rn = fla_reference("ops/retention/naive.py")
    chunk = {"use": "core:chunkwise", "chunk_size": C}
    exact = {"use": "core:exact_chunk", "chunk_size": C}
    return (q, k, v), [
        ("zoo:linear_attention", chunk, {"theta": ones}, "naive_chunk_linear_attn (C = 64)",
         lambda: la.naive_chunk_linear_attn(q, k, v, scale=1.0)),
        ("zoo:retnet", chunk, {"theta": ones}, "naive_retention (parallel, T x T)",
         lambda: tr(rn.naive_retention(tr(q), tr(k), tr(v))) * D ** 0.5),
        ("zoo:simple_gla", chunk, {"alpha": ah, "theta": ones}, f"naive_chunk_simple_gla (C = {C})",
         lambda: sg.naive_chunk_simple_gla(q, k, v, ah.log(), chunk_size=C, scale=1.0)[0]),
        ("zoo:gla", chunk, {"alpha": ak, "theta": ones}, "naive_recurrent_gla (token loop; no chunk reference)",
         lambda: gl.naive_recurrent_gla(q * D ** 0.5, k, v, ak.log())[0]),
        ("zoo:gla", exact, {"alpha": ak, "theta": ones}, "naive_recurrent_gla (token loop; no chunk reference)",
         None),
        ("zoo:deltanet", exact, {"theta": beta}, f"delta_rule_chunkwise (C = {C})",
         lambda: tr(dr.delta_rule_chunkwise(tr(q * D ** 0.5), tr(k), tr(v), tr(beta), chunk_size=C)[0])),
        ("zoo:gated_deltanet", exact, {"alpha": ah, "theta": beta}, f"naive_chunk_gated_delta_rule (C = {C})",
         lambda: gd.naive_chunk_gated_delta_rule(q, k, v, ah.log(), beta, chunk_size=C, scale=1.0)[0]),
        ("zoo:kda", exact, {"alpha": ak, "theta": beta}, f"naive_chunk_kda (C = {C})",
         lambda: kd.naive_chunk_kda(q, k, v, ak.log(), beta, scale=1.0, chunk_size=C)[0]),
    ]


def _time(fn, repeats: int):
    """(the output, the fastest of ``repeats`` timed calls in seconds)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--T", type=int, default=2048, help="tokens (a multiple of 64: fla's chunk references need it)")
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--D", type=int, default=64, help="Dk = Dv")
    ap.add_argument("--C", type=int, default=64, help="chunk size of both sides")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per side; the fastest is reported")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.T % 64 or args.T % args.C:
        ap.error("--T must be a multiple of 64 and of --C")
    if args.threads:
        torch.set_num_threads(args.threads)
    import atlas_core as ac

    B, T, H, D, C = args.B, args.T, args.H, args.D, args.C
    (q, k, v), rows = cases(B, T, H, D, C)
    fla_times: dict[str, tuple[float, torch.Tensor]] = {}
    results = []
    with torch.no_grad():
        for preset, strategy, gates, label, fla_call in rows:
            rule = ac.build_rule(preset, heads=H, d_key=D, d_value=D)
            cut = {n: x[:, :64] for n, x in gates.items()}
            rule(q[:, :64], k[:, :64], v[:, :64], gates=cut, strategy=strategy)  # warm-up
            (y, _), ours = _time(lambda: rule(q, k, v, gates=gates, strategy=strategy), args.repeats)
            if label not in fla_times:
                fla_call()  # warm-up (same sizes: fla's references have no short path)
                y_ref, t_ref = _time(fla_call, args.repeats)
                fla_times[label] = (t_ref, y_ref)
            t_ref, y_ref = fla_times[label]
            err = float((y - y_ref).abs().max()) / max(1.0, float(y_ref.abs().max()))
            assert err < 1e-4, f"{preset} under {strategy['use']} differs from {label}: {err:.2e}"
            results.append({"preset": preset, "strategy": strategy["use"], "ours_ms": 1e3 * ours,
                            "fla": label, "fla_ms": 1e3 * t_ref, "ratio": t_ref / ours, "max_rel_err": err})
            print(f"{preset:22s} {strategy['use']:18s} {1e3 * ours:9.1f} ms   {label:52s} "
                  f"{1e3 * t_ref:9.1f} ms   x{t_ref / ours:6.2f}   err {err:.1e}", flush=True)
    meta = {"B": B, "T": T, "H": H, "D": D, "C": C, "threads": torch.get_num_threads(), "repeats": args.repeats,
            "torch": torch.__version__, "machine": platform.processor() or platform.machine()}
    print("| preset | ours | ms | fla-core reference | ms | fla / ours | max rel. diff |")
    print("|---|---|---:|---|---:|---:|---:|")
    for r in results:
        print(f"| `{r['preset']}` | `{r['strategy']}` | {r['ours_ms']:.1f} | `{r['fla']}` | {r['fla_ms']:.1f} "
              f"| {r['ratio']:.2f} | {r['max_rel_err']:.1e} |")
    print(json.dumps(meta))
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
