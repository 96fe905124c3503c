"""The parameter-count preflight: how many parameters the model a resolved spec describes has,
counted from builds on the meta device, before anything real is built.

`estimate_params` builds a model of at most two blocks and counts it; a deeper one is counted
from builds of one and two blocks. `check_model_size` raises a `SpecError` past `MAX_PARAMS`
(`atlas_core.spec.bounds`, which also holds the closed-form estimate the spec resolver checks
when a spec is read). ``atlas build`` and ``atlas spec validate`` run it. It sits on top of the
spec package and the model builders (it imports both).
"""

from __future__ import annotations

from typing import Any

from .errors import SpecError
from .spec.bounds import MAX_PARAMS, too_big_issue

#: The block count at which the preflight extrapolates instead of building every block.
_EXTRAPOLATE_ABOVE = 2


def _count(spec_data: dict[str, Any], registry: Any) -> int:
    import torch

    from .model import build_model

    with torch.device("meta"):
        model = build_model(spec_data, registry=registry)
    return sum(p.numel() for p in model.parameters())


def estimate_params(spec: Any, registry: Any = None) -> int:
    """The number of parameters of the model ``spec`` (a resolved `Spec`) describes.

    A model of at most two blocks (or without a ``depth``) is built on the meta device and
    counted. A deeper one is counted from builds of one and two blocks: the part outside the
    blocks, a memory block and (when ``memory_layers`` names only some blocks) a plain one, then
    ``outside + memory blocks * memory block + other blocks * plain block``."""
    data = spec.to_dict()
    data.pop("train", None)
    model = data["model"]
    depth = model.get("depth")
    if not isinstance(depth, int) or depth <= _EXTRAPOLATE_ABOVE:
        return _count(data, registry)
    if model.get("layers") is not None or model.get("moe") is not None:
        return _by_block_kind(data, registry)

    def variant(n: int, layers: list[int] | None) -> int:
        d = {**data, "model": {**model, "depth": n}}
        if "memory_layers" in model:
            d["model"]["memory_layers"] = layers
        return _count(d, registry)

    one, two = variant(1, None), variant(2, None)
    mem_block = two - one
    outside = one - mem_block
    layers = model.get("memory_layers")
    if layers is None:
        return outside + depth * mem_block
    plain_block = variant(2, [1]) - one
    n_mem = len(layers)
    return outside + n_mem * mem_block + (depth - n_mem) * plain_block


def _by_block_kind(data: dict[str, Any], registry: Any) -> int:
    """``core:lm`` with block kinds (``layers``) or routed experts (``moe``): the blocks differ, so
    each kind of block (its kind, routed or not) is counted from a one-block build of it, the part
    outside the blocks from a two-block build of the first kind."""
    model = data["model"]
    depth = model["depth"]
    kinds = list(model.get("layers") or ["memory"] * depth)
    moe = model.get("moe")
    routed = [moe is not None and (moe.get("blocks") is None or i + 1 in moe["blocks"]) for i in range(depth)]

    def build(blocks: list[tuple[str, bool]]) -> int:
        m = {**model, "depth": len(blocks), "layers": [k for k, _ in blocks]}
        m.pop("memory_layers", None)
        if "attention" not in m["layers"]:
            m.pop("attention", None)
        if moe is not None:
            chosen = [i + 1 for i, (_, r) in enumerate(blocks) if r]
            m["moe"] = {**moe, "blocks": chosen} if chosen else None
            if m["moe"] is None:
                m.pop("moe")
        return _count({**data, "model": m}, registry)

    signatures = sorted(set(zip(kinds, routed)))
    single = {sig: build([sig]) for sig in signatures}
    first = signatures[0]
    block_first = build([first, first]) - single[first]
    outside = single[first] - block_first
    return outside + sum(single[sig] - outside for sig in zip(kinds, routed))


def check_model_size(spec: Any, registry: Any = None, limit_params: int = MAX_PARAMS) -> int:
    """`estimate_params`, or a `SpecError` when it exceeds ``limit_params``."""
    total = estimate_params(spec, registry)
    if total > limit_params:
        model = spec.model
        key = "depth" if isinstance(model.get("depth"), int) and model["depth"] > 64 else "d_model"
        raise SpecError([too_big_issue(float(total), f"model.{key}", model.get(key), limit_params)],
                        spec.source)
    return total
