"""The decode engine (`atlas_core.decode.Decoder`) against its reference, the model's own ``step``:
every position's logits and the final state equal (float64), for every kind of block it runs
(delta-family memory layers in place, any other rule through the layer, attention with its cache
and window, SwiGLU / GELU / routed-expert MLPs, pre- and post-norm); batched prompts of different
lengths decode each exactly as alone; bfloat16 weights keep the memory and the residual stream in float32."""

from __future__ import annotations

import pytest
import torch

import atlas_core as ac
from atlas_core.decode import Decoder, generate, supports
from atlas_core.decode.blocks import GenericMemoryStep, MemoryStep

VOCAB = 50
ATTN = {"heads": 4, "kv_heads": 2, "qk_norm": "head", "rotary_fraction": 0.5, "output_gate": "sigmoid"}
GDN_LAYER = {"value_heads": 4, "gate_form": {"alpha": "mamba2", "theta": "no_bias"}, "output_gate": "silu"}

#: id -> (memory, layer, model extras); each is a small hybrid core:lm
CASES = {
    "gated_deltanet": ({"use": "zoo:gated_deltanet"}, GDN_LAYER, {}),
    "deltanet_no_conv": ({"use": "zoo:deltanet"}, {"conv_size": 0}, {"mlp": "gelu"}),
    "decay_after_gd": ({"retention": "core:decay", "algorithm": "core:gd"}, {"qk_norm": True}, {}),
    "read_before": ({"use": "zoo:gated_deltanet", "read": "before"}, {}, {}),
    "titans_generic": ({"use": "titans:titans"}, {"value_heads": 4}, {}),
    "titans_anchored": ({"use": "titans:titans", "anchor": 4}, {}, {}),
    "post_norm_window_moe": ({"use": "zoo:gated_deltanet"}, {}, {
        "attention": {**ATTN, "block_norm": "post", "window": 3, "qk_norm": "all"},
        "moe": {"experts": 3, "top_k": 2, "hidden": 8, "shared_hidden": 8, "blocks": [2, 3]}}),
    "mlp_block": ({"use": "zoo:gated_deltanet"}, {}, {"layers": ["memory", "mlp", "attention", "memory"]}),
}


def model_for(case: str, dtype=torch.float64, seed: int = 0):
    memory, layer, extra = CASES[case]
    model = {"arch": "core:lm", "vocab_size": VOCAB, "d_model": 32, "depth": 4, "heads": 2, "mlp": "swiglu",
             "layers": ["memory", "attention"], "attention": ATTN, **extra}
    torch.manual_seed(seed)
    m = ac.build_model({"schema": "atlas/1", "name": case, "model": model, "memory": memory, "layer": layer})
    with torch.no_grad():  # gates and norms off their init: every term of the step matters
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m.to(dtype).eval()


def same_state(a, b, tol):
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a.to(b.dtype), b, rtol=tol, atol=tol)
    elif isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            same_state(a[k], b[k], tol)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same_state(x, y, tol)
    else:
        assert a == b


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_step_equals_the_model_step(case):
    m = model_for(case)
    ids = torch.randint(0, VOCAB, (1, 11), generator=torch.Generator().manual_seed(1))
    dec = Decoder(m, batch=1, max_len=64, prefill_chunk=4)  # the prompt prefilled in three pieces
    fast = [type(mx).__name__ for _, mx, _ in dec.steps if mx is not None]
    assert ("GenericMemoryStep" in fast) == case.startswith("titans")
    with torch.no_grad():
        want, state = m.step(ids, None)
        got = dec.prefill([ids[0]])
        torch.testing.assert_close(got, want[:, -1], rtol=1e-10, atol=1e-10)
        nxt = torch.tensor([7])
        for _ in range(6):
            want, state = m.step(nxt[None], state)
            got = dec.step(nxt)
            torch.testing.assert_close(got, want[:, -1], rtol=1e-10, atol=1e-10)
            nxt = got.argmax(-1)
    same_state(dec.state(0), state, 1e-10)


@pytest.mark.parametrize("case", ["gated_deltanet", "titans_generic", "titans_anchored", "post_norm_window_moe"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_batched_prompts_decode_as_alone(case, dtype):
    m = model_for(case, dtype)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen) for n in (5, 12, 1)]
    together = list(generate(m, prompts, 8, greedy=True))
    assert [(t.row, t.position) for t in together[:3]] == [(0, 5), (1, 12), (2, 1)]
    for b, p in enumerate(prompts):
        alone = [t.token for t in generate(m, [p], 8, greedy=True)]
        assert [t.token for t in together if t.row == b] == alone
        reference = [t.token for t in generate(m, [p], 8, greedy=True, fast=False)]
        assert alone == reference


