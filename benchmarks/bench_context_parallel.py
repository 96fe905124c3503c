"""Context parallelism: per-rank time of a training step against one process running its slice.

For each rule, sequence length T and rank count R, R gloo processes on this machine each hold
T / R tokens of one sequence (batch 1) and run `atlas_core.distributed.context_parallel` forward
and backward (a loss over every output); R = 1 is the plain rule call in one process. Beside it,
one process runs the plain rule call on T / R tokens (the slice's work without context
parallelism). Reported, median of ``--repeat`` steps after one warm-up, slowest rank:

- ``cpu s``: the CPU time of a rank's step in its own thread (``time.thread_time``; one thread
  a process, and the CPU autograd runs its backward in the calling thread, so this is all of
  the rank's computation), and ``cpu x``: it over the one-process slice's. This is the figure to
  read when the ranks share cores (R above the core count): what the rank takes on a core of its
  own;
- ``Rp cpu``, ``cpu xR``: the same baseline measured as R plain processes at once, each on its
  T / R tokens without context parallelism (slowest): the slices' work under the same sharing of
  the cores as the R ranks (with R above the core count, processes that share a core slow each
  other's CPU time down too: caches, the core's other hardware thread);
- ``cpu xT``: each rank's CPU time over the plain step of its own slice run by the same process
  in turn with its context-parallel steps (the R ranks take both steps together, so the baseline
  shares the cores as the ranks do and sees the same load at the same moments), the largest
  over the ranks; ``per rank``: every rank's. The least noisy figure on a shared machine: the
  separate baselines above run minutes apart;
- ``cpu x1``: each rank's step **alone on a core**, the largest over the ranks; ``alone``: every
  rank's. With more ranks than cores (R = 4 on a 2-core machine) the ranks' steps share cores,
  and sharing a core slows a process's own CPU time too (the other process evicts its caches),
  the more so the larger its working set: the figures above then measure the sharing as well.
  So after its timed steps each rank records the messages of one context-parallel step (what
  its collectives and receives return, real gloo), and then the ranks replay their step one
  after another, each alone while the others wait: the same computation on the same data, the
  messages handed back from the record instead of sent (their CPU time, gloo's own threads, is
  not in ``cpu s`` either), timed against the plain step of its slice in the same process, in
  turn, ``--repeat`` times;
- ``proc s``: the same over every thread of the process (``time.process_time``): it adds
  gloo's own threads, which poll while a collective waits for a slower rank, so on shared cores
  it grows with the waiting, not with the rank's work;
- ``wall s``, ``wall x``: the same with wall-clock time (``time.perf_counter``; includes waiting
  for the other ranks and, with shared cores, their turns on the core);
- ``tok/s``: T / the slowest rank's wall time;
- ``peak MiB/rank``: the largest growth of a rank's resident memory during its timed runs (peak
  ``VmHWM`` after, reset before, minus ``VmRSS`` before: activations, maps and their gradients;
  torch itself and the inputs excluded). Linux only.

A rule is ``ns:name`` (``anchor = 64``, ``core:chunkwise`` with chunk 64) or ``ns:name/exact``
(the per-token rule, ``anchor = 1``, ``core:exact_chunk`` with chunk 32). A configuration whose
step takes longer than ``--budget`` seconds ends that rule's longer sequences at the same R.

Usage::

    python benchmarks/bench_context_parallel.py                      # the recorded table
    python benchmarks/bench_context_parallel.py --T 4096 --R 1 2 --rules titans:titans

Every process runs ``--threads`` threads (default 1; R = 1 too, so that the rows compare the same
per-process work).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

#: heads and head size (``--heads``, ``--dim``); workers get them with their payload
SIZES = {"heads": 2, "dim": 16}


def _rule(name: str):
    """``ns:name``: anchor 64 under core:chunkwise (chunk 64); ``ns:name/exact``: the per-token
    rule under core:exact_chunk (chunk 32)."""
    import atlas_core as ac

    torch.manual_seed(0)
    if name.endswith("/exact"):
        spec = {"use": name[:-len("/exact")], "parallel": {"use": "core:exact_chunk", "chunk_size": 32}}
    else:
        spec = {"use": name, "anchor": 64, "parallel": {"use": "core:chunkwise", "chunk_size": 64}}
    return ac.build_rule(spec, heads=SIZES["heads"], d_key=SIZES["dim"], d_value=SIZES["dim"])


def _slice(rule, T: int, R: int, r: int):
    """Rank r's slice of one sequence: unit q and k, step sizes 0.05 to 0.15 (an anchored rule's
    a block's length times smaller, over 8: all of a block's gradients are taken at one memory,
    and at the full size the memory grows without bound over a few thousand tokens), decays and
    momenta 0.9 to 0.99."""
    g = torch.Generator().manual_seed(1)
    HEADS, D = SIZES["heads"], SIZES["dim"]
    q = torch.nn.functional.normalize(torch.randn(1, T, HEADS, D, generator=g), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(1, T, HEADS, D, generator=g), dim=-1)
    v = torch.randn(1, T, HEADS, D, generator=g)
    step = 8 / rule.anchor if rule.anchor > 8 else 1.0
    gates = {n: step * (0.05 + 0.1 * torch.rand(1, T, HEADS, generator=g)) if n == "theta"
             else 0.9 + 0.09 * torch.rand(1, T, HEADS, generator=g) for n in rule.gate_names}

    def part(x):
        return x.tensor_split(R, dim=1)[r].clone().requires_grad_(True)

    return part(q), part(k), part(v), {n: part(x) for n, x in gates.items()}


def _status(field: str) -> float:
    """A memory figure of this process from /proc/self/status, in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0  # kB
    return float("nan")


