"""`certify`: run the conformance kit on the fla backends on this device and record the ones
that passed (`certificates`), what `atlas fla certify` does.

For each backend: its declared cases (`atlas check fla:<op>`: each preset the op computes, at
T = 70 and head dims of 16) through every check the kit selects for a backend, on this device.
It is certified when no check failed, ``check_backend_matches_reference`` passed in every case
(outputs, final state and gradients through the backend equal the strategy's PyTorch code), and
the backend really served calls meanwhile (`backend.SERVED`): a strategy that does not hand calls
to its backends would let that check compare the PyTorch code with itself. Anything else leaves
the backend uncertified (an earlier certificate for the same key is revoked), with the reason.
"""

from __future__ import annotations

from typing import Any, Iterable

REFERENCE_CHECK = "check_backend_matches_reference"


def backend_names(registry=None) -> list[str]:
    if registry is None:
        from atlas_core.host.manager import get_registry

        registry = get_registry()
    return [c.name for c in registry.all("backend") if c.namespace == "fla"]


def kit_device() -> str:
    """Where the kit builds its tensors: the current CUDA device, or the CPU under the stand-in."""
    import torch

    from .availability import stand_in

    if stand_in() is not None or not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{torch.cuda.current_device()}"


def certify(names: Iterable[str] | None = None, *, progress: Any = None) -> list[dict[str, Any]]:
    """Run the kit on ``names`` (default: every fla backend) on this device; record or revoke each
    one's certificate. One row per backend: ``backend``, ``device``, ``certified``, ``reason``,
    ``calls``, ``checks`` (``{case: {check: status}}``)."""
    from atlas_core.testing import cases_for_target, configure, run_cases
    from atlas_core.testing.config import CONFIG

    from . import certificates
    from .availability import available, device_name
    from .backend import SERVED

    names = list(names) if names is not None else backend_names()
    ok, why = available()
    device = kit_device()
    where = device_name(device) if ok else None
    before = CONFIG.device
    rows = []
    try:
        configure(device=device)
        for name in names:
            row = {"backend": name, "device": where, "certified": False, "reason": "", "calls": 0, "checks": {}}
            rows.append(row)
            if not ok:
                row["reason"] = f"not available here: {why}"
                continue
            start = SERVED[name]
            results = run_cases(cases_for_target(name), progress=progress)
            row["calls"] = SERVED[name] - start
            for r in results:
                row["checks"].setdefault(r.case, {})[r.name] = r.status
            failed = [r for r in results if r.status == "failed"]
            ref = [r for r in results if r.name == REFERENCE_CHECK]
            if failed:
                first = failed[0]
                row["reason"] = f"{len(failed)} check(s) failed; {first.case} {first.name}: {first.message}"
            elif not ref or any(r.status != "passed" for r in ref):
                bad = next((r for r in ref if r.status != "passed"), None)
                row["reason"] = (f"{REFERENCE_CHECK} did not pass in every case"
                                 + (f" ({bad.case}: {bad.status}: {bad.reason or bad.message})" if bad else
                                    " (it was not run)"))
            elif row["calls"] == 0:
                strategy = _strategy(name)
                row["reason"] = (
                    f"the kit's calls never reached it: {strategy} ran them with its PyTorch code "
                    f"(a strategy that does not hand calls to kernel backends; docs/kernels.md, "
                    f"\"fla's chunk kernels\")")
            else:
                row["certified"] = True
                certificates.record(name, where, calls=row["calls"], cases=sorted(row["checks"]))
            if not row["certified"]:
                certificates.revoke(name, where)
    finally:
        configure(device=before)
    return rows


def _strategy(name: str) -> str:
    from atlas_core.host.manager import get_registry

    return get_registry().get("backend", name).extra.get("strategy", "its strategy")
