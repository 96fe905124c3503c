"""The spec package sits on top of the core: the knobs, strategies, layers and models declare
their params through `atlas_core.params` and never load `atlas_core.spec` when imported, and no
chain of imports (inside functions included) leads from any module of atlas_core, the plugins or
the command line back to itself. No module takes another's private name (``_x``): what another
module needs is public."""

from __future__ import annotations

import subprocess
import sys

from .import_graph import cycles, edges, private_imports

SPEC = "atlas_core.spec"
# the layers above the spec package, which may import it at module level: training, the command
# line and the preflight that builds the model a spec describes (every other module that reads
# specs, e.g. `build_model`, the training API, the HF config, imports it where it is used)
ABOVE = ("atlas_core.train", "atlas_cli", "atlas_core.preflight")


def _is_spec(module: str) -> bool:
    return module == SPEC or module.startswith(SPEC + ".")


def test_no_module_below_the_spec_package_imports_it_at_module_level():
    graph = edges(module_level_only=True)
    offenders = sorted(
        f"{m} -> {t}" for m, targets in graph.items() for t in targets
        if _is_spec(t) and not _is_spec(m) and not m.startswith(ABOVE))
    assert not offenders, offenders


def test_no_import_cycle_runs_through_the_spec_package():
    through = [sorted(c) for c in cycles(edges()) if any(_is_spec(m) for m in c)]
    assert not through, through


def test_no_import_cycle_runs_through_the_training_package():
    """Training's modules import one another one way (errors and run-directory files at the
    bottom, the launcher at the top), counting imports inside functions."""
    train = "atlas_core.train"
    through = [sorted(c) for c in cycles(edges())
               if any(m == train or m.startswith(train + ".") for m in c)]
    assert not through, through


def test_no_import_cycle_anywhere():
    """The whole graph of atlas_core, the plugins and the command line (distributed/ included),
    counting imports inside functions: every module's imports lead only downward."""
    found = [sorted(c) for c in cycles(edges())]
    assert not found, found


def test_no_private_name_crosses_a_module_boundary():
    """``from m import _x`` or ``m._x`` (``m`` a module of ours) in another module: the name is
    part of m's interface, so it gets a public name."""
    found = private_imports()
    assert not found, "\n".join(found)


def test_the_private_name_finder_sees_both_forms(tmp_path, monkeypatch):
    """The finder itself, on a small tree of its own: ``from .a import _x`` and ``a._y`` after
    ``from . import a`` are found; a dunder, a module's own private names and a public name are not."""
    from . import import_graph

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("_x = 1\n_y = 2\nz = _x + _y\n__all__ = ['z']\n")
    (pkg / "b.py").write_text("from .a import _x, z, __all__\nfrom . import a\nprint(a._y, a.z)\n")
    monkeypatch.setattr(import_graph, "REPO", tmp_path)
    monkeypatch.setattr(import_graph, "ROOTS", {"pkg": "pkg"})
    assert import_graph.private_imports() == ["pkg/b.py:1: pkg.b -> pkg.a._x", "pkg/b.py:3: pkg.b -> pkg.a._y"]


def test_the_graph_sees_a_cycle_where_there_is_one():
    """The cycle finder itself: two modules importing each other inside functions."""
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": set()}
    assert cycles(graph) == [{"a", "b"}]


def test_importing_the_core_loads_no_spec_module():
    code = ("import sys, atlas_core.layer, atlas_core.lm, atlas_core.rule, atlas_core.model, "
            "atlas_core.strategies.chunkwise, atlas_core.strategies.exact_chunk, "
            "atlas_plugins.titans.mac, atlas_plugins.omega.window, atlas_plugins.mru.lm; "
            "print(sorted(m for m in sys.modules if m.startswith('atlas_core.spec')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


#: where smaller circles used to be: the rule and its builders, the conformance kit (its runner and
#: its checks), the CUDA plugin (the probe and its availability, the launchers and the verifier)
CYCLE_FREE = ("atlas_core.rule", "atlas_core.rule_build", "atlas_core.composed_rule", "atlas_core.testing",
              "atlas_plugins.cuda_backend")


def test_no_import_cycle_runs_through_the_rule_the_kit_or_the_cuda_plugin():
    def inside(module: str) -> bool:
        return any(module == p or module.startswith(p + ".") for p in CYCLE_FREE)

    through = [sorted(c) for c in cycles(edges()) if any(inside(m) for m in c)]
    assert not through, through
