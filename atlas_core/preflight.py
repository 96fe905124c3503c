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


def check_model_size(spec: Any, registry: Any = None, limit_params: int = MAX_PARAMS) -> int:
    """`estimate_params`, or a `SpecError` when it exceeds ``limit_params``."""
    total = estimate_params(spec, registry)
    if total > limit_params:
        model = spec.model
        key = "depth" if isinstance(model.get("depth"), int) and model["depth"] > 64 else "d_model"
        raise SpecError([too_big_issue(float(total), f"model.{key}", model.get(key), limit_params)],
                        spec.source)
    return total
