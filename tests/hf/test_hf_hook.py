"""Registration with transformers' auto classes happens in either import order, ``import
atlas_core`` never imports transformers, and a missing or too-old transformers never breaks an
import. Each case runs in a fresh interpreter (the import order is the point)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(code: str, *, path: list[Path] = ()) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, path), str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)


def test_import_atlas_core_imports_neither_transformers_nor_torch():
    res = run("""
        import sys
        import atlas_core
        from atlas_core.hf import hook
        print(sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'torch')))
        print(hook._watcher in sys.meta_path)
    """)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:2] == ["[]", "True"]


def test_registered_when_transformers_is_imported_first(tmp_path):
    pytest.importorskip("transformers", reason="needs transformers (pip install 'atlas-ttm[hf]')")
    res = run("""
        from transformers import AutoConfig, AutoModelForCausalLM
        import atlas_core
        from atlas_core.hf import AtlasConfig, AtlasForCausalLM, hook
        import sys
        assert type(AutoConfig.for_model("atlas_memory")) is AtlasConfig
        assert AutoModelForCausalLM._model_mapping[AtlasConfig] is AtlasForCausalLM
        print(hook._watcher in sys.meta_path)
    """)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"  # nothing left to watch


def test_a_too_old_transformers_is_a_warning_not_an_error(tmp_path):
    """A stand-in ``transformers`` 4.0 package: importing its auto module warns once, and
    ``import atlas_core`` and the import itself succeed."""
    auto = tmp_path / "transformers" / "models" / "auto"
    auto.mkdir(parents=True)
    (tmp_path / "transformers" / "__init__.py").write_text("__version__ = '4.0.0'\n")
    (tmp_path / "transformers" / "models" / "__init__.py").write_text("")
    (auto / "__init__.py").write_text("")
    (auto / "configuration_auto.py").write_text("VALUE = 1\n")
    res = run("""
        import warnings
        import atlas_core
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import transformers.models.auto.configuration_auto as m
        assert m.VALUE == 1
        print(len(caught)); print(caught[0].message)
    """, path=[tmp_path])
    assert res.returncode == 0, res.stderr
    count, message = res.stdout.split("\n", 1)
    assert count == "1" and "transformers 4.0.0 is installed" in message and "transformers>=5" in message


def test_missing_transformers_leaves_atlas_core_working():
    res = run("""
        import sys
        sys.modules["transformers"] = None  # as if not installed
        import atlas_core
        atlas_core.load_spec("examples/titans_mag.toml")
        try:
            from atlas_core.hf import export_checkpoint
            export_checkpoint("nowhere", "out")
        except ImportError as exc:
            print(type(exc).__name__, exc)
    """)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("HFUnavailableError") and "pip install 'atlas-ttm[hf]'" in res.stdout
