"""No kernel offset can overflow int32 at any size the verifiers accept.

The verifiers bound the tiles (head dims <= 128, C <= 64, C + c - 1 <= 128, MRU d <= 64) but not
B, H or T: with them unbounded, every buffer's largest offset is unbounded too (the chunk
checkpoints ``[B*H, T/C, Dv, Dk]`` and look-back buffers ``[B*H, T/C, c-1, D]`` exceed 2^31
elements long before the inputs do). So each offset is split as the kernels compute it:

- the part that grows with B, H or T (``pid * T``, ``(pid * NT + i) * Dv * Dk``, ...) must be
  computed in int64 — checked in the Triton IR of every kernel: the first ``tt.addptr`` on each
  pointer argument takes an int64 offset;
- the in-tile part added after it (``rv * Dk + rk``, a chunk's window distances, ...) stays int32
  — its largest value, from the verifiers' tile bounds, is computed here and must be < 2^31.
"""

from __future__ import annotations

import re

import pytest
import torch
import triton  # noqa: F401 - without Triton this module must fail, not skip

from atlas_plugins.cuda_backend import compile_check as cc
from atlas_plugins.cuda_backend.backend_chunk import MAX_CHUNK, MAX_EXTENDED, MAX_HEAD_DIM
from atlas_plugins.cuda_backend.mru_scan import MAX_D

pytestmark = pytest.mark.triton
INT32 = 2**31 - 1

# pointer arguments whose whole offset is an in-tile one, with its largest value: lag[dist],
# dist = t + c - 1 - l < C + c - 1 (the window weights, c <= C + c - 1 entries)
SMALL = {"lag": MAX_EXTENDED - 1}
# largest in-tile offsets from the verifiers' bounds: a [Dv, Dk] state tile (rv * Dk + rk), a row of
# a [rows, D] tile (rk < D), the dlag row (rw < BW <= 2 * MAX_EXTENDED), a d x d MRU block
IN_TILE = {
    "state tile rv * Dk + rk": (MAX_HEAD_DIM - 1) * MAX_HEAD_DIM + MAX_HEAD_DIM - 1,
    "row of a tile rk": MAX_HEAD_DIM - 1,
    "lag gradient rw": 2 * MAX_EXTENDED - 1,
    "MRU block r * d + r": (MAX_D - 1) * MAX_D + MAX_D - 1,
    "window distance": MAX_CHUNK - 1 + MAX_EXTENDED - 1,
}

_DEF = re.compile(r"^\s*(%[\w.]+) = (\S+) (.*)$")
_ADDPTR = re.compile(r"tt\.addptr (%[\w.]+), (%[\w.]+) : ([^,]+), (tensor<[^>]*x(i\d+)>|i\d+)")


def _arg_offsets(ir: str, args: list[str]) -> dict[str, set[str]]:
    """For each pointer argument, the integer types of the offsets first added to it."""
    defs = {}
    for line in ir.splitlines():
        m = _DEF.match(line)
        if m:
            defs[m.group(1)] = (m.group(2), m.group(3))
    found: dict[str, set[str]] = {}
    for line in ir.splitlines():
        m = _ADDPTR.search(line)
        if not m:
            continue
        base, ty = m.group(1), m.group(5) or m.group(4)
        while base in defs and defs[base][0] in ("tt.splat", "tt.broadcast", "tt.expand_dims"):
            base = defs[base][1].split()[0].rstrip(",:")
        name = base.lstrip("%")
        if name in args:
            found.setdefault(name, set()).add(ty)
    return found


@pytest.fixture(scope="module")
def kernels_ir():
    return cc.run_isolated("ttir")


def test_every_growing_offset_is_int64(kernels_ir):
    names = {k["label"].split()[0] for k in kernels_ir}
    assert len(kernels_ir) == 10 and "mru_bwd_apply" in names  # 4 chunk_linear + 6 MRU kernels
    for k in kernels_ir:
        lines = k["ttir"].splitlines()
        head = next(i for i, line in enumerate(lines) if "tt.func public" in line)
        body = "\n".join(lines[head + 1:])
        found = _arg_offsets(k["ttir"], k["pointers"])
        used = {n for n in k["pointers"] if re.search(rf"%{n}\b", body)}
        assert used <= set(found), f"{k['label']}: pointer arguments without an addptr: {used - set(found)}"
        for name, types in found.items():
            if name in SMALL:
                assert SMALL[name] <= INT32
                continue
            assert types == {"i64"}, f"{k['label']}: offsets of {name} computed as {types}, not int64"


def test_in_tile_offsets_fit_int32_at_the_verifiers_bounds():
    for what, largest in IN_TILE.items():
        assert largest < INT32, what


def test_largest_buffers_exceed_int32_at_accepted_sizes(device):
    """Why int64 is needed: sizes the verifier accepts whose buffers pass 2^31 elements (the
    issue's example, B = 8, H = 16, T = 32768, D = 128, C = 16: checkpoints of 2^32 elements)."""
    from atlas_core.strategies.chunkwise import Chunkwise, ChunkwiseParams
    from atlas_plugins.cuda_backend.backend_chunk import ChunkLinearBackend

    from .oracle import make_rule

    B, H, T, D, C = 8, 16, 32768, 128, 16
    rule = make_rule("l2", "momentum", "after", 1, d=D, anchor=C)
    H0 = rule.heads if hasattr(rule, "heads") else 2
    q = torch.randn(1, C, H0, D, device=device)
    p = rule.prepare(q, q, q, gates={n: torch.full((1, C, H0), 0.5, device=device) for n in rule.gate_names})
    # expanded views: the shape of the call without the memory behind it
    p.psi = p.psi[:1, :1, :1].expand(B, H, T, D)
    p.v = p.v[:1, :1, :1].expand(B, H, T, D)
    assert ChunkLinearBackend().verify(Chunkwise(ChunkwiseParams(chunk_size=C)), rule, p) == (True, "")
    checkpoint = B * H * (T // C) * D * D
    assert checkpoint == 2**32 > INT32
