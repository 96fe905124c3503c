"""``atlas plugins new NAMESPACE [--dist DIST] [--dir DIR]``: a plugin package that installs and
passes the kit.

    atlas plugins new acme                      # ./atlas-acme/: distribution atlas-acme, import atlas_acme
    atlas plugins new mesa --dist acme-mesa     # ./acme-mesa/: distribution acme-mesa, import acme_mesa
    pip install -e ./atlas-acme
    pytest atlas-acme/tests             # the conformance test it ships with passes as generated
    atlas check acme

The namespace (the entry point's name: components are ``NAMESPACE:*``) and the distribution (the
name pip installs, and the folder) are separate: ``--dist`` defaults to ``atlas-NAMESPACE``; the
import package is the distribution's name with ``-`` and ``.`` as ``_``. The package has a
pyproject with the entry point (``atlas_core.plugins: NAMESPACE``), an entry module that registers
one component (a bias ``NAMESPACE:scaled_l2`` with a param and a declared reduction) lazily, and a
conformance test written with `atlas_core.testing`. Edit from there; docs/plugins.md walks
through the same steps on the atlas-miras package.

Mounting: `register(app)` adds ``new`` to the ``plugins`` group (``plugins_app.command("new",
epilog=EPILOG)(new)``).
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import FormatOption, emit, examples, out_console

EPILOG = examples("atlas plugins new acme", "atlas plugins new mesa --dist acme-mesa",
                  "atlas plugins new acme --dir ~/src")
# used with fullmatch: `$` also matches before a final newline, which "acme\n" would pass
_NAME = re.compile(r"[a-z][a-z0-9_]*")
# a distribution name (PEP 508), lowercase: letters, digits, and - _ . between them
_DIST = re.compile(r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?")
RESERVED = {"core", "atlas", "test", "tests"}
# import names a plugin must not take: the project's own, and generic ones (docs/plugins.md step 1)
RESERVED_PACKAGES = {"atlas_core", "atlas_cli", "atlas_plugins", "plugins", "cli", "tests", "test",
                     "src", "torch"}

PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "{name}: memory-rule components for atlas_core"
readme = "README.md"
requires-python = ">=3.11"
dependencies = ["atlas-ttm>=0.1", "torch>=2.2,<3", "pydantic>=2.5,<3"]

[project.optional-dependencies]
test = ["pytest>=8"]

# The entry name is the plugin's namespace: its components are {name}:<component>.
[project.entry-points."atlas_core.plugins"]
{name} = "{pkg}.plugin"

[tool.setuptools.packages.find]
where = ["src"]

[tool.pytest.ini_options]
testpaths = ["tests"]
"""

INIT = '''\
"""{dist}: components for atlas_core, namespace ``{name}`` (registered by `{pkg}.plugin`)."""

__version__ = "0.1.0"
'''

PLUGIN = '''\
"""Entry module of the ``{name}`` plugin (entry point ``atlas_core.plugins: {name}``).

Keep it cheap to import: no torch here (the conformance check ``check_entry_module_light``
enforces it). Factories and params models are named as ``"module:attribute"`` strings.
"""

from __future__ import annotations

from atlas_core import hookimpl


@hookimpl
def atlas_register(registry):
    registry.add(
        "bias", "scaled_l2", "{pkg}.scaled_l2:build",
        params="{pkg}.scaled_l2:ScaledL2Params",
        summary="scale/2 ||M(phi(k)) - v||^2: the delta rule with its own step scale",
        # what `atlas check {name}` runs, and reductions the kit verifies (docs/plugins.md)
        check_cases=[{{"params": {{"scale": 0.5}}}}],
        reductions=[{{"name": "scale1_is_l2", "params": {{"scale": 1.0}}, "equals": {{"bias": "core:l2"}}}}],
    )
'''

COMPONENT = '''\
"""``{name}:scaled_l2``: the l2 attentional bias with a scale, ``l(M) = scale/2 ||e||^2``.

With ``e = M(phi(k_t)) - v_t`` the derivative w.r.t. the prediction is ``scale * e``; for a
linear memory the inner gradient is ``scale * e phi(k_t)^T``. ``scale = 1`` is ``core:l2``.

Shapes: ``pred, v: [B, H, N, Dv]`` (any leading axes); output the same shape.
"""

from __future__ import annotations

import torch
from pydantic import Field

from atlas_core.host.registry import Params
from atlas_core.knobs import Bias


class ScaledL2Params(Params):
    scale: float = Field(1.0, gt=0.0, description="multiplies the loss and its gradient")


class ScaledL2Bias(Bias):
    def __init__(self, scale: float = 1.0) -> None:
        self.scale = float(scale)

    def error(self, pred: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.scale * (pred - v)

    def loss(self, pred: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return 0.5 * self.scale * (pred - v).pow(2).sum(-1)


def build(params: ScaledL2Params | None, ctx) -> ScaledL2Bias:
    return ScaledL2Bias((params or ScaledL2Params()).scale)
'''

