"""The compiled memory step (`MemoryStep.compiled`, ``csrc/memory_step.cpp``) against its readable
reference (`MemoryStep.reference`, which tests/decode/test_decoder.py checks against the model's
own ``step`` in float64): every delta-family case the decoder runs in place (grouped value heads
and a Mamba-2 gate, no convolution, decay after the step, read before it, post-norm), float32 and
bfloat16 weights, batched rows; logits at every step and the final state."""

from __future__ import annotations

import shutil

import pytest
import torch

from atlas_core.allocator import release_free
from atlas_core.decode import Decoder
from atlas_core.decode.blocks import MemoryStep

from .test_decoder import VOCAB, model_for

needs_compiler = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler on this machine")


def decode(model, compiled: bool, prompts, steps):
    dec = Decoder(model, batch=len(prompts), max_len=32)
    mems = [m for _, m, _ in dec.steps if isinstance(m, MemoryStep)]
    assert mems
    if compiled:
        assert all(m.kernel is not None for m in mems)
    else:
        for m in mems:
            m.kernel = None
    out = [dec.prefill(prompts)]
    for ids in steps:
        out.append(dec.step(ids))
    return torch.stack(out), [dec.state(r) for r in range(len(prompts))]


def flat(state):
    if isinstance(state, dict):
        return [t for k in sorted(state) for t in flat(state[k])]
    if isinstance(state, (list, tuple)):
        return [t for s in state for t in flat(s)]
    return [state] if isinstance(state, torch.Tensor) else []


CASES = ["gated_deltanet", "deltanet_no_conv", "decay_after_gd", "read_before", "post_norm_window_moe"]


def inputs():
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g) for n in (5, 9)]
    return prompts, torch.randint(0, VOCAB, (6, 2), generator=g)


@needs_compiler
@pytest.mark.parametrize("case", CASES)
def test_compiled_step_equals_the_reference_in_float32(case):
    model = model_for(case, torch.float32)
    prompts, steps = inputs()
    got, got_state = decode(model, True, prompts, steps)
    want, want_state = decode(model, False, prompts, steps)
    assert (got - want).abs().max() <= 2e-5 * want.abs().max()
    for a, b in zip(flat(got_state), flat(want_state), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert (a - b).abs().max() <= 2e-5 * max(1.0, b.abs().max())


@needs_compiler
@pytest.mark.parametrize("case", CASES)
def test_compiled_step_with_bfloat16_weights_is_as_close_to_float32(case):
    """With bfloat16 weights the reference rounds q, k, v and the memory's output to bfloat16 on
    the way, the compiled step keeps them in float32: against the same weights decoded in float32,
    the compiled step is at least as close as the reference (within a quarter)."""
    model = model_for(case, torch.float32).to(torch.bfloat16)
    prompts, steps = inputs()
    got, got_state = decode(model, True, prompts, steps)
    ref, _ = decode(model, False, prompts, steps)
    want, _ = decode(model.float(), False, prompts, steps)
    scale = want.abs().max()
    err_got, err_ref = (got.float() - want).abs().max() / scale, (ref.float() - want).abs().max() / scale
    assert err_got <= 1.25 * err_ref + 1e-3, (err_got, err_ref)
    assert all(t.dtype in (torch.bfloat16, torch.float32) for t in flat(got_state))


@needs_compiler
def test_the_compiled_step_is_not_taken_where_it_does_not_apply(monkeypatch):
    model = model_for("gated_deltanet", torch.float64)  # a float64 memory: the reference runs
    dec = Decoder(model, max_len=8)
    assert all(m.kernel is None for _, m, _ in dec.steps if isinstance(m, MemoryStep))
    monkeypatch.setenv("ATLAS_CPU_KERNELS", "0")
    dec = Decoder(model_for("gated_deltanet", torch.float32), max_len=8)
    assert all(m.kernel is None for _, m, _ in dec.steps if isinstance(m, MemoryStep))


def test_release_free_runs_on_this_c_library():
    import platform

    assert release_free() is (platform.libc_ver()[0] == "glibc")
