"""Command-line overrides of a spec: ``KEY.PATH=VALUE`` applied to the spec before validation.

    atlas train examples/titans_lmm.toml model.d_model=64 train.lr=1e-3 --steps 5

An override names a dotted path into the spec's tables (``model.d_model``, ``train.lr``,
``memory.parallel.chunk_size``, ``layer.gate_bias.alpha``) and a value written as a TOML literal:
``64``, ``1e-3``, ``true``, ``"core:l2"``, ``[0.9, 0.99]``, ``{use = "mqar", num_pairs = 4}``.
Text that is no TOML literal is taken as a string, so ``memory.bias=core:l2`` needs no quotes.

Rules (`apply_overrides`):

- overrides are applied in order to a copy of the spec's raw tables (what the file says, before
  any default is filled); a later override of the same path wins;
- a missing table on the way is created (``train.lr=1e-3`` on a spec without ``[train]``);
- a component written as a name alone is a table with that ``use``: ``memory.bias.scale=2`` on
  ``bias = "core:l2"`` gives ``bias = {use = "core:l2", scale = 2}``;
- a path through a value that is not a table is an error (``model.d_model.x=1``).

The result is then resolved like a file, so a bad override gets the same dotted-path error as a
bad file (an unknown key gets a "did you mean"), and `annotate` adds to each problem the override
that set it. The common flags (`COMMON_FLAGS`: ``--lr``, ``--batch-size``, ``--steps``,
``--seq-len``, ``--seed``, ``--device``) are the overrides of the ``[train]`` keys of the same name.

Nothing here imports torch; `resolve_with_overrides` imports the spec resolver when called.
"""

from __future__ import annotations

import copy
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..errors import Issue, SpecError

# keyword / flag name -> dotted path of the [train] key it sets (atlas_core.train.params)
COMMON_FLAGS: dict[str, str] = {
    "steps": "train.steps",
    "lr": "train.lr",
    "batch_size": "train.batch_size",
    "seq_len": "train.seq_len",
    "seed": "train.seed",
    "device": "train.device",
}

_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class Override:
    """One override: ``path`` (the keys, outermost first), ``value``, and ``origin``: how the
    user wrote it (``model.d_model=64``, ``--lr 0.001``), used to name it in errors."""

    path: tuple[str, ...]
    value: Any
    origin: str = ""

    @property
    def key(self) -> str:
        return ".".join(self.path)

    def __str__(self) -> str:
        return self.origin or f"{self.key}={self.value!r}"


def _usage(text: str, problem: str, fix: str) -> SpecError:
    return SpecError([Issue("", f"override {text!r}: {problem}", None, fix)])


def parse_value(text: str) -> Any:
    """A TOML literal (``64``, ``1e-3``, ``true``, ``"x"``, ``[1, 2]``, ``{a = 1}``), or, when
    ``text`` is none, ``text`` itself as a string (surrounding spaces removed)."""
    stripped = text.strip()
    if not stripped:
        return ""
    try:
        return tomllib.loads(f"v = {stripped}")["v"]
    except tomllib.TOMLDecodeError:
        return stripped


def parse_key(key: str, text: str | None = None) -> tuple[str, ...]:
    """``"model.d_model"`` -> ``("model", "d_model")``; each key is a bare TOML key."""
    where = text if text is not None else key
    parts = tuple(p.strip() for p in key.strip().split("."))
    if not parts or not all(_SEGMENT.fullmatch(p) for p in parts):
        raise _usage(where, f"{key.strip()!r} is not a dotted key path",
                     "write KEY.PATH=VALUE with letters, digits, '_' or '-' between the dots, "
                     "e.g. model.d_model=64")
    return parts


def is_override(arg: str) -> bool:
    """Whether a command-line word is a ``KEY=VALUE`` override (rather than a file)."""
    if "=" not in arg:
        return False
    key = arg.split("=", 1)[0]
    return bool(key) and all(_SEGMENT.fullmatch(p) for p in key.split("."))


def parse_override(text: str) -> Override:
    """``"train.lr=1e-3"`` -> ``Override(("train", "lr"), 0.001, "train.lr=1e-3")``."""
    if "=" not in text:
        raise _usage(text, "no '=' in it", "write KEY.PATH=VALUE, e.g. train.lr=1e-3")
    key, _, value = text.partition("=")
    return Override(parse_key(key, text), parse_value(value), text)


def parse_overrides(texts: Iterable[str]) -> list[Override]:
    """Every ``KEY=VALUE`` text parsed; all malformed ones reported together."""
    out, issues = [], []
    for text in texts:
        try:
            out.append(parse_override(text))
        except SpecError as exc:
            issues.extend(exc.issues)
    if issues:
        raise SpecError(issues)
    return out


def from_mapping(mapping: Mapping[str, Any], origin: str = "") -> list[Override]:
    """Overrides from keyword-style pairs: a dotted key sets that path to its value, as on the
    command line (a table value replaces the table there: ``{"train.task": {"use": "copy"}}``);
    a single key with a non-empty table value sets each of its keys, so
    ``{"model": {"d_model": 64}}`` changes ``model.d_model`` only."""
    out: list[Override] = []

    def add(path: tuple[str, ...], value: Any) -> None:
        out.append(Override(path, copy.deepcopy(value), f"{origin}{'.'.join(path)}={value!r}"))

    for k, v in mapping.items():
        path = parse_key(str(k))
        if len(path) == 1 and isinstance(v, Mapping) and v:
            for sub, value in v.items():
                add(path + parse_key(str(sub)), value)
        else:
            add(path, v)
    return out