TEST = '''\
"""Conformance of every {name} component (atlas_core.testing)."""

from atlas_core.testing import Case, parametrize_with_checks


@parametrize_with_checks([
    Case("{name}:scaled_l2", params={{"scale": 0.5}}),
    Case("{name}:scaled_l2", params={{"scale": 2.0}}, rule={{"algorithm": "core:gd", "read": "before"}}),
])
def test_conformance(component, check):
    check(component)
'''

README = """\
# {dist}

Components for [atlas_core](https://example.invalid/atlas), namespace `{name}`.

```bash
pip install -e .
pytest tests            # the conformance kit on every component
atlas check {name}      # the same checks from the command line
```

Use it in a spec: `bias = {{ use = "{name}:scaled_l2", scale = 0.5 }}`.
"""


def package_names(name: str, dist: str | None = None) -> tuple[str, str]:
    """(distribution, import package) of a plugin with namespace ``name``: ``dist`` (default
    ``atlas-NAME``) checked, and its import name (``-`` and ``.`` as ``_``)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or keyword.iskeyword(name):
        raise ValueError(
            f"plugin name {name!r} must be a lowercase identifier (letters, digits, underscores, "
            "starting with a letter), e.g. 'acme' or 'my_rules'"
        )
    if name in RESERVED:
        raise ValueError(f"plugin name {name!r} is reserved; choose another, e.g. '{name}_rules'")
    dist = "atlas-" + name.replace("_", "-") if dist is None else dist
    if not isinstance(dist, str) or not _DIST.fullmatch(dist):
        raise ValueError(f"distribution name {dist!r} must be lowercase letters and digits, with "
                         "'-', '_' or '.' between them, e.g. 'acme-mesa'")
    pkg = re.sub(r"[-.]+", "_", dist)
    if not pkg.isidentifier() or keyword.iskeyword(pkg) or pkg[0].isdigit():
        raise ValueError(f"distribution name {dist!r} gives the import name {pkg!r}, which is not a "
                         "Python identifier; start it with a letter, e.g. 'acme-mesa'")
    if pkg in RESERVED_PACKAGES:
        raise ValueError(f"distribution name {dist!r} gives the generic import name {pkg!r}; use your "
                         f"own, e.g. 'acme-{name.replace('_', '-')}'")
    return dist, pkg


def scaffold(name: str, directory: Path, dist: str | None = None) -> tuple[Path, list[Path]]:
    """Write the package of namespace ``name`` and distribution ``dist`` (default
    ``atlas-NAME``); returns (its folder, the files written). Refuses to overwrite."""
    dist, pkg = package_names(name, dist)
    root = Path(directory).expanduser() / dist
    if root.exists() and any(root.iterdir()):
        raise ValueError(f"{root} exists and is not empty; pass another --dir or remove it")
    fields = {"name": name, "dist": dist, "pkg": pkg}
    files = {
        root / "pyproject.toml": PYPROJECT,
        root / "README.md": README,
        root / "src" / pkg / "__init__.py": INIT,
        root / "src" / pkg / "plugin.py": PLUGIN,
        root / "src" / pkg / "scaled_l2.py": COMPONENT,
        root / "tests" / "test_conformance.py": TEST,
    }
    for path, template in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(template.format(**fields), encoding="utf-8")
    return root, list(files)


def new(
    name: Annotated[str, typer.Argument(help="the plugin's namespace, e.g. acme (components acme:*)")],
    dist: Annotated[Optional[str], typer.Option(
        "--dist", help="the distribution's name (what pip installs, and the folder), e.g. acme-mesa; "
        "the import package is it with - as _ (default: atlas-NAME)")] = None,
    directory: Annotated[Optional[Path], typer.Option(
        "--dir", help="where to create the package's folder (default: the current directory)")] = None,
    fmt: FormatOption = None,
) -> None:
    """Create a plugin package: pyproject with the entry point, a component, a conformance test."""
    from atlas_core.host.manager import get_host

    rec = get_host().records.get(name)
    if rec is not None:
        raise ValueError(
            f"namespace {name!r} is already provided by {rec.distribution} ({rec.module}); two plugins "
            "cannot share a namespace, choose another name"
        )
    root, files = scaffold(name, directory or Path.cwd(), dist)
    dist, pkg = package_names(name, dist)
    data = {
        "path": str(root),
        "namespace": name,
        "distribution": dist,
        "package": pkg,
        "files": [str(p.relative_to(root)) for p in files],
        "next": [f"pip install -e {root}", f"pytest {root / 'tests'}", f"atlas check {name}"],
    }

    def human(d):
        con = out_console()
        con.print(f"created {d['path']}", markup=False)
        for f in d["files"]:
            con.print(f"  {f}", markup=False)
        con.print("next:", markup=False)
        for step in d["next"]:
            con.print(f"  {step}", markup=False)

    emit(data, fmt, human)


def register(app: typer.Typer) -> None:
    """Add ``new`` to the ``plugins`` group (idempotent: the group object is module-level)."""
    from .plugins import plugins_app

    names = {c.name for c in plugins_app.registered_commands}
    if "new" not in names:
        plugins_app.command("new", epilog=EPILOG)(new)
