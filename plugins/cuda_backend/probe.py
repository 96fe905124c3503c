"""A tiny kernel that proves Triton can compile and launch here before a backend calls itself
available (`availability.triton_available`): one 16 x 16 ``tl.dot`` with ``input_precision``
(an old Triton without it, a missing C compiler for the launcher, a broken driver all fail here,
once, instead of inside a model's forward)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .device import device_guard


@triton.jit
def probe_kernel(x, y, PREC: tl.constexpr):
    r = tl.arange(0, 16)
    a = tl.load(x + r[:, None] * 16 + r[None, :])
    tl.store(y + r[:, None] * 16 + r[None, :], tl.dot(a, a, input_precision=PREC))


def run_probe(device: str) -> None:
    """Launch the probe on ``device`` and check its product (small integers: exact in any
    precision); raises on any failure."""
    x = (torch.arange(256, dtype=torch.float32) % 7 - 3).reshape(16, 16).to(device)
    y = torch.empty_like(x)
    with device_guard(x):
        probe_kernel[(1,)](x, y, PREC="ieee")
    want = x.cpu() @ x.cpu()
    if not torch.equal(y.cpu(), want):
        raise RuntimeError("the probe kernel ran but computed a wrong product")