def flag_overrides(**flags: Any) -> list[Override]:
    """Overrides for the common flags that were given (None: not given), e.g.
    ``flag_overrides(lr=1e-3, steps=None)`` -> ``[Override(("train", "lr"), 0.001, "--lr 0.001")]``."""
    out = []
    for name, value in flags.items():
        if name not in COMMON_FLAGS:
            raise TypeError(f"no common flag {name!r}; they are {', '.join(COMMON_FLAGS)}")
        if value is not None:
            flag = "--" + name.replace("_", "-")
            out.append(Override(tuple(COMMON_FLAGS[name].split(".")), value, f"{flag} {value}"))
    return out


def split_args(args: Iterable[str]) -> tuple[list[str], list[str]]:
    """Command-line words -> ``(files, overrides)``: a word is an override when it has the form
    ``KEY.PATH=VALUE`` and is not an existing file or a ``.toml`` path."""
    files, overrides = [], []
    for arg in args:
        if is_override(arg) and not arg.endswith(".toml") and not Path(arg).exists():
            overrides.append(arg)
        else:
            files.append(arg)
    return files, overrides


# -- applying -----------------------------------------------------------------------------------
def apply_overrides(data: Mapping[str, Any], overrides: Iterable[Override]) -> dict[str, Any]:
    """A deep copy of ``data`` with every override set (see the module docstring)."""
    out = copy.deepcopy(dict(data))
    issues = []
    for ov in overrides:
        table: dict[str, Any] = out
        for depth, key in enumerate(ov.path[:-1]):
            here = ".".join(ov.path[: depth + 1])
            current = table.get(key)
            if current is None:
                current = table[key] = {}
            elif isinstance(current, str):  # a component named alone: its table form
                current = table[key] = {"use": current}
            elif isinstance(current, Mapping):
                current = table[key] = dict(current)
            else:
                issues.append(Issue(here, f"is not a table, so {ov.key} cannot be set", current,
                                    f"set {here} itself"))
                break
            table = current
        else:
            table[ov.path[-1]] = copy.deepcopy(ov.value)
    if issues:
        raise SpecError(issues)
    return out


def _related(a: str, b: str) -> bool:
    """Whether dotted paths ``a`` and ``b`` are equal or one lies inside the other."""
    if not a or not b:
        return False
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def annotate(error: SpecError, overrides: Iterable[Override], source: str | None = None) -> SpecError:
    """``error`` with each problem at (or inside, or around) an overridden path naming the
    override that set it, and the source naming every override given."""
    ovs = list(overrides)
    if not ovs:
        return error
    issues = []
    for issue in error.issues:
        named = [str(o) for o in ovs if _related(issue.path, o.key)]
        if named:
            note = "set by the override " + ", ".join(named)
            hint = f"{issue.hint}; {note}" if issue.hint else note
            issue = Issue(issue.path, issue.message, issue.value, hint)
        issues.append(issue)
    where = source if source is not None else error.source
    given = " ".join(str(o) for o in ovs)
    return SpecError(issues, f"{where} with {given}" if where else f"overrides {given}")


def resolve_with_overrides(data: Mapping[str, Any], overrides: Iterable[Override],
                           source: str | None = None, registry: Any = None):
    """The resolved `Spec` of ``data`` (raw spec tables) with ``overrides`` applied; a problem
    is one `SpecError` naming the overrides (`annotate`)."""
    from .resolve import resolve_spec

    ovs = list(overrides)
    try:
        return resolve_spec(apply_overrides(data, ovs), source=source, registry=registry)
    except SpecError as exc:
        raise annotate(exc, ovs, source) from None


def load_with_overrides(source: Any, overrides: Iterable[Override], registry: Any = None):
    """`atlas_core.spec.load_spec` with overrides: ``source`` is a ``.toml`` path, TOML text, a
    mapping or a resolved `Spec` (whose resolved tables are then overridden)."""
    from .model import Spec
    from .resolve import looks_like_toml, load_spec
    from .toml_io import load_file, loads

    ovs = list(overrides)
    if not ovs:
        return load_spec(source, registry=registry)
    label = None
    if isinstance(source, Spec):
        data, label = source.to_dict(), source.source
    elif isinstance(source, Mapping):
        data = dict(source)
    elif isinstance(source, Path) or (isinstance(source, str) and not looks_like_toml(source)):
        label = str(source)
        data = load_file(label)
    elif isinstance(source, str):
        data, label = loads(source, "<string>"), "<string>"
    else:
        raise TypeError(f"a spec is a path, TOML text, a dict or a Spec, not {type(source).__name__}")
    spec = resolve_with_overrides(data, ovs, source=label, registry=registry)
    return spec


__all__ = [
    "COMMON_FLAGS", "Override", "annotate", "apply_overrides", "flag_overrides", "from_mapping",
    "is_override", "load_with_overrides", "parse_key", "parse_override", "parse_overrides",
    "parse_value", "resolve_with_overrides", "split_args",
]
