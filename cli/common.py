"""What every `atlas` command shares: output format, consoles, error handling, help examples.

For authors of a command group (one module under ``cli/`` with a ``register(app)`` function):

- build sub-apps with `AtlasTyper` (a `typer.Typer` whose commands are wrapped by `guard`, so a
  known error prints one line and exits 1; ``ATLAS_DEBUG=1`` shows the traceback instead);
- take ``fmt: FormatOption = None`` in every command and print data with `emit` (stdout; JSON
  when ``--format json``), progress and logs with `log` (stderr);
- pass ``epilog=examples("atlas ...")`` to ``command()`` so that ``--help`` shows an example.

Exit codes: 0 ok, 1 a check or validation failed (`Failed`, or a known error), 2 usage error
(typer's own, or ``typer.BadParameter``).
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


def report(exc: BaseException) -> None:
    """Print a known error on stderr, without a traceback."""
    sys.stderr.write(error_line(exc) + "\n")
    sys.stderr.flush()


def guard(fn: Callable) -> Callable:
    """Turn known errors into one line on stderr and exit code 1 (traceback with ATLAS_DEBUG=1)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Failed:
            raise typer.Exit(1) from None
        except Exception as exc:  # noqa: BLE001 - sorted into known and unknown below
            if debug() or not known_error(exc):
                raise
            report(exc)
            raise typer.Exit(1) from None

    return wrapper


class AtlasTyper(typer.Typer):
    """`typer.Typer` whose commands run under `guard` (no_args_is_help on by default)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("no_args_is_help", True)
        kwargs.setdefault("pretty_exceptions_enable", False)
        super().__init__(*args, **kwargs)

    def command(self, *args, **kwargs):
        register = super().command(*args, **kwargs)

        def decorator(fn: Callable) -> Callable:
            register(guard(fn))
            return fn

        return decorator