def test_generate_falls_back_to_the_model_step():
    m = ac.build_model("examples/titans_mag.toml").eval()
    ok, why = supports(m)
    assert not ok and "MAGBlock" in why
    out = list(generate(m, [torch.tensor([1, 2, 3]), torch.tensor([4])], 3, greedy=True))
    assert len(out) == 6
    want = m.generate(torch.tensor([[1, 2, 3]]), 3, greedy=True)[0, 3:].tolist()
    assert [t.token for t in out if t.row == 0] == want


def test_bfloat16_weights_keep_the_memory_and_the_residual_stream_in_float32():
    m32 = model_for("gated_deltanet", torch.float32)
    m16 = model_for("gated_deltanet", torch.bfloat16)
    wide = model_for("gated_deltanet", torch.bfloat16).float()  # the same bf16 values, float32 throughout
    ids = torch.randint(0, VOCAB, (1, 16), generator=torch.Generator().manual_seed(3))
    dec16, dec32, decw = Decoder(m16, max_len=64), Decoder(m32, max_len=64), Decoder(wide, max_len=64)
    with torch.no_grad():
        a, b, c = dec32.prefill([ids[0]]), dec16.prefill([ids[0]]), decw.prefill([ids[0]])
        for t in range(4):
            a, b, c = dec32.step(torch.tensor([t])), dec16.step(torch.tensor([t])), decw.step(torch.tensor([t]))
    mem = [mx for _, mx, _ in dec16.steps if isinstance(mx, MemoryStep)]
    assert mem and all(mx.M.dtype == torch.float32 for mx in mem)
    assert b.dtype == torch.float32 and dec16.act == torch.float32
    # bf16 logits within 5 % of the float32 weights' scale (measured ~3 %: the weights' rounding)
    assert (b - a).abs().max() < 0.05 * a.abs().max()
    # and within 1 % of the same bf16 values computed in float32 (measured 0.4 %): activations are
    # not rounded to bfloat16 between blocks
    assert (b - c).abs().max() < 0.01 * c.abs().max()
    assert all(p.dtype == torch.bfloat16 for p in m16.parameters())


def test_the_cache_bounds_are_checked():
    m = model_for("gated_deltanet")
    dec = Decoder(m, max_len=8)
    with pytest.raises(ValueError, match="max_len"):
        dec.prefill([torch.arange(8)])
    dec.prefill([torch.arange(6)])
    dec.step(torch.tensor([1]))
    with pytest.raises(ValueError, match="max_len=8"):
        dec.step(torch.tensor([1]))
        dec.step(torch.tensor([1]))
    with pytest.raises(ValueError, match="2 prompts for a decoder of batch 1"):
        Decoder(m).prefill([torch.arange(3), torch.arange(2)])


def test_generic_memory_is_the_layer_itself():
    m = model_for("titans_generic")
    dec = Decoder(m)
    assert any(isinstance(mx, GenericMemoryStep) for _, mx, _ in dec.steps)
    assert not any(isinstance(mx, MemoryStep) for _, mx, _ in dec.steps)


def test_a_bfloat16_prefill_runs_each_block_in_float32_and_leaves_the_weights_as_they_were():
    import copy

    from atlas_core.decode.widen import widened_blocks

    m16 = model_for("post_norm_window_moe", torch.bfloat16)
    wide = copy.deepcopy(m16).float()  # the same bf16 values, every product in float32
    ids = torch.randint(0, VOCAB, (20,), generator=torch.Generator().manual_seed(5))
    before = {n: (p.dtype, p.data_ptr()) for n, p in m16.named_parameters()}
    with torch.no_grad():
        got = Decoder(m16, max_len=64, prefill_chunk=7).prefill([ids])
        want = Decoder(wide, max_len=64, prefill_chunk=7).prefill([ids])
    assert got.dtype == torch.float32  # the decoder's residual dtype
    # only the residual stream between blocks is rounded to bfloat16
    assert (got.float() - want).abs().max() < 0.03 * want.abs().max()
    after = {n: (p.dtype, p.data_ptr()) for n, p in m16.named_parameters()}
    fused = {n for n in before if before[n] != after[n]}  # the decoder's fused rows: same dtype
    assert all(after[n][0] == torch.bfloat16 for n in after) and all(before[n][0] == torch.bfloat16 for n in fused)
    assert not any(b._forward_pre_hooks or b._forward_hooks for b in m16.blocks)
    with pytest.raises(RuntimeError, match="boom"), widened_blocks(m16):  # an error restores them too
        m16.blocks[0].register_forward_pre_hook(lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))  # after the widening
        m16.step(ids[None, :3])
    assert all(p.dtype == torch.bfloat16 for p in m16.parameters())
