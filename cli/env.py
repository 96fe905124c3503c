"""``atlas env``: versions, devices, plugins, and which kernel backends each strategy could use.

Triton's version is read from the installed package's metadata: the CLI never imports Triton
itself (a backend's availability probe may).
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from typing import Any

from .common import FormatOption, emit, examples, out_console


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _devices() -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"cpu": {"threads": torch.get_num_threads()}}
    cuda = torch.cuda.is_available()
    out["cuda"] = {
        "available": cuda,
        "version": torch.version.cuda,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
    }
    mps = getattr(torch.backends, "mps", None)
    out["mps"] = {"available": bool(mps and mps.is_available())}
    return out


def env_report() -> dict[str, Any]:
    import torch

    from atlas_core import __version__
    from atlas_core.backends import explain
    from atlas_core.host.manager import get_host

    host = get_host()
    reg = host.registry
    strategies = {c.name: explain(c.name, reg) for c in reg.all("strategy")}
    return {
        "atlas_core": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "devices": _devices(),
        "plugins": [{"namespace": r.namespace, "distribution": r.distribution, "version": r.version,
                     "status": r.status, "error": r.error} for r in host.records.values()],
        "strategies": strategies,
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith("ATLAS_") or k == "TRITON_INTERPRET"},
    }


def env(fmt: FormatOption = None) -> None:
    """Show versions, devices, plugins and the kernel backends of every strategy."""
    data = env_report()

    def human(d):
        from rich.markup import escape

        con = out_console()
        con.print(f"atlas_core {d['atlas_core']}  python {d['python']}  torch {d['torch']}  "
                  f"triton {d['triton'] or 'not installed'}")
        con.print(f"platform: {escape(d['platform'])}")
        dev = d["devices"]
        cuda = dev["cuda"]
        con.print(f"devices: cpu ({dev['cpu']['threads']} threads)"
                  + (f", cuda {cuda['version']}: {', '.join(cuda['devices'])}" if cuda["available"] else ", no cuda")
                  + (", mps" if dev["mps"]["available"] else ""))
        con.print("plugins:")
        for p in d["plugins"]:
            line = f"  {p['namespace']}  {p['distribution']} {p['version']}  {p['status']}"
            con.print(line + (f"  ({p['error']})" if p["error"] else ""), markup=False)
        con.print("strategies and their backends:")
        for name, rows in d["strategies"].items():
            if not rows:
                con.print(f"  {name}: no kernel backends (PyTorch code)", markup=False)
            for r in rows:
                why = f" ({r['reason']})" if r["reason"] else ""
                con.print(f"  {name}: {r['backend']} priority {r['priority']}: {r['status']}{why}", markup=False)
        if d["environment"]:
            con.print("environment: " + ", ".join(f"{k}={v}" for k, v in d["environment"].items()), markup=False)

    emit(data, fmt, human)


def register(app) -> None:
    app.command("env", epilog=examples("atlas env", "atlas --format json env"))(env)
