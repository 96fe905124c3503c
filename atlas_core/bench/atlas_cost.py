"""Atlas against its FLOP count: multiply-adds per token, and the tokens/s a plain matmul of the
same shapes allows (docs/benchmarks.md, "Atlas against its FLOP count").

`macs_per_token` counts the multiply-adds of one token of one head of a Muon rule on a
matrix-shaped memory, as the algorithm needs them (not as a particular strategy forms them):

- ``feature map``: the polynomial map of the key and the query (``degree`` terms per dimension);
- ``anchored forward``: the memory's forward at the anchor for each of the chunk's window-extended
  positions (``|W| (C + c - 1) / C`` per token), which gives the errors;
- ``gradients``: each position's rank-one factors (the backpropagated derivative through every
  layer after the first: ``|W_i|`` each) and the token's window-weighted gradient, a sum of c
  rank-one terms over all weights (``c |W|``);
- ``momentum and retention``: ``Z_t = eta Z + G`` and ``W_t = alpha W - theta N`` (``2 |W|``);
- ``Newton-Schulz``: per weight ``r x c`` (r <= c), ``k (2 r^2 c + r^3)`` plus the normalisation
  (``r c``);
- ``read``: the memory applied to the token's query at its own weights (``|W|``).

A training step (fwd+bwd) counts three times the forward (the backward of a product costs two
products). `matmul_rate` times a plain batched matmul of Newton–Schulz's shapes (the dominant
term) in the same process, on the same device, so that ``bound = rate / macs`` is the tokens/s this machine would give
if every multiply-add ran at that matmul's speed; the bench reports measured / bound.
"""

from __future__ import annotations

from typing import Any

import torch

#: how many times a forward's multiply-adds a fwd+bwd step is counted as
TRAIN_FACTOR = 3


def _weights(rule) -> dict[str, tuple[int, int]]:
    return {k: tuple(s) for k, s in rule.structure.weight_shapes().items()}


def macs_per_token(rule, chunk: int) -> dict[str, float]:
    """Multiply-adds of one token of one head, forward, by part (see module docstring)."""
    W = _weights(rule)
    size = sum(r * c for r, c in W.values())
    c = int(rule.window)
    k = int(getattr(rule.algorithm, "ns_steps", 0))
    d_in = next(iter(W.values()))[1]
    degree = int(getattr(getattr(rule.feature_map, "params", None), "degree", 1) or 1)
    first = next(iter(W))
    ns = 0.0
    for r, cc in W.values():
        lo, hi = min(r, cc), max(r, cc)
        ns += k * (2 * lo * lo * hi + lo ** 3) + lo * hi
    return {
        "feature map": 2.0 * degree * d_in,
        "anchored forward": size * (chunk + c - 1) / chunk,
        "gradients": float(sum(r * cc for name, (r, cc) in W.items() if name != first) + c * size),
        "momentum and retention": 2.0 * size,
        "Newton-Schulz": ns,
        "read": float(size),
    }


def matmul_rate(rule, chunk: int, batch: int, heads: int, repeats: int = 5, device=None) -> float:
    """Multiply-adds per second of one Newton–Schulz step's products (``X X^T``, ``b A + c A A``,
    ``(a I + B) X``) on plain random float32 tensors of the chunk's shapes: ``[B H C, r, c]`` per
    weight, on ``device`` (None: the CPU), timed by the benchmark's clock (`device.clock`:
    synchronised on a GPU). The fastest of ``repeats`` runs, no autograd."""
    from .device import clock

    shapes = [tuple(sorted(s)) for s in _weights(rule).values()]
    n = batch * heads * chunk
    g = torch.Generator().manual_seed(0)
    xs = [(torch.randn(n, r, c, generator=g) / c ** 0.5).to(device or "cpu") for r, c in shapes]
    macs = sum(n * (2 * r * r * c + r ** 3) for r, c in shapes)

    def step():  # the products of `newton_schulz`'s step: X X^T, b A + c A A, (a I + B) X
        for X in xs:
            A = X @ X.mT
            Bm = torch.baddbmm(A, A, A, beta=-4.775, alpha=2.0315)
            Bm @ X

    with torch.no_grad():
        step()
        best = float("inf")
        for _ in range(repeats):
            t0 = clock(device)
            step()
            best = min(best, clock(device) - t0)
    return macs / best


def cost_rows(rows, rule, chunk_of, sizes: dict[str, int], rate: float) -> list[dict[str, Any]]:
    """Tokens/s of the Atlas rows next to the bound: one dict per ``ok`` row. ``chunk_of(row)``
    gives the chunk size the row's subject ran with (None: skip the row)."""
    out = []
    for r in rows:
        C = chunk_of(r)
        if r.status != "ok" or C is None or not r.fwd_ms:
            continue
        parts = macs_per_token(rule, C)
        macs = sum(parts.values()) * sizes["H"]  # per sequence token (all heads)
        tokens = sizes["B"] * r.T
        entry = {"subject": r.subject, "T": r.T, "macs_per_token": macs,
                 "fwd_tok_s": tokens / (r.fwd_ms / 1e3), "fwd_bound_tok_s": rate / macs}
        entry["fwd_ratio"] = entry["fwd_tok_s"] / entry["fwd_bound_tok_s"]
        if r.train_ms:
            entry["train_tok_s"] = tokens / (r.train_ms / 1e3)
            entry["train_bound_tok_s"] = rate / (TRAIN_FACTOR * macs)
            entry["train_ratio"] = entry["train_tok_s"] / entry["train_bound_tok_s"]
        out.append(entry)
    return out
