"""The strategies the zoo tests run every preset under: core:sequential first, then every
registered strategy (chunked ones at chunk sizes 1, 5 and 16). A strategy that refuses a preset
is skipped by the tests with its reason checked."""

from __future__ import annotations

from atlas_core.host.manager import get_registry


def every_strategy(chunks=(1, 5, 16)) -> list:
    out: list = ["core:sequential"]
    for comp in sorted(get_registry().all("strategy"), key=lambda c: c.name):
        if comp.name == "core:sequential":
            continue
        params = comp.load_params()  # None: a strategy without params
        fields = params.model_fields if params is not None else {}
        out += [{"use": comp.name, "chunk_size": C} for C in chunks] if "chunk_size" in fields else [comp.name]
    return out


def accepting(rule, chunks=(1, 5, 16)):
    """The strategies of `every_strategy` that accept ``rule``; a refusal must give its reason."""
    from atlas_core.errors import StrategyError

    for strategy in every_strategy(chunks):
        try:
            rule.runner(strategy)
        except StrategyError as exc:
            assert str(exc).strip(), f"{strategy} refused without a reason"
            continue
        yield strategy
