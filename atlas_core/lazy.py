"""Attributes a package loads on first use (PEP 562), so that importing it stays cheap.

    _LAZY = {"build_rule": "atlas_core.rule:build_rule", "train": "atlas_core.train"}
    __getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals(), __all__)

A value is ``"module:attribute"`` (or a bare ``"module"`` for the module itself); the first
access imports it and stores it in the package's namespace, so later accesses cost nothing.
Standard library only.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable, Mapping


def lazy_attributes(package: str, table: Mapping[str, str], namespace: dict[str, Any],
                    names: Iterable[str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` for the attributes of ``table``;
    ``names``: what ``dir(package)`` lists."""
    listed = sorted(names)

    def __getattr__(name: str) -> Any:
        ref = table.get(name)
        if ref is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = ref.partition(":")
        value = importlib.import_module(module)
        if attr:
            value = getattr(value, attr)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return list(listed)

    return __getattr__, __dir__
