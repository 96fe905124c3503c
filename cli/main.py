"""The ``atlas`` command: ``atlas [--format human|json] <group> <command> ...``.

Command groups live in one module each; every module in `COMMAND_MODULES` defines
``register(app)``, which adds its sub-app (``app.add_typer(...)``) or its commands to the root
app. To add a group (train, eval, generate, bench, check, plugins new, ...), write
``cli/<group>.py`` with ``register(app)`` and add ONE line to `COMMAND_MODULES`. Command modules
must be cheap to import (no torch at module level): every invocation imports all of them.

Plugins add commands only as ``typer.Typer`` sub-apps returned by their ``atlas_cli_apps`` hook;
they are mounted after the built-in groups, and a name that is already taken is skipped (and
reported by ``atlas plugins doctor``). A plugin command that raises an unexpected exception is
reported as one line naming the plugin (its distribution, version and module), exit 1.

Errors: a known error (bad spec, bad value, missing file) prints one line on stderr and exits 1;
``ATLAS_DEBUG=1`` shows the traceback. Usage errors exit 2.
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Annotated, Optional

import typer

from .common import (
    AtlasTyper, OutputFormat, click_exception_classes, debug, known_error, report, set_global_format,
)

# One line per command group, in the order `atlas --help` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "atlas_cli.plugins",  # atlas plugins list|doctor
    "atlas_cli.components",  # atlas components list|show
    "atlas_cli.spec",  # atlas spec validate|show
    "atlas_cli.build",  # atlas build FILE
    "atlas_cli.env",  # atlas env
    "atlas_cli.bench",  # atlas bench
    "atlas_cli.train",  # atlas train [SPEC]
    "atlas_cli.evaluate",  # atlas eval CKPT
    "atlas_cli.generate",  # atlas generate CKPT
    "atlas_cli.tokenizer",  # atlas tokenizer train|export
    "atlas_cli.examples",  # atlas examples list|copy
    "atlas_cli.export_hf",  # atlas export-hf CKPT OUT_DIR (Hugging Face)
    "atlas_cli.import_model",  # atlas import SRC OUT (transformers hybrids, fla), import-fla
    "atlas_cli.compare",  # atlas compare SPEC...
    "atlas_cli.check",  # atlas check NAME... (the conformance kit)
    "atlas_cli.scaffold",  # atlas plugins new NAME
)


def _version_callback(value: bool) -> None:
    if value:
        from atlas_core import __version__

        typer.echo(f"atlas {__version__}")
        raise typer.Exit()


def _root_callback(
    fmt: Annotated[
        OutputFormat,
        typer.Option("--format", case_sensitive=False,
                     help="output of every command: human (tables) or json (data on stdout)"),
    ] = OutputFormat.human,
    version: Annotated[
        Optional[bool],
        typer.Option("--version", callback=_version_callback, is_eager=True, help="print the version"),
    ] = None,
) -> None:
    """Test-time memory layers: plugins, components, specs and models.

    Data goes to stdout, logs and progress to stderr. Exit codes: 0 ok, 1 a check or validation failed, 2 usage error. ATLAS_DEBUG=1 shows tracebacks.
    """
    set_global_format(fmt)


def _taken(app: typer.Typer) -> set[str]:
    names = {c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands}
    names |= {g.name for g in app.registered_groups if g.name}
    return names


def _plugin_guard(fn, command: str, origin: str):
    """``fn`` (a plugin command's callback) with its unexpected exceptions turned into one
    `PluginError` naming the plugin: the user did nothing wrong and needs to know whose bug it
    is, not a traceback of its code. Known errors (bad input) and click's own exits pass."""
    if not callable(fn) or getattr(fn, "_atlas_plugin_guard", False):
        # None or typer's DefaultPlaceholder (no callback); or an app that another make_app()
        # mounted, wrapped already
        return fn

    usage_errors, exits = click_exception_classes()  # typer's (which may be its own copy of click's)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (*exits, *usage_errors):
            raise
        except Exception as exc:  # noqa: BLE001 - sorted into known and unknown below
            if debug() or known_error(exc):
                raise
            from atlas_core.errors import PluginError

            text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
            raise PluginError(
                f"`atlas {command}` of {origin} failed ({text}); this is a bug in the plugin: "
                "report it to its authors (`atlas plugins doctor` names them), ATLAS_DEBUG=1 "
                "shows the traceback"
            ) from exc

    wrapper._atlas_plugin_guard = True
    return wrapper


def _guard_plugin_app(sub: typer.Typer, command: str, origin: str) -> None:
    """Wrap every callback of a plugin's sub-app (its commands, nested groups, group callbacks)."""
    for info in (sub.registered_callback, sub.info):
        if info is not None and callable(getattr(info, "callback", None)):
            info.callback = _plugin_guard(info.callback, command, origin)
    for cmd in sub.registered_commands:
        name = cmd.name or (cmd.callback.__name__.replace("_", "-") if cmd.callback else "?")
        cmd.callback = _plugin_guard(cmd.callback, f"{command} {name}", origin)
    for group in sub.registered_groups:
        inner = group.typer_instance
        if inner is not None:
            name = group.name or inner.info.name or "?"
            if callable(getattr(group, "callback", None)):
                group.callback = _plugin_guard(group.callback, f"{command} {name}", origin)
            _guard_plugin_app(inner, f"{command} {name}", origin)


def _mount_plugin_apps(app: typer.Typer) -> None:
    from .plugins import SKIPPED_APPS

    SKIPPED_APPS.clear()
    try:
        from atlas_core.host.manager import get_host

        host = get_host()
        items = host.cli_apps()
    except Exception:  # noqa: BLE001 - a broken host must not break the CLI; commands re-raise
        return
    for item in items:
        name, sub, namespace = (tuple(item) + ("?",))[:3]
        if name in _taken(app):
            SKIPPED_APPS.append({"name": name, "namespace": namespace,
                                 "reason": "a command with this name already exists"})
            continue
        if not isinstance(sub, typer.Typer):
            SKIPPED_APPS.append({"name": str(name), "namespace": namespace,
                                 "reason": f"not a typer.Typer but {type(sub).__name__}"})
            continue
        rec = host.records.get(namespace)
        origin = (f"plugin {namespace!r} ({rec.distribution} {rec.version}, {rec.module})"
                  if rec is not None else f"plugin {namespace!r}")
        _guard_plugin_app(sub, str(name), origin)
        app.add_typer(sub, name=name, help=f"(from plugin {namespace})")


def make_app(*, plugin_apps: bool = True) -> typer.Typer:
    """A fresh root app with every command group (and the plugins' sub-apps)."""
    app = AtlasTyper(
        name="atlas",
        callback=_root_callback,
        epilog="Example:\n\n  atlas spec validate examples/titans_lmm.toml",
        context_settings={"help_option_names": ["-h", "--help"]},
        add_completion=False,
    )
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(app)
    if plugin_apps:
        _mount_plugin_apps(app)
    return app


def run(argv: list[str] | None = None) -> None:
    """Entry point of the ``atlas`` script."""
    from atlas_core.allocator import configure; configure()  # bounded resident memory (glibc)
    app = make_app()
    try:
        app(args=argv, prog_name="atlas")
    except SystemExit:
        raise
    except Exception as exc:  # noqa: BLE001 - errors from plugin sub-apps' commands
        if debug() or not known_error(exc):
            raise
        report(exc)
        sys.exit(1)


def __getattr__(name: str):
    if name == "app":  # `from atlas_cli.main import app` for tests and docs tools
        return make_app()
    raise AttributeError(name)


if __name__ == "__main__":  # pragma: no cover
    run()
