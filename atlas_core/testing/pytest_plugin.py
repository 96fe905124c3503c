"""pytest plugin of the conformance kit (entry point ``pytest11: atlas_core``).

Loaded by every pytest run in an environment where atlas-ttm is installed, so it stays light
and can never break a run: it imports only the standard library and the kit's torch-free config,
and everything that could fail (reading plugin metadata for the header) is guarded.

- options ``--atlas-device`` (default ``cpu``) and ``--atlas-dtype`` (``float64`` | ``float32``,
  the dtype of the equivalence checks) — see `atlas_core.testing.config`;
- a report-header line listing the installed atlas plugins (read from entry-point metadata; no
  plugin is imported, torch is not imported);
- the marker ``atlas_conformance``, put on every test `parametrize_with_checks` generates, so
  ``-m atlas_conformance`` / ``-m "not atlas_conformance"`` select them.
"""

from __future__ import annotations

GROUP = "atlas_core.plugins"


def pytest_addoption(parser) -> None:
    group = parser.getgroup("atlas", "atlas_core conformance kit")
    group.addoption(
        "--atlas-device", action="store", default=None, metavar="DEVICE",
        help="device the conformance checks run on (default: cpu), e.g. cuda",
    )
    group.addoption(
        "--atlas-dtype", action="store", default=None, choices=("float64", "float32"),
        help="dtype of the kit's equivalence checks (default: float64; float32 loosens tolerances)",
    )
    group.addoption(
        "--atlas-strategies", action="store", default=None, metavar="NAMES",
        help="compare rules and knobs under these strategies (comma-separated names or namespaces) "
             "instead of the bundled ones",
    )


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "atlas_conformance: a conformance-kit check of one component (atlas_core.testing)",
    )
    device = config.getoption("atlas_device", default=None)
    dtype = config.getoption("atlas_dtype", default=None)
    strategies = config.getoption("atlas_strategies", default=None)
    if device or dtype or strategies:
        from .config import configure

        configure(device=device, dtype=dtype, strategies=strategies)


def installed_plugins() -> list[tuple[str, str, str]]:
    """(namespace, distribution, version) of every entry point of the plugin group, sorted with
    the core first; nothing is imported."""
    from importlib import metadata

    seen: dict[str, tuple[str, str, str]] = {}
    for ep in metadata.entry_points(group=GROUP):
        dist = getattr(ep, "dist", None)
        name = (dist.metadata["Name"] if dist is not None else None) or "?"
        version = (dist.version if dist is not None else None) or "?"
        seen.setdefault(ep.name, (ep.name, name, version))
    return sorted(seen.values(), key=lambda r: (r[0] != "core", r[0]))


def pytest_report_header(config) -> list[str]:
    try:
        rows = installed_plugins()
        text = ", ".join(f"{ns} ({dist} {ver})" for ns, dist, ver in rows) or "none"
        from .config import CONFIG

        return [f"atlas plugins: {text}", f"atlas kit: device={CONFIG.device} dtype={CONFIG.dtype}"]
    except Exception as exc:  # noqa: BLE001 - a header must never break a test run
        return [f"atlas plugins: could not be listed ({type(exc).__name__}: {exc})"]
