"""The spec package sits on top of the core: the knobs, strategies, layers and models declare
their params through `atlas_core.params` and never load `atlas_core.spec` when imported, and no
chain of imports (inside functions included) leads from the spec package back to itself."""

from __future__ import annotations

import subprocess
import sys

from .import_graph import cycles, edges

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
