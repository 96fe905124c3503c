"""A toy plugin for spec and CLI tests: an architecture and a preset in namespace ``toy``.

It lets the tests run against the real core components without depending on any other plugin.
The toy arch builds a tiny language model from the resolved spec (embedding, one memory layer,
head), through `atlas_core.model.MemoryLM`.
"""

from __future__ import annotations

import types

from pydantic import Field

from atlas_core.host.hookspecs import hookimpl
from atlas_core.host.manager import PluginHost
from atlas_core.host.registry import Params, Provider, NamespacedRegistry, Registry


class ToyArchParams(Params):
    vocab_size: int = Field(32, ge=2)
    d_model: int = Field(8, ge=1)
    depth: int = Field(1, ge=1, le=4)
    heads: int = Field(2, ge=1)
    tie: bool = False
    dropout: float = Field(0.0, ge=0.0, lt=1.0)


def build_toy_lm(params, ctx):
    """A minimal MemoryLM: embedding -> memory layers -> head."""
    import torch
    from torch import nn

    from atlas_core.layer import MemoryLayer
    from atlas_core.model import MemoryLM

    spec = ctx.options["spec"]

    class ToyLM(MemoryLM):
        def __init__(self):
            super().__init__()
            self.vocab_size = params.vocab_size
            self.embed = nn.Embedding(params.vocab_size, params.d_model)
            self.blocks = nn.ModuleList(
                MemoryLayer.from_spec(spec, d_model=params.d_model, heads=params.heads,
                                      registry=ctx.registry)
                for _ in range(params.depth)
            )
            self.head = nn.Linear(params.d_model, params.vocab_size, bias=False)

        def step(self, ids, state=None):
            x = self.embed(ids)
            states = list(state or [None] * len(self.blocks))
            for i, block in enumerate(self.blocks):
                y, states[i] = block(x, states[i])
                x = x + y
            return self.head(x), states

    return ToyLM()


class SoloParams(Params):
    scale: float = Field(1.0, gt=0)
    flag: bool = False


def build_solo(params, ctx):
    """A standalone rule (no knobs): y = scale * v, no state."""
    from atlas_core.rule import Rule

    class Solo(Rule):
        def reference(self, inputs):
            return inputs

    return Solo()


def build_picky(params, ctx):
    """A strategy that refuses every rule, with a reason."""
    from atlas_core.strategies.base import Strategy

    class Picky(Strategy):
        name = "toy:picky"

        def supports(self, rule):
            return False, "toy:picky needs a rule with a toy capability"

    return Picky()


def register(registry) -> None:
    registry.add("arch", "lm", build_toy_lm, params=ToyArchParams, summary="toy language model")
    registry.add_preset("delta", knobs={"bias": "core:l2", "algorithm": "core:gd"},
                        summary="toy preset: the delta rule")
    registry.add("rule", "solo", build_solo, params=SoloParams, summary="toy standalone rule")
    registry.add("strategy", "picky", build_picky, summary="refuses every rule", priority=-5)


def cli_app():
    import typer

    app = typer.Typer(help="toy plugin commands")

    @app.command("hello")
    def hello(name: str = "world") -> None:
        typer.echo(f"hello {name} from toy")

    return app


def atlas_cli_apps():
    # "spec" collides with a built-in group: the CLI must skip it and say so in `plugins doctor`
    return [("toycmd", cli_app()), ("spec", cli_app())]


@hookimpl
def atlas_register(registry):
    register(registry)


def toy_module() -> types.ModuleType:
    """A plugin module object for `PluginHost.add_plugin_module`."""
    mod = types.ModuleType("toy_plugin")
    mod.atlas_register = atlas_register
    mod.atlas_cli_apps = hookimpl(atlas_cli_apps)
    return mod


def toy_registry() -> Registry:
    """The core components plus the toy namespace, without entry points."""
    from atlas_core.components import plugin as core

    reg = Registry()
    core.atlas_register(registry=NamespacedRegistry(reg, Provider("core", "atlas-ttm", "0", core.__name__)))
    register(NamespacedRegistry(reg, Provider("toy", "toy-dist", "0.1", __name__)))
    return reg


def toy_host() -> PluginHost:
    """The installed plugins plus the toy namespace (for CLI tests in this process)."""
    host = PluginHost(strict=False).load_entry_points()
    host.add_plugin_module("toy", toy_module())
    return host


VALID = {
    "schema": "atlas/1",
    "name": "toy-small",
    "model": {"arch": "toy:lm", "vocab_size": 16, "d_model": 8, "heads": 2},
    "memory": {
        "use": "toy:delta",
        "retention": "core:decay",
        "anchor": 4,  # chunkwise at chunk 4 computes exactly the rule anchored at 4
        "parallel": {"use": "core:chunkwise", "chunk_size": 4},
    },
    "layer": {"conv_size": 2},
}