def _reset_peak() -> None:
    """Restart the peak resident memory count (VmHWM) from the current size (Linux)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


class _Messages:
    """Record what a rank's context-parallel step receives (its all-gathers, the map plan's
    exchanges and boundary memories, relay's states), then hand it back in the same order with
    nothing sent (`replay`): the rank's step alone, on the data of the real one."""

    def __init__(self):
        self.log: list = []

    def _patch(self, replay: bool):
        import importlib

        from atlas_core.distributed import context as cx

        try:  # the relay mode's module (in context itself in earlier releases)
            relay = importlib.import_module("atlas_core.distributed.relay")
        except ImportError:
            relay = cx
        owner = {"_gather": cx, "exchange": cx, "Boundaries": cx, "_recv_state": relay, "_send_state": relay}
        saved = {name: getattr(mod, name) for name, mod in owner.items() if hasattr(mod, name)}
        log, it = self.log, iter(self.log)

        if replay:
            def gather(t, call):
                return [x.clone() for x in next(it)]

            def exchange(call, sends, recvs):
                for (_, buf), got in zip(recvs, next(it)):
                    buf.copy_(got)

            class Boundaries(saved.get("Boundaries", object)):
                def put(self, k, x):
                    self.known[k] = x.detach().contiguous()

                def get(self, k):
                    if k not in self.known:
                        self.known[k] = next(it).clone()
                    return self.known[k]

            def recv_state(like, call, frm):
                return [x.clone() for x in next(it)]

            new = {"_gather": gather, "exchange": exchange, "Boundaries": Boundaries,
                   "_recv_state": recv_state, "_send_state": lambda tensors, call, to: None}
        else:
            def gather(t, call):
                out = saved["_gather"](t, call)
                log.append([x.clone() for x in out])
                return out

            def exchange(call, sends, recvs):
                saved["exchange"](call, sends, recvs)  # (a release without it: never called)
                log.append([buf.clone() for _, buf in recvs])

            class Boundaries(saved.get("Boundaries", object)):
                def get(self, k):
                    known = k in self.known
                    out = super().get(k)
                    if not known:
                        log.append(out.clone())
                    return out

            def recv_state(like, call, frm):
                out = saved["_recv_state"](like, call, frm)
                log.append([x.clone() for x in out])
                return out

            new = {"_gather": gather, "exchange": exchange, "Boundaries": Boundaries,
                   "_recv_state": recv_state, "_send_state": saved["_send_state"]}
        for name, f in new.items():
            if name in saved:  # (what this release has)
                setattr(owner[name], name, f)
        return lambda: [setattr(owner[name], name, f) for name, f in saved.items()]

    def record(self, step) -> None:
        self.log.clear()
        undo = self._patch(replay=False)
        try:
            step()
        finally:
            undo()

    def replay(self, step) -> None:
        undo = self._patch(replay=True)
        try:
            step()
        finally:
            undo()


