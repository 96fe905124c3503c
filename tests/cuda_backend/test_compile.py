"""The kernels compiled ahead of time for an H100 (sm_90), on this machine, without a GPU
(`atlas_plugins.cuda_backend.compile_check`, run in a subprocess without TRITON_INTERPRET).

- Every boundary configuration the backend can dispatch — the largest per direction (forward,
  backward), dtype (float32, half), momentum and window (C + c - 1 = 64 or 128 rows), at C = 64,
  Dv = 128, and Dk = 128 forward; backward the verifier's limits when gradients are needed
  (Dk = 64 with 64 rows, 32 with 128, momentum at most 64 rows) —
  needs at most 232,448 B of shared memory per block (the H100's limit, which Triton checks
  before a launch), with margin. Compiling a D = 128 configuration takes minutes,
  so rows already measured for the same kernel source, options, target and Triton version are
  read from docs/kernel_resources_sm90.json (written by scripts/kernel_resources.py); any change
  to a kernel changes its key and the configuration is compiled here again (to LLVM IR, where
  Triton decides its shared memory: `compile_check.shared_bytes`).
- The verifier's device check refuses exactly what Triton's launch would: a configuration whose
  compiled shared memory exceeds the device's limit (compiled here for real, a small one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton  # noqa: F401 - without Triton this module must fail, not skip

from atlas_plugins.cuda_backend import compile_check as cc

pytestmark = pytest.mark.triton
H100_SHARED = 232_448
RESULTS = Path(__file__).resolve().parents[2] / "docs" / "kernel_resources_sm90.json"


@pytest.fixture(scope="module")
def boundary():
    return cc.run_isolated("boundary", 90, known=str(RESULTS), shared_only=True)


def test_boundary_configurations_fit_an_h100(boundary):
    labels = [r["label"] for r in boundary]
    assert len(labels) == 16 and len(set(labels)) == 16
    for direction in ("fwd", "bwd"):
        for dtype in ("fp32", "bf16"):
            for alg in ("gd", "momentum"):
                for c in (1, 65):  # the backward serves Dk <= 64, (C + c - 1) x Dk <= 4096 and,
                    C = 64            # with momentum, C + c - 1 <= 64
                    if direction == "bwd" and alg == "momentum" and c > 1:
                        C, c = 32, 33
                    dk = 128 if direction == "fwd" else min(64, 4096 // (C + c - 1))
                    assert f"{direction} {dtype} {alg} c={c} C={C} Dk={dk} Dv=128" in labels
    for r in boundary:
        assert r["arch"] == 90 and r["limit"] == H100_SHARED
        assert 0 < r["shared"] <= 0.9 * H100_SHARED, r  # fits, with 10% to spare
    # the case: the float32 forward at D = 128, C = 64 (263,680 B before) now fits
    fwd = next(r for r in boundary if r["label"] == "fwd fp32 gd c=1 C=64 Dk=128 Dv=128")
    assert fwd["shared"] < 263_680 and fwd["num_stages"] == 1




_FITS = """
import json
from atlas_plugins.cuda_backend import compile_check as cc
from atlas_plugins.cuda_backend.chunk_linear import Config
import torch
cfg = Config.make(16, 4, 32, 32, "l2", "after", True, torch.float32)
kernel = cc.chunk_linear_kernel(cfg, "fwd", "fp32")
need = cc.compile_config(kernel, 90).metadata.shared
print(json.dumps([need, cc.shared_bytes(kernel, 90), cc.shared_fits(cfg, "fp32", ("fwd",), 90, need),
                  cc.shared_fits(cfg, "fp32", ("fwd",), 90, need - 1)]))
"""


def test_device_check_refuses_exactly_what_cannot_launch():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _FITS], env=env, capture_output=True, text=True, check=True)
    need, quick, at_limit, below = json.loads(out.stdout.strip().splitlines()[-1])
    assert need > 0 and quick == need  # the stages up to LLVM IR decide it
    assert at_limit == [True, ""]
    ok, why = below
    assert not ok
    assert f"the forward kernel needs {need} B of shared memory per block" in why
    assert f"the device allows {need - 1} B" in why
