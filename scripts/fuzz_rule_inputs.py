#!/usr/bin/env python3
"""Fuzz the inputs of ``rule(q, k, v, gates=..., state=...)`` for longer than the test suite does.

Every case is a valid call with one mutation (a wrong shape, rank, dtype, device ("meta") or
container; a missing or extra gate or state entry; NaN, inf or an out-of-range gate with and
without ``check_inputs=True``). A mutation the rule cannot take must end in a ValueError or
TypeError with a message; a valid call must run (`atlas_core.testing.fuzz_calls`). The exit
status is 1 when any case broke that contract; each is printed with the end of its traceback.

    python scripts/fuzz_rule_inputs.py --count 5000 --seed 0
    python scripts/fuzz_rule_inputs.py --count 2000 --spec zoo:gla --spec miras:memora
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=2000, help="mutated calls to make (default 2000)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the mutations (default 0)")
    ap.add_argument("--spec", action="append", default=None,
                    help="a rule preset or component name to fuzz (repeatable; default: a core "
                         "composition, titans:titans, omega:omega_titans, titans:titans_deep)")
    ap.add_argument("--show", type=int, default=20, help="broken cases to print (default 20)")
    args = ap.parse_args(argv)
    if args.count < 1:
        ap.error("--count must be at least 1")

    from atlas_core.testing.fuzz_calls import DEFAULT_SPECS, fuzz

    specs = tuple(args.spec) if args.spec else DEFAULT_SPECS
    t0 = time.perf_counter()
    bad, made = fuzz(specs, n=args.count, seed=args.seed)
    for o in bad[: args.show]:
        print(f"BROKEN {json.dumps(o.spec)} | {o.mutation}: expected {o.expected}, got {o.got}")
        for line in o.trace.rstrip().splitlines():
            print(f"    {line}")
    print(f"{made} calls on {len(specs)} rule(s) in {time.perf_counter() - t0:.1f} s: "
          f"{len(bad)} broke the contract")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
