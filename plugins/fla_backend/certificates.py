"""Certificates: which fla backends passed the conformance kit on which device.

"auto" hands a call to an fla backend only when a certificate for it exists for the device, the
installed fla-core, this atlas and the installed Triton (fla's kernels are compiled by Triton on
the device; a change of any of the four means the kernels were never checked as they now run).
`atlas fla certify` writes them (`certify.certify`), `atlas fla revoke` removes them.

The file is JSON, ``$ATLAS_FLA_CERTIFICATES`` or ``$XDG_CACHE_HOME/atlas/fla_certificates.json``
(``~/.cache/...``)::

    {"format": "atlas-fla-certificates/1",
     "records": [{"backend": "fla:gla", "device": "NVIDIA H100 80GB HBM3 (sm_90)",
                  "fla": "0.6.0", "atlas": "0.1.0", "triton": "3.4.0",
                  "checked": "2026-01-02T03:04:05Z", "cases": [...], "calls": 6}]}

It is written atomically (a temporary file, then a rename). An unreadable file certifies nothing
and says why. Nothing here imports torch or fla.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

PATH_ENV = "ATLAS_FLA_CERTIFICATES"
FORMAT = "atlas-fla-certificates/1"
KEY_FIELDS = ("backend", "device", "fla", "atlas", "triton")
_WRITES = [0]  # certificates written or revoked by this process (answers cached per call read it)


def generation() -> int:
    """Changes whenever this process writes the file (so per-call caches know to look again)."""
    return _WRITES[0]


def path() -> Path:
    raw = os.environ.get(PATH_ENV, "").strip()
    if raw:
        return Path(raw).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join("~", ".cache")
    return Path(base).expanduser() / "atlas" / "fla_certificates.json"


def _version(*dists: str) -> str:
    from importlib import metadata

    for d in dists:
        try:
            return metadata.version(d)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def versions() -> dict[str, str]:
    """The software a certificate holds for: fla-core (fla's ops), atlas, Triton."""
    from atlas_core import __version__

    return {"fla": _version("fla-core", "flash-linear-attention"), "atlas": __version__,
            "triton": _version("triton")}


def key(backend: str, device: str) -> dict[str, str]:
    return {"backend": backend, "device": device, **versions()}


def _same(rec: dict, k: dict) -> bool:
    return all(rec.get(f) == k[f] for f in KEY_FIELDS)


def load() -> tuple[list[dict[str, Any]], str]:
    """``(records, "")``, or ``([], why)`` when the file is missing or unreadable."""
    p = path()
    if not p.exists():
        return [], f"no certificate file ({p})"
    try:
        data = json.loads(p.read_text())
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("records"), list):
            raise ValueError(f"not an {FORMAT} file")
    except Exception as exc:  # noqa: BLE001 - a broken file certifies nothing, with the reason
        return [], f"the certificate file {p} is unreadable ({type(exc).__name__}: {exc})"
    return [r for r in data["records"] if isinstance(r, dict)], ""


def find(backend: str, device: str) -> tuple[dict | None, str]:
    """The certificate of ``backend`` on ``device`` for the installed versions, or ``(None, why)``."""
    records, why = load()
    k = key(backend, device)
    for rec in records:
        if _same(rec, k):
            return rec, ""
    held = sorted({f"fla {r.get('fla')}, atlas {r.get('atlas')}, triton {r.get('triton')}"
                   for r in records if r.get("backend") == backend and r.get("device") == device})
    what = (f"no certificate for {backend} on {device} with fla {k['fla']}, atlas {k['atlas']}, "
            f"triton {k['triton']}")
    if held:
        what += f" (it was certified there with {'; '.join(held)})"
    elif why:
        what += f": {why}"
    return None, what


def _write(records: list[dict]) -> None:
    p = path()
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"format": FORMAT, "records": records}, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, p)
    _WRITES[0] += 1


def record(backend: str, device: str, **details: Any) -> dict:
    """Write (or replace) the certificate of ``backend`` on ``device`` for the installed versions."""
    records, _ = load()
    k = key(backend, device)
    rec = {**details, **k, "checked": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _write([r for r in records if not _same(r, k)] + [rec])
    return rec


def revoke(backend: str, device: str) -> bool:
    """Remove the certificate of ``backend`` on ``device`` for the installed versions; whether
    there was one."""
    records, _ = load()
    k = key(backend, device)
    kept = [r for r in records if not _same(r, k)]
    if len(kept) != len(records):
        _write(kept)
        return True
    return False
