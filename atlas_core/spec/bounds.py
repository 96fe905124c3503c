"""Bounds on the sizes a spec may ask for, in one place, and the model-size preflight.

A spec is read from a file anyone can write, so every size in it is bounded before anything is
built: a depth of ``10**9`` or a width of ``2**64`` is one clear error that names the limit, not a
builder that hangs or runs out of memory. The limits (`LIMITS`) are far above any model this
package is meant for and far below what would make building (even on the meta device) slow:

==============  ===========  ================================================================
kind            limit        used for
==============  ===========  ================================================================
``depth``       1,024        blocks of a model
``mem_depth``   64           layers of a deep (MLP) memory
``width``       65,536       d_model, per-head key/value sizes, feature dimensions
``heads``       4,096        memory and attention heads
``ratio``       256          width multipliers (mlp_ratio, a deep memory's expansion)
``vocab``       16,777,216   token ids (2**24)
``seq_len``     1,048,576    tokens per row, attention windows, segments (2**20)
``chunk``       65,536       tokens per chunk of a parallel form, anchors
``window``      4,096        tokens an Omega-style loss covers (the state keeps that many keys)
``steps``       10**9        optimizer steps and other step counts
``batch``       1,048,576    rows per step, evaluation batches
``iterations``  1,000        inner iterations (Newton-Schulz steps, polynomial degrees)
``kernel``      1,024        convolution taps
==============  ===========  ================================================================

Params models declare a size with `size_field` (`atlas_core.params`, re-exported here) (pydantic then refuses a value above the limit:
"Input should be less than or equal to 1024"). Whatever a model declares, `spec_value_issues`
refuses in every resolved section an integer beyond ``2**53`` (no size or count is that large,
and a float could not hold it) and a non-finite float (``inf``, ``nan``), which the params base
class (`atlas_core.host.registry.Params`) already refuses field by field.

The parameter-count preflight that builds models (`atlas_core.preflight`: `estimate_params`,
`check_model_size`) sits on top of this package and the model builders; here: `MAX_PARAMS`
(10**10 parameters, 40 GB in float32) and `too_big_issue`. The spec
resolver checks a closed-form estimate (`lm_estimate`: the embedding, the MLPs and the memory
layers' projections, with ``[layer]``'s head sizes) so that ``model.depth = 10**9`` is refused
when the spec is read; ``atlas build`` and ``atlas spec validate`` run the
full preflight before they instantiate anything.
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Mapping

from ..errors import Issue
from ..params import LIMITS, MAX_INT, limit, size_field  # noqa: F401  (re-exported)

MAX_PARAMS = 10**10


# -- every value of a resolved section ----------------------------------------------------------
def _leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, value


def spec_value_issues(section: Any, path: str) -> list[Issue]:
    """An `Issue` for each non-finite float and each integer beyond ``2**53`` in ``section``."""
    issues = []
    for where, v in _leaves(section, path):
        if isinstance(v, bool):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            issues.append(Issue(where, "must be a finite number", v, "write a finite value"))
        elif isinstance(v, int) and abs(v) > MAX_INT:
            issues.append(Issue(where, "is too large: no size or count here may exceed 2**53",
                                _short(v)))
    return issues


def _short(v: int) -> Any:
    return v if abs(v) < 10**30 else f"{float(v):.3e}"


# -- parameter count ----------------------------------------------------------------------------
def lm_estimate(model: Mapping[str, Any], layer: Mapping[str, Any] | None = None
                ) -> tuple[float, str] | None:
    """A closed-form estimate of the parameters of a language model's ``[model]`` table (the
    embedding and, per block, the MLP and the memory layer's q, k, v and output projections, of
    ``heads x d_key`` and ``value_heads x d_value`` when ``[layer]`` sets them) and the key that
    dominates it; None when the table has no usable ``d_model``."""
    model = {"depth": 2, "mlp_ratio": 4.0, "heads": 1, **model}
    layer = layer or {}
    try:
        d = float(model["d_model"])
        depth = float(model["depth"])
        vocab = float(model.get("vocab_size", 0))
        ratio = float(model["mlp_ratio"])
        heads = float(model["heads"])
        dk = float(layer.get("d_key") or d / max(heads, 1.0))
        dv = float(layer.get("d_value") or dk)
        value_heads = float(layer.get("value_heads") or heads)
        hidden = float(model.get("mlp_hidden") or d * ratio)  # swiglu's default: about 2/3 of it
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    embed = vocab * d * (1 if model.get("tie_embeddings", True) else 2)
    projections = d * (heads * 2.0 * dk + value_heads * 2.0 * dv)
    block = d * hidden * (3.0 if model.get("mlp") == "swiglu" else 2.0) + projections
    total = embed + depth * block
    if depth * block < embed:
        key = "model.vocab_size"
    elif depth > 64:
        key = "model.depth"
    elif (projections > 4.0 * d * d and layer.get("value_heads") is not None
          and value_heads * dv > heads * dk):
        key = "layer.value_heads"
    elif projections > 4.0 * d * d and layer.get("d_key") is not None:
        key = "layer.d_key"
    else:
        key = "model.d_model"
    return total, key


def _sci(x: float) -> str:
    """``3.1e12`` for 3.1e+12 (two significant digits)."""
    mant, _, exp = f"{x:.1e}".partition("e")
    return f"{mant.removesuffix('.0')}e{int(exp)}"


def too_big_issue(total: float, path: str, value: Any, limit_params: int = MAX_PARAMS) -> Issue:
    return Issue(path, f"the model would have ~{_sci(total)} parameters (limit {_sci(limit_params)}"
                       f", {_sci(4 * limit_params)} bytes in float32)", value, "choose smaller sizes")


def model_size_issues(model: Mapping[str, Any] | None, layer: Mapping[str, Any] | None = None
                      ) -> list[Issue]:
    """The resolver's check: the closed-form estimate of ``[model]`` (and ``[layer]``'s head
    sizes) over `MAX_PARAMS`."""
    if not isinstance(model, Mapping):
        return []
    found = lm_estimate(model, layer if isinstance(layer, Mapping) else None)
    if found is None or found[0] <= MAX_PARAMS:
        return []
    total, path = found
    section, key = path.split(".")
    value = (model if section == "model" else layer).get(key)
    return [too_big_issue(total, path, value)]


_MODEL_SIZE_KEYS = {"depth": "depth", "d_model": "width", "vocab_size": "vocab", "heads": "heads",
                    "mlp_ratio": "ratio"}


def explain_model_issues(issues: list[Issue], table: Mapping[str, Any]) -> list[Issue]:
    """Model-size issues (a ``[model]`` size above its limit) with the parameter count the
    sizes as written would give: ``model.depth: above the limit 1024 blocks; the model would have
    ~3.1e12 parameters (limit 1e10) (got 1000000000)``."""
    out = []
    for issue in issues:
        key = issue.path.removeprefix("model.")
        kind = _MODEL_SIZE_KEYS.get(key)
        if kind and issue.message.startswith("Input should be less than or equal"):
            found = lm_estimate({k: v for k, v in table.items()
                                 if isinstance(v, (int, float)) and not isinstance(v, bool)})
            count = (f"; the model would have ~{_sci(found[0])} parameters (limit "
                     f"{_sci(MAX_PARAMS)})") if found and math.isfinite(found[0]) else ""
            issue = Issue(issue.path, f"is above the limit {LIMITS[kind]}{count}", issue.value,
                          "choose a smaller size")
        out.append(issue)
    return out
