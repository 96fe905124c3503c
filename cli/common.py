"""What every `atlas` command shares: output format, consoles, error handling, help examples.

For authors of a command group (one module under ``cli/`` with a ``register(app)`` function):

- build sub-apps with `AtlasTyper` (a `typer.Typer` whose commands are wrapped by `guard`, so a
  known error prints one line and exits 1; ``ATLAS_DEBUG=1`` shows the traceback instead);
- take ``fmt: FormatOption = None`` in every command and print data with `emit` (stdout; JSON
  when ``--format json``), progress and logs with `log` (stderr);
- pass ``epilog=examples("atlas ...")`` to ``command()`` so that ``--help`` shows an example.

Exit codes: 0 ok, 1 a check or validation failed (`Failed`, or a known error), 2 usage error
(typer's own, or ``typer.BadParameter``).

Errors under ``--format json`` (the global option or the command's own) are one JSON object on
stdout, with the same exit code (`error_payload`)::

    {"error": {"type": "SpecError", "message": "...", "exit_code": 1,
               "problems": [{"path": "model.d_model", "message": "...", "got": "abc",
                             "fix": "..."}]}}

``problems`` lists a spec error's problems (one per dotted path; ``line``/``column`` for a TOML
syntax error) and is empty for other errors. A bug (an unexpected exception) is reported the same
way with ``"type": "InternalError"`` and its traceback on stderr.
"""

from __future__ import annotations

import enum
import functools
import json
import os
import sys
from typing import Annotated, Any, Callable, Optional

import typer

DEBUG_ENV = "ATLAS_DEBUG"


class OutputFormat(str, enum.Enum):
    human = "human"
    json = "json"


FormatOption = Annotated[
    Optional[OutputFormat],
    typer.Option("--format", case_sensitive=False,
                 help="human (tables) or json (machine-readable, on stdout); default: the global --format"),
]

_state: dict[str, Any] = {"format": OutputFormat.human}


def set_global_format(fmt: OutputFormat | None) -> None:
    _state["format"] = OutputFormat(fmt or OutputFormat.human)


def resolve_format(fmt: OutputFormat | str | None) -> OutputFormat:
    """The command's own ``--format`` if given, else the global one."""
    return OutputFormat(fmt) if fmt is not None else _state["format"]


def debug() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


# -- consoles ------------------------------------------------------------------------------------
def out_console():
    """A rich console on the current stdout (looked up per call: tests swap the streams)."""
    from rich.console import Console

    tty = sys.stdout.isatty()
    return Console(file=sys.stdout, highlight=False, width=None if tty else 140, soft_wrap=not tty)


def err_console():
    from rich.console import Console

    tty = sys.stderr.isatty()
    return Console(file=sys.stderr, highlight=False, width=None if tty else 140, soft_wrap=not tty)


def log(message: str) -> None:
    """Progress and logs: stderr, never mixed into the data on stdout."""
    err_console().print(message, markup=False)


def emit(data: Any, fmt: OutputFormat | str | None, human: Callable[[Any], None] | None = None) -> None:
    """Print a command's data: JSON on stdout, or ``human(data)`` (default: pretty JSON)."""
    if resolve_format(fmt) is OutputFormat.json or human is None:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        sys.stdout.flush()
    else:
        human(data)


def examples(*lines: str) -> str:
    """An epilog for ``--help`` with one or more example command lines."""
    head = "Example:" if len(lines) == 1 else "Examples:"
    return head + "\n\n" + "\n\n".join(f"  {line}" for line in lines)


# -- errors --------------------------------------------------------------------------------------
class Failed(Exception):
    """A check or validation failed and the command has already said why: exit 1, no message."""


def known_error(exc: BaseException) -> bool:
    """Errors that describe bad input (print one line) rather than a bug (show a traceback)."""
    from atlas_core.errors import AtlasError

    return isinstance(exc, (AtlasError, ValueError, OSError)) and not isinstance(exc, typer.Exit)


def error_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"error: {text}"


