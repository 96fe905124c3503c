"""Resident memory beside live tensors: Atlas fwd+bwd, one fresh process per measurement.

    python benchmarks/bench_resident.py                       # T = 4096, allocator on and off
    python benchmarks/bench_resident.py --lengths 256,1024 --allocator on
    python benchmarks/bench_resident.py --lengths 4096 --json out.json

Atlas (``atlas_muon:atlas`` under ``"auto"``: ``atlas_muon:atlas_parallel``, chunk 16) at B 2,
H 4, D 64 (the sizes of ``atlas bench``), one thread. For each length, fresh processes:

- **resident growth**: the peak resident set during one fwd+bwd minus the resident set just
  before it (inputs built; `atlas_core.bench.memory.ResidentPeak`), with `atlas_core.allocator`
  configured (``on``, what the ``atlas`` CLI and ``atlas train`` do) or not (``off``: glibc's
  defaults). Also the process's CPU seconds (user + system: load on a shared machine inflates
  wall time far more than CPU time) and its page faults;
- **live peak**: the same fwd+bwd under `atlas_core.bench.memory.peak_tensor_bytes` (the tensors
  the computation holds), in a process of its own, since the probe's bookkeeping would otherwise
  be counted as resident memory.

The ratio is resident growth / live peak (issue 38: within 1.5x, and within 2 GiB, at T = 4096).
Results: docs/benchmarks.md, "Resident memory and live tensors".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

MIB = 2.0 ** 20


def child(T: int, mode: str, allocator: bool) -> dict:
    """One measurement in this process (a fresh one: see `main`)."""
    if allocator:
        from atlas_core import allocator as al
        al.configure()
    import resource

    import torch

    from atlas_core.bench.cases import get_case, make_inputs
    from atlas_core.bench.memory import ResidentPeak, peak_tensor_bytes

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    case = get_case("atlas")
    rule = case.rule(4, 64, 64)
    inp = make_inputs(case, rule.gate_names, T=T, B=2, H=4, Dk=64, Dv=64).requires_grad_()

    def train():
        y, _ = rule(inp.q, inp.k, inp.v, gates=inp.gates, strategy="auto")
        (y * inp.dy).sum().backward()

    ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    out: dict = {"T": T, "mode": mode, "allocator": "on" if allocator else "off",
                 "strategy": rule.runner("auto").describe()}
    if mode == "live":
        out["live_mib"] = peak_tensor_bytes(train) / MIB
    else:
        with ResidentPeak() as probe:
            train()
        out["resident_mib"] = probe.growth / MIB if probe.growth is not None else None
        out["resident_method"] = probe.method
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    out.update(wall_s=time.perf_counter() - t0, cpu_s=(ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime),
               sys_s=ru1.ru_stime - ru0.ru_stime, minor_faults=ru1.ru_minflt - ru0.ru_minflt,
               load_avg=os.getloadavg()[0])
    if allocator:
        out["trims"] = al.status().get("trims")
    return out


def run_child(T: int, mode: str, allocator: bool) -> dict:
    env = dict(os.environ)
    env.pop("ATLAS_ALLOCATOR", None)
    cmd = [sys.executable, __file__, "--child", mode, "--lengths", str(T)]
    if allocator:
        cmd.append("--child-allocator")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        return {"T": T, "mode": mode, "allocator": "on" if allocator else "off",
                "error": done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="4096", help="comma-separated sequence lengths")
    ap.add_argument("--allocator", choices=["on", "off", "both"], default="both",
                    help="atlas_core.allocator configured in the resident runs (default: both)")
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument("--child", choices=["resident", "live"], help=argparse.SUPPRESS)
    ap.add_argument("--child-allocator", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",") if x]
    if args.child:
        print(json.dumps(child(lengths[0], args.child, args.child_allocator)))
        return
    settings = {"on": [True], "off": [False], "both": [False, True]}[args.allocator]
    rows = []
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.2f} at start", file=sys.stderr)
    for T in lengths:
        live = run_child(T, "live", False)
        rows.append(live)
        for on in settings:
            row = run_child(T, "resident", on)
            row["live_mib"] = live.get("live_mib")
            rows.append(row)
            res, lv = row.get("resident_mib"), row.get("live_mib")
            ratio = f"{res / lv:.2f}x" if res and lv else "-"
            print(f"T={T:6d} allocator {row['allocator']:>3}: resident growth "
                  f"{res if res is None else round(res)} MiB, live peak "
                  f"{lv if lv is None else round(lv)} MiB ({ratio}); CPU {row.get('cpu_s', 0):.1f} s "
                  f"(sys {row.get('sys_s', 0):.1f} s, {row.get('minor_faults', 0)} faults), wall "
                  f"{row.get('wall_s', 0):.1f} s at load {row.get('load_avg', 0):.1f}"
                  + (f", {row['trims']} trims" if row.get("trims") is not None else "")
                  + (f"  ERROR {row['error']}" if "error" in row else ""), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
