"""Registering the Hugging Face classes without importing ``transformers`` from ``atlas_core``.

``import atlas_core`` calls `install`, which costs a few microseconds and imports nothing:

- when ``transformers``' auto classes are already imported, they are registered at once;
- otherwise a finder on ``sys.meta_path`` watches for two modules, and registers right after
  each finishes loading: ``transformers.models.auto.configuration_auto`` (where ``AutoConfig``
  lives: the config class is registered) and ``transformers.models.auto.modeling_auto`` (where
  ``AutoModelForCausalLM`` lives: the model class is registered). Every other import passes
  after one dictionary lookup, and the finder removes itself once both have fired.

So ``AutoConfig`` / ``AutoModelForCausalLM`` know the ``atlas_memory`` model type whatever the
import order, and a program that never touches ``transformers`` pays nothing. A registration
that fails (``transformers`` too old, or broken) is one warning, never an exception in the
user's import of ``transformers`` or of ``atlas_core``.

This module uses the standard library only.
"""

from __future__ import annotations

import sys
import threading
import warnings
from importlib.abc import MetaPathFinder
from typing import Callable

CONFIG_MODULE = "transformers.models.auto.configuration_auto"
MODEL_MODULE = "transformers.models.auto.modeling_auto"

_lock = threading.RLock()
_done: set[str] = set()


def _register_config() -> None:
    from .register import register_config

    register_config()


def _register_model() -> None:
    from .register import register_config, register_model

    register_config()  # the model mapping is keyed by the config class
    register_model()


_ACTIONS: dict[str, Callable[[], None]] = {CONFIG_MODULE: _register_config, MODEL_MODULE: _register_model}


def _fire(module: str) -> None:
    """Run the registration tied to ``module`` once; a failure is a warning."""
    with _lock:
        if module in _done:
            return
        _done.add(module)
    try:
        _ACTIONS[module]()
    except Exception as exc:  # noqa: BLE001 - never break the user's import of transformers
        warnings.warn(
            f"atlas_core: the Hugging Face classes were not registered with transformers ({exc}); "
            "AutoModelForCausalLM cannot open atlas checkpoints in this process. The integration "
            "needs transformers>=5 (pip install 'atlas-ttm[hf]').",
            RuntimeWarning, stacklevel=2,
        )
    if _done >= set(_ACTIONS):
        _uninstall()


class _AutoWatcher(MetaPathFinder):
    """Finds nothing itself: for a watched module, finds its spec with the other finders and
    wraps the loader's ``exec_module`` so that the registration runs after the module loaded."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: D401 - importlib protocol
        if fullname not in _ACTIONS or fullname in _done:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        original = getattr(loader, "exec_module", None)
        if original is None:
            return spec

        def exec_module(module, _original=original, _name=fullname):
            _original(module)
            _fire(_name)

        try:
            loader.exec_module = exec_module  # this loader instance serves this module only
        except (AttributeError, TypeError):
            return spec
        return spec


_watcher = _AutoWatcher()


def _uninstall() -> None:
    with _lock:
        try:
            sys.meta_path.remove(_watcher)
        except ValueError:
            pass


def install() -> None:
    """Register now for the auto modules already imported; watch for the others. Never raises."""
    try:
        for module in _ACTIONS:
            if module in sys.modules:
                _fire(module)
        with _lock:
            if not _done >= set(_ACTIONS) and _watcher not in sys.meta_path:
                sys.meta_path.insert(0, _watcher)
    except Exception:  # noqa: BLE001 - `import atlas_core` must not fail because of this hook
        pass