def _plain(value: Any) -> Any:
    """A value as JSON data (what is not JSON becomes its repr)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return repr(value)


def click_exception_classes() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """``(usage-style errors, exits)``: click's exception classes as typer raises them (typer
    may carry its own copy of click), plus those of click itself when it is installed."""
    errors: list[type] = [sys.modules[typer.BadParameter.__module__].ClickException]
    exits: list[type] = [typer.Exit, typer.Abort]
    try:
        import click

        errors.append(click.ClickException)
        exits.extend([click.exceptions.Exit, click.exceptions.Abort])
    except ImportError:  # pragma: no cover - typer without click
        pass
    return tuple(errors), tuple(exits)


def error_payload(exc: BaseException, exit_code: int = 1, kind: str | None = None) -> dict[str, Any]:
    """``{"error": {type, message, exit_code, problems}}`` for an error (module docstring)."""
    from atlas_core.errors import SpecError

    problems: list[dict[str, Any]] = []
    if isinstance(exc, SpecError):
        for issue in exc.issues:
            problems.append({"path": issue.path, "message": issue.message,
                             "got": _plain(issue.value), "fix": issue.hint})
        line = getattr(exc, "line", None)
        if line is not None and problems:
            problems[0].update(line=line, column=getattr(exc, "column", None))
    if isinstance(exc, click_exception_classes()[0]):
        message = exc.format_message()
    elif kind == "InternalError":
        message = f"{type(exc).__name__}: {exc} (a bug; the traceback is on stderr)"
    else:
        message = str(exc) or type(exc).__name__
    return {"error": {"type": kind or type(exc).__name__, "message": message,
                      "exit_code": exit_code, "problems": problems}}


def emit_error(exc: BaseException, exit_code: int = 1, kind: str | None = None) -> None:
    """Print an error as JSON on stdout (`error_payload`)."""
    sys.stdout.write(json.dumps(error_payload(exc, exit_code, kind), indent=2, default=str) + "\n")
    sys.stdout.flush()


def report(exc: BaseException, fmt: OutputFormat | str | None = None, exit_code: int = 1) -> None:
    """Print a known error without a traceback: one line on stderr, or JSON on stdout under
    ``--format json``."""
    if resolve_format(fmt) is OutputFormat.json:
        emit_error(exc, exit_code)
        return
    sys.stderr.write(error_line(exc) + "\n")
    sys.stderr.flush()


def wants_json(args: list[str] | tuple[str, ...] = ()) -> bool:
    """Whether errors go out as JSON: the global ``--format json`` is in effect, or ``args``
    (command-line words not parsed yet) ask for it."""
    if _state["format"] is OutputFormat.json:
        return True
    words = [str(a) for a in args]
    for i, word in enumerate(words):
        if word == "--":
            break
        if word.lower() == "--format=json":
            return True
        if word == "--format" and i + 1 < len(words) and words[i + 1].lower() == "json":
            return True
    return False


def guard(fn: Callable) -> Callable:
    """Turn known errors into one line on stderr (JSON on stdout under ``--format json``) and
    exit code 1 (traceback with ATLAS_DEBUG=1)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Failed:
            raise typer.Exit(1) from None
        except Exception as exc:  # noqa: BLE001 - sorted into known and unknown below
            if debug() or not known_error(exc):
                raise
            report(exc, kwargs.get("fmt"))
            raise typer.Exit(1) from None

    return wrapper


def _json_errors_group():
    """The click group class of `AtlasTyper`: under ``--format json`` every error that reaches
    it (a usage error, a known error of a plugin command, a bug) is printed as JSON on stdout
    with its exit code; otherwise errors pass through unchanged."""
    from typer.core import TyperGroup

    usage_errors, exits = click_exception_classes()

    class JsonErrorsGroup(TyperGroup):
        def make_context(self, info_name, args, parent=None, **extra):
            words = list(args)
            try:
                ctx = super().make_context(info_name, list(words), parent=parent, **extra)
            except usage_errors as exc:  # e.g. an unknown command, found while parsing
                if not wants_json(words):
                    raise
                emit_error(exc, exc.exit_code)
                raise typer.Exit(exc.exit_code) from None
            ctx.meta.setdefault("atlas.argv", words)
            return ctx

        def invoke(self, ctx):
            try:
                return super().invoke(ctx)
            except exits:
                raise
            except usage_errors as exc:
                if not wants_json(ctx.meta.get("atlas.argv", ())):
                    raise
                emit_error(exc, exc.exit_code)
                raise typer.Exit(exc.exit_code) from None
            except Exception as exc:  # noqa: BLE001 - JSON mode: a JSON error, never a traceback alone
                if debug() or not wants_json(ctx.meta.get("atlas.argv", ())):
                    raise
                if known_error(exc):
                    emit_error(exc, 1)
                else:
                    import traceback

                    traceback.print_exc(file=sys.stderr)
                    emit_error(exc, 1, kind="InternalError")
                raise typer.Exit(1) from None

    return JsonErrorsGroup


class AtlasTyper(typer.Typer):
    """`typer.Typer` whose commands run under `guard` (no_args_is_help on by default)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("no_args_is_help", True)
        kwargs.setdefault("pretty_exceptions_enable", False)
        kwargs.setdefault("cls", _json_errors_group())
        super().__init__(*args, **kwargs)

    def command(self, *args, **kwargs):
        register = super().command(*args, **kwargs)

        def decorator(fn: Callable) -> Callable:
            register(guard(fn))
            return fn

        return decorator
