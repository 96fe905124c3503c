"""pytest plugin of the conformance kit (entry point ``pytest11: atlas_core``).

Loaded by every pytest run in an environment where atlas-ttm is installed, so it stays light
and can never break a run: at start-up it imports only the standard library and the kit's
torch-free config; the header loads the plugin host (pluggy, pydantic and the plugins' entry
modules, which are light by contract: no torch), and everything that could fail is guarded.

- options ``--atlas-device`` (default ``cpu``) and ``--atlas-dtype`` (``float64`` | ``float32``,
  the dtype of the equivalence checks) — see `atlas_core.testing.config`;
- report-header lines: the atlas plugins that loaded, each with the distribution that owns its
  namespace, then each plugin that was refused (a squatter on a bundled namespace, a namespace
  claimed twice), failed to load or is disabled, with its reason;
- the marker ``atlas_conformance``, put on every test `parametrize_with_checks` generates, so
  ``-m atlas_conformance`` / ``-m "not atlas_conformance"`` select them.
"""

from __future__ import annotations



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
    """(namespace, distribution, version) of every plugin the host loaded, the core first: the
    owner of each namespace, never a refused claimant."""
    return [(r.namespace, r.distribution, r.version) for r in _records() if r.status == "ok"]


def _records() -> list:
    """The plugin records of a fresh host (not the process-wide one, which tests replace): entry
    modules are light by contract (check_entry_module_light), so this imports no torch."""
    from atlas_core.host.manager import PluginHost

    host = PluginHost(strict=False).load_entry_points()
    return sorted(host.records.values(), key=lambda r: (r.namespace != "core", r.namespace))


def header_lines(records: list) -> list[str]:
    """The report-header lines: the plugins that loaded, with their distributions, then one line
    per plugin that was refused, failed or is disabled, with the reason's first line."""
    ok = [r for r in records if r.status == "ok"]
    lines = ["atlas plugins: " + (", ".join(f"{r.namespace} ({r.distribution} {r.version})" for r in ok)
                                  or "none")]
    for r in records:
        if r.status in ("refused", "failed", "disabled"):
            why = (r.error or "ATLAS_DISABLE_PLUGINS").splitlines()[0]
            why = why if len(why) <= 160 else why[:157] + "..."
            ns = r.namespace.split(" (", 1)[0]  # a refused claimant's record is "ns (its dist)"
            lines.append(f"atlas plugin {r.status}: {ns} ({r.distribution} {r.version}): {why}")
    return lines


def pytest_report_header(config) -> list[str]:
    try:
        from .config import CONFIG

        return header_lines(_records()) + [f"atlas kit: device={CONFIG.device} dtype={CONFIG.dtype}"]
    except Exception as exc:  # noqa: BLE001 - a header must never break a test run
        return [f"atlas plugins: could not be listed ({type(exc).__name__}: {exc})"]