def measure(payload, info) -> dict:
    """One rank: forward + backward of its slice, ``repeat`` times after a warm-up; the slowest
    rank's wall and CPU seconds (medians), its peak memory growth."""
    import torch.distributed as dist

    from atlas_core.distributed import context_parallel, mode_for

    name, T, repeat, plain, sizes = payload
    SIZES.update(sizes)
    rule = _rule(name)
    R, r = info.world, info.rank
    q, k, v, gates = _slice(rule, T, R, r)
    strategy = rule.default_strategy

    last = {}  # the outputs of the last step

    def once(cp: bool, sync: bool = True) -> tuple[float, float, float]:
        if R > 1 and sync:
            dist.barrier()  # start together: no rank's time includes another's warm-up
        t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        if cp:
            y, _ = context_parallel(rule, q, k, v, gates, group=None, strategy=strategy)
        else:
            y, _ = rule(q, k, v, gates=gates, strategy=strategy)
        y.square().sum().backward()
        c1, p1 = time.thread_time(), time.process_time()
        last["y"] = y.detach()
        if R > 1 and sync:
            dist.barrier()
        return time.perf_counter() - t0, c1 - c0, p1 - p0

    cp = R > 1 and not plain
    once(cp)  # warm-up
    if not torch.isfinite(last["y"]).all():  # a step on inf / NaN measures nothing
        raise RuntimeError(f"{name}: rank {r}'s outputs are not finite at T = {T}; the inputs "
                           "make the memory grow without bound")
    if cp:
        once(False)
    base = _status("VmRSS")
    _reset_peak()
    runs, alone = [], []
    for _ in range(repeat):  # with context parallelism, the plain slice step in turn
        runs.append(once(cp))
        if cp:
            alone.append(once(False)[1])
    out = {"wall": statistics.median(x[0] for x in runs), "cpu": statistics.median(x[1] for x in runs),
           "proc": statistics.median(x[2] for x in runs), "peak_mib": _status("VmHWM") - base,
           "mode": mode_for(rule) if cp else "-"}
    out["ratio"] = out["cpu"] / statistics.median(alone) if cp else float("nan")
    out["alone"] = _alone(once, last, R, r, repeat) if cp else float("nan")
    if R > 1:
        every = [None] * R
        dist.all_gather_object(every, out)
        return {"wall": max(e["wall"] for e in every), "cpu": max(e["cpu"] for e in every),
                "proc": max(e["proc"] for e in every), "peak_mib": max(e["peak_mib"] for e in every),
                "mode": out["mode"], "ratio": max(e["ratio"] for e in every),
                "ratios": [e["ratio"] for e in every], "alone": max(e["alone"] for e in every),
                "alones": [e["alone"] for e in every]}
    return out


def _alone(once, last: dict, R: int, r: int, repeat: int) -> float:
    """Rank r's context-parallel step over its plain step, each alone on a core: the step's
    messages recorded from one real step, then replayed by one rank at a time (`_Messages`;
    each replayed step's outputs must equal the recorded step's, bit for bit)."""
    import torch.distributed as dist

    msgs = _Messages()
    msgs.record(lambda: once(True))
    want = last["y"]
    ratio = float("nan")
    for turn in range(R):
        dist.barrier()
        if turn != r:
            continue
        cp, plain = [], []
        for i in range(repeat + 1):  # the first of each: a warm-up
            msgs.replay(lambda: cp.append(once(True, sync=False)[1]))
            if not torch.equal(last["y"], want):
                raise RuntimeError(f"rank {r}: the replayed step's outputs differ from the recorded step's")
            plain.append(once(False, sync=False)[1])
        ratio = statistics.median(cp[1:]) / statistics.median(plain[1:])
    dist.barrier()
    return ratio


