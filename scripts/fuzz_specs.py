#!/usr/bin/env python3
"""Spec fuzzer: mutated specs must be refused with one clean error, or build and run.

Every example spec (``examples/*.toml``) and the embedded default (``atlas_core/data/
default_mqar.toml``) is mutated, reproducibly from ``--seed``: numbers set to huge, negative,
zero, ``inf``, ``nan`` or ``2**64``; values of the wrong type; keys deleted or duplicated; tables
nested thousands deep; unknown component names and keys; strings where tables go and tables
where strings go; and damaged files (truncated, invalid UTF-8, NUL bytes, over the size limit).

Each mutated spec goes through the spec validator (`atlas_core.spec.load_spec`); an accepted one
is then checked for its size (`atlas_core.preflight.check_model_size`, which builds one and two
blocks on the meta device), built whole on the meta device (up to 64 blocks, as ``atlas spec
validate`` does) and, when it has at most ``--forward-params`` parameters, built on the CPU and
run forward once on a few tokens. Outcomes:

==========  ========================================================================
``error``   refused with one `AtlasError` (what the CLI prints as one ``error:`` line)
``built``   accepted, built on meta (and run forward when small enough)
``crash``   any other exception: a traceback for the user (a bug)
``hang``    no answer within ``--timeout`` seconds (the worker is killed; a bug)
==========  ========================================================================

Specs run in a worker subprocess (restarted after a hang or a crash of the interpreter) under
an address-space limit, so a spec that hangs or allocates without bound is caught and reported.
``--cli N`` also runs N of the mutated specs through the real ``atlas spec validate`` and
``atlas build --device meta`` commands, each in a fresh process with a timeout, and counts
tracebacks and hangs there. The exit status is 1 when anything crashed or hung.

    python scripts/fuzz_specs.py --count 1200 --seed 0 --cli 60
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import re
import selectors
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent.parent
WHOLE_BUILD_DEPTH = 64  # deeper models are checked through the preflight (cli/spec.py)
OUTCOMES = ("error", "built", "crash", "hang")

# -- seeds ---------------------------------------------------------------------------------------


def seed_specs(root: Path = ROOT) -> list[tuple[str, dict[str, Any]]]:
    """(name, parsed spec) for every example and the embedded default spec."""
    files = sorted((root / "examples").glob("*.toml")) + [root / "atlas_core/data/default_mqar.toml"]
    return [(f.name, tomllib.loads(f.read_text())) for f in files]


# -- a small TOML writer (any value, including inf, nan and integers beyond 64 bits) -------------
_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _key(k: str) -> str:
    return k if _BARE.fullmatch(k) else json.dumps(k)


def _val(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_val(x)}" for k, x in v.items()) + " }" if v else "{}"
    if isinstance(v, list):
        return "[" + ", ".join(_val(x) for x in v) + "]"
    raise TypeError(type(v))


def to_toml(data: dict[str, Any]) -> str:
    head = [f"{_key(k)} = {_val(v)}" for k, v in data.items() if not isinstance(v, dict)]
    body = []
    for k, v in data.items():
        if isinstance(v, dict):
            body.append(f"\n[{_key(k)}]")
            body.extend(f"{_key(kk)} = {_val(vv)}" for kk, vv in v.items())
    return "\n".join(head + body) + "\n"


# -- mutations -----------------------------------------------------------------------------------
NUMBERS = [10**9, 10**6, 10**12, 2**31, 2**63 - 1, 2**64, -(2**63), -1, 0, -0.0, 1e308, -1e308,
           float("inf"), float("-inf"), float("nan"), 1e-320, 0.5, 3, 4097, 65537, 1025, 100000]
# values a spec may well hold, to reach the builder with unusual but valid sizes
PLAUSIBLE = [1, 2, 3, 5, 7, 16, 64, 100, 1000, 1024, 4096, 0.1, 0.999, 1.5, 64.0]
WRONG = ["x", "", "core:nope", "ns:", ":", "titans:", [1, 2], [], {}, {"use": "core:nope"},
         True, False, [[[]]], {"a": {"b": 1}}, "1e9", "inf", "\u00e9\u00e8", "a" * 5000]
NAMES = ["core:nope", "nope", "titans:nope", "zzz:titans", "core:", "core:l2", "core:linear",
         "core:gd", "titans:titans", "omega:omega", "mru:mru", "core:lm", "mqar", "nope:mqar"]


def _paths(node: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every path into the nested dict/list ``node`` (leaves and containers)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


def _get(node: Any, path: tuple) -> Any:
    for p in path:
        node = node[p]
    return node


def _set(node: Any, path: tuple, value: Any) -> None:
    _get(node, path[:-1])[path[-1]] = value


def _delete(node: Any, path: tuple) -> None:
    parent = _get(node, path[:-1])
    del parent[path[-1]]


def _nest(depth: int, leaf: Any = 1, array: bool = False) -> str:
    """Inline TOML text nested ``depth`` levels deep (tables, or arrays)."""
    if array:
        return "[" * depth + _val(leaf) + "]" * depth
    return "{ a = " * depth + _val(leaf) + " }" * depth


def _mutate_data(rng: random.Random, data: dict[str, Any]) -> str:
    paths = list(_paths(data))
    leaves = [p for p in paths if not isinstance(_get(data, p), (dict, list))]
    numeric = [p for p in leaves if isinstance(_get(data, p), (int, float))
               and not isinstance(_get(data, p), bool)]
    kind = rng.choice(["number", "number", "number", "wrong_type", "delete", "unknown_name",
                       "unknown_key", "string_for_table", "table_for_string", "list_for_value"])
    if kind == "number" and numeric:
        p = rng.choice(numeric)
        _set(data, p, rng.choice(NUMBERS if rng.random() < 0.5 else PLAUSIBLE))
    elif kind == "wrong_type" and leaves:
        _set(data, rng.choice(leaves), rng.choice(WRONG))
    elif kind == "delete" and paths:
        _delete(data, rng.choice(paths))
    elif kind == "unknown_name":
        named = [p for p in leaves if isinstance(_get(data, p), str) and ":" in _get(data, p)]
        if named:
            _set(data, rng.choice(named), rng.choice(NAMES))
        else:
            data.setdefault("memory", {})["use"] = rng.choice(NAMES)
    elif kind == "unknown_key":
        tables = [()] + [p for p in paths if isinstance(_get(data, p), dict)]
        _get(data, rng.choice(tables))[rng.choice(["nope", "depht", "use", "arch", "x-y"])] = 1
    elif kind == "string_for_table":
        tables = [p for p in paths if isinstance(_get(data, p), dict)]
        if tables:
            _set(data, rng.choice(tables), rng.choice(["titans:titans", "x", "", "core:lm"]))
    elif kind == "table_for_string":
        strings = [p for p in leaves if isinstance(_get(data, p), str)]
        if strings:
            _set(data, rng.choice(strings), rng.choice([{}, {"use": "core:l2"}, {"a": {"b": {}}}]))
    elif leaves:
        _set(data, rng.choice(leaves), [rng.choice(NUMBERS), "x"])
    return to_toml(data)


def _mutate_text(rng: random.Random, text: str) -> bytes:
    kind = rng.choice(["duplicate", "nest", "nest_array", "truncate", "flip", "utf8", "nul",
                       "huge", "huge_line", "bom", "garbage"])
    lines = text.splitlines()
    assigned = [i for i, ln in enumerate(lines) if "=" in ln and not ln.lstrip().startswith("#")]
    if kind == "duplicate" and assigned:
        i = rng.choice(assigned)
        lines.insert(i + 1, lines[i])
        return "\n".join(lines).encode()
    if kind in ("nest", "nest_array") and assigned:
        i = rng.choice(assigned)
        key = lines[i].split("=", 1)[0]
        depth = rng.choice([10, 100, 600, 1000, 5000, 50000])
        lines[i] = f"{key}= {_nest(depth, array=kind == 'nest_array')}"
        return "\n".join(lines).encode()
    data = text.encode()
    if kind == "truncate":
        return data[: rng.randrange(len(data))]
    if kind == "flip":
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    if kind == "utf8":
        at = rng.randrange(len(data))
        return data[:at] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88"]) + data[at:]
    if kind == "nul":
        at = rng.randrange(len(data))
        return data[:at] + b"\x00" + data[at:]
    if kind == "huge":
        return data + b"#" * (2 << 20)  # over the 1 MiB spec limit
    if kind == "huge_line":
        return data + b"\n[train]\nx = \"" + b"a" * 900_000 + b"\"\n"
    if kind == "bom":
        return b"\xef\xbb\xbf" + data
    return bytes(rng.randrange(256) for _ in range(rng.randint(1, 200)))


def mutations(seed: int, count: int) -> Iterator[tuple[str, bytes]]:
    """``count`` (label, file bytes) pairs, the same for the same seed."""
    rng = random.Random(seed)
    seeds = seed_specs()
    for i in range(count):
        name, base = seeds[i % len(seeds)]
        r = rng.random()
        if r < 0.2:
            label, data = "text", _mutate_text(rng, to_toml(base))
        else:
            spec = copy.deepcopy(base)
            n = 1 if r < 0.8 else rng.randint(2, 4)
            text = ""
            for _ in range(n):
                text = _mutate_data(rng, spec)
            label, data = ("data" if n == 1 else "multi"), text.encode()
        yield f"{i:05d} {name} {label}", data


# -- one spec ------------------------------------------------------------------------------------
def check_file(path: str, forward_params: int = 2_000_000) -> dict[str, Any]:
    """Validate, size-check, build on meta and maybe run one spec file (in this process)."""
    import traceback

    from atlas_core.errors import AtlasError

    stage = "validate"
    try:
        from atlas_core.spec import load_spec
        from atlas_core.preflight import check_model_size

        spec = load_spec(Path(path))
        stage = "size"
        estimate = check_model_size(spec)
        stage = "meta"
        import torch

        from atlas_core.model import build_model

        depth = spec.model.get("depth")
        if isinstance(depth, int) and depth > WHOLE_BUILD_DEPTH:
            # as `atlas spec validate`: the preflight built one and two blocks on meta
            return {"outcome": "built", "stage": "size", "params": estimate, "estimate": estimate}
        with torch.device("meta"):
            model = build_model(spec)
        n = sum(p.numel() for p in model.parameters())
        del model
        if n <= forward_params:
            stage = "forward"
            torch.manual_seed(0)
            model = build_model(spec)
            vocab = int(spec.model.get("vocab_size") or 2)
            ids = torch.randint(0, vocab, (1, 8))
            with torch.no_grad():
                model(ids)
        return {"outcome": "built", "stage": stage, "params": n, "estimate": estimate}
    except AtlasError as exc:
        return {"outcome": "error", "stage": stage, "detail": str(exc).splitlines()[0][:300]}
    except BaseException as exc:  # noqa: BLE001 - anything else is what the fuzzer looks for
        if isinstance(exc, KeyboardInterrupt):
            raise
        tb = traceback.format_exc().strip().splitlines()
        return {"outcome": "crash", "stage": stage,
                "detail": f"{type(exc).__name__}: {str(exc)[:300]}", "where": tb[-3:-1]}


def _worker() -> None:
    """Answer one JSON line per spec path read on stdin."""
    import resource

    limit = int(os.environ.get("FUZZ_MEMORY_LIMIT", str(6 << 30)))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import torch

    torch.set_num_threads(1)
    fwd = int(os.environ.get("FUZZ_FORWARD_PARAMS", "2000000"))
    for line in sys.stdin:
        result = check_file(line.strip(), fwd)
        sys.stdout.write(json.dumps(result, default=str) + "\n")
        sys.stdout.flush()


class Worker:
    """A `_worker` subprocess; `ask` returns None when it does not answer in time."""

    def __init__(self, forward_params: int) -> None:
        env = {**os.environ, "FUZZ_FORWARD_PARAMS": str(forward_params), "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     env=env, cwd=ROOT)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)

    def ask(self, path: str, timeout: float) -> dict[str, Any] | None:
        self.proc.stdin.write(path + "\n")
        self.proc.stdin.flush()
        if not self.sel.select(timeout):
            return None
        line = self.proc.stdout.readline()
        if not line:  # the interpreter died (a signal, the memory limit)
            return {"outcome": "crash", "stage": "?", "detail": f"worker died ({self.proc.wait()})"}
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def run_cli(path: str, timeout: float) -> list[dict[str, Any]]:
    """The real commands on one file: [{command, outcome}] with error/ok/crash/hang."""
    out = []
    for cmd in (["spec", "validate", path], ["build", path, "--device", "meta"]):
        env = {k: v for k, v in os.environ.items() if k != "ATLAS_DEBUG"}
        try:
            p = subprocess.run([sys.executable, "-m", "cli", *cmd], capture_output=True, text=True,
                               timeout=timeout, cwd=ROOT, env={**env, "OMP_NUM_THREADS": "1"})
        except subprocess.TimeoutExpired:
            out.append({"command": cmd[0], "outcome": "hang"})
            continue
        text = p.stdout + p.stderr
        if "Traceback" in text or p.returncode not in (0, 1):
            outcome = "crash"
        else:
            outcome = "built" if p.returncode == 0 else "error"
        out.append({"command": cmd[0], "outcome": outcome, "rc": p.returncode,
                    "tail": text.strip().splitlines()[-1:] if outcome == "crash" else None})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=1200, help="mutated specs (default 1200)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per spec before a hang")
    ap.add_argument("--forward-params", type=int, default=2_000_000,
                    help="run one CPU forward for accepted specs up to this many parameters")
    ap.add_argument("--cli", type=int, default=0, help="also run N specs through the real commands")
    ap.add_argument("--cli-timeout", type=float, default=60.0)
    ap.add_argument("--json", help="write every result to this file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker()
        return 0

    results, counts, stages = [], Counter(), Counter()
    t0 = time.time()
    worker = Worker(args.forward_params)
    with tempfile.TemporaryDirectory(prefix="fuzz-specs-") as tmp:
        files = []
        for i, (label, data) in enumerate(mutations(args.seed, args.count)):
            path = os.path.join(tmp, f"spec{i:05d}.toml")
            Path(path).write_bytes(data)
            files.append((label, path))
            res = worker.ask(path, args.timeout)
            if res is None:
                res = {"outcome": "hang", "stage": "?", "detail": f"no answer in {args.timeout} s"}
            if res["outcome"] in ("hang", "crash"):
                worker.close()
                worker = Worker(args.forward_params)
                kept = os.path.join(tmp, "..", f"fuzz-{args.seed}-{i:05d}.toml")
                Path(kept).write_bytes(data)
                res["kept"] = os.path.abspath(kept)
                print(f"{res['outcome']}: {label}: {res.get('detail')} (kept {res['kept']})",
                      file=sys.stderr)
            counts[res["outcome"]] += 1
            stages[f"{res['outcome']}@{res['stage']}"] += 1
            results.append({"label": label, **res})
            if (i + 1) % 100 == 0:
                print(f"{i + 1}/{args.count}: {dict(counts)} ({time.time() - t0:.0f} s)", file=sys.stderr)
        worker.close()

        cli_counts: Counter = Counter()
        if args.cli:
            sample = random.Random(args.seed + 1).sample(files, min(args.cli, len(files)))
            for label, path in sample:
                for r in run_cli(path, args.cli_timeout):
                    cli_counts[f"{r['command']}:{r['outcome']}"] += 1
                    if r["outcome"] in ("hang", "crash"):
                        print(f"cli {r['outcome']}: {label}: {r}", file=sys.stderr)

    summary = {"count": args.count, "seed": args.seed, "outcomes": {k: counts[k] for k in OUTCOMES},
               "stages": dict(sorted(stages.items())), "cli": dict(sorted(cli_counts.items())),
               "seconds": round(time.time() - t0, 1)}
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "results": results}, indent=1,
                                              default=str))
    print(json.dumps(summary, indent=1))
    bad = counts["crash"] + counts["hang"] + sum(v for k, v in cli_counts.items()
                                                 if k.endswith((":crash", ":hang")))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
