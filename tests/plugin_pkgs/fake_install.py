"""Make a package of this folder importable with its entry points, without pip: a ``.dist-info``
directory written from its pyproject.toml (name, version, entry points) in a temporary folder, put
on ``sys.path`` (or on PYTHONPATH for a subprocess) beside the package's ``src``."""

from __future__ import annotations

import os
import sys
import tomllib
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent


def fake_install(package: str, where: Path) -> list[str]:
    """Write the dist-info of ``tests/plugin_pkgs/<package>`` under ``where``; returns the paths to
    put first on ``sys.path`` (the dist-info's folder, the package's ``src``)."""
    root = HERE / package
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    name, version = project["name"], project["version"]
    info = where / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = []
    for group, eps in project.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines += [f"{k} = {v}" for k, v in eps.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return [str(where), str(root / "src")]


def install_in_process(package: str, where: Path, monkeypatch) -> None:
    """`fake_install` for this process (undone by ``monkeypatch``); the package's modules are
    forgotten so that they import from here."""
    for path in reversed(fake_install(package, where)):
        monkeypatch.syspath_prepend(path)
    prefix = f"atlas_{package}"
    for mod in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
        monkeypatch.delitem(sys.modules, mod)


def subprocess_env(package: str, where: Path, **extra: str) -> dict[str, str]:
    """The environment of a subprocess that sees the package installed."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS",)}
    paths = fake_install(package, where) + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra)
    return env


@contextmanager
def installed_host(package: str, namespace: str, where: Path, monkeypatch):
    """The plugin host with ``tests/plugin_pkgs/<package>`` installed (`install_in_process`),
    loaded strictly, as the process-wide host (the old one comes back afterwards); nothing
    allowed for ``"auto"`` and the kit comparing under the bundled strategies."""
    from atlas_core.host import manager
    from atlas_core.host.manager import PluginHost
    from atlas_core.strategies import trust
    from atlas_core.testing.config import CONFIG

    for name in (trust.ALLOW_ENV, "ATLAS_CHECK_STRATEGIES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(trust, "_announced", set())
    monkeypatch.setattr(CONFIG, "strategies", None)
    install_in_process(package, where, monkeypatch)
    old = manager._HOST
    host = PluginHost(strict=True).load_entry_points()
    assert host.records[namespace].status == "ok", host.records[namespace].error
    manager.reset_host(host)
    try:
        yield host
    finally:
        manager.reset_host(old)