def measure_threads(payload, info) -> dict:
    *rest, threads = payload
    torch.set_num_threads(threads)
    return measure(tuple(rest), info)


def run(name: str, T: int, R: int, repeat: int, threads: int, plain: bool = False) -> dict:
    """R ranks on T tokens; with ``plain``, R processes at once, each running the plain rule on
    its T / R tokens (the slices' work alone, on the same shared cores)."""
    from atlas_core.train.data_parallel import SINGLE, spawn

    if R == 1:
        torch.set_num_threads(threads)
        return measure((name, T, repeat, plain, dict(SIZES)), SINGLE)
    return spawn(measure_threads, (name, T, repeat, plain, dict(SIZES), threads), R, "cpu")


def load() -> str:
    try:
        return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "load average unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--R", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--rules", nargs="+",
                    default=["titans:titans", "titans:titans/exact", "zoo:gated_deltanet/exact",
                             "omega:omeganet/exact"])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--dim", type=int, default=16, help="head size (Dk = Dv)")
    ap.add_argument("--threads", type=int, default=1, help="threads per process (default 1)")
    ap.add_argument("--budget", type=float, default=120.0, help="seconds per step (see above)")
    args = ap.parse_args(argv)
    SIZES.update(heads=args.heads, dim=args.dim)
    print(f"# {os.cpu_count()} cores, {args.threads} thread(s) a process, torch "
          f"{torch.__version__}, heads {args.heads}, D {args.dim}, batch 1, float32; {load()}")
    print(f"{'rule':26s} {'T':>6s} {'R':>2s} {'mode':>6s} {'cpu s':>7s} {'1p cpu':>7s} "
          f"{'cpu x':>6s} {'Rp cpu':>7s} {'cpu xR':>6s} {'proc s':>7s} {'wall s':>7s} "
          f"{'1p wall':>7s} {'wall x':>6s} {'tok/s':>8s} {'MiB/rank':>8s} {'cpu xT':>6s} {'cpu x1':>6s}  per rank (xT)  alone (x1)")
    for name in args.rules:
        over: set[int] = set()
        for T in sorted(args.T):
            for R in args.R:
                if R in over:
                    print(f"{name:26s} {T:6d} {R:2d}  skipped (a shorter T took over "
                          f"{args.budget:.0f} s a step)", flush=True)
                    continue
                one = run(name, T // R, 1, args.repeat, args.threads)  # one process, the slice
                alike = run(name, T, R, args.repeat, args.threads, plain=True)  # R of them at once
                m = run(name, T, R, args.repeat, args.threads) if R > 1 else one
                if m["wall"] > args.budget:
                    over.add(R)
                print(f"{name:26s} {T:6d} {R:2d} {m['mode']:>6s} {m['cpu']:7.3f} {one['cpu']:7.3f} "
                      f"{m['cpu'] / one['cpu']:6.2f} {alike['cpu']:7.3f} {m['cpu'] / alike['cpu']:6.2f} {m['proc']:7.3f} {m['wall']:7.3f} {one['wall']:7.3f} "
                      f"{m['wall'] / one['wall']:6.2f} {T / m['wall']:8.0f} {m['peak_mib']:8.0f} "
                      f"{m.get('ratio', float('nan')):6.2f} {m.get('alone', float('nan')):6.2f}  "
                      + " ".join(f"{x:.2f}" for x in m.get("ratios", [])) + "  "
                      + " ".join(f"{x:.2f}" for x in m.get("alones", [])),
                      flush=True)
    print(f"# {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
