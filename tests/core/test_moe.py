"""Routed experts (`atlas_core.moe.SparseMoE`) against a per-token readable reference and against
transformers' ``Qwen3NextSparseMoeBlock`` on the same weights.

The reference takes one token at a time: router probabilities by a float32 softmax, the k largest
(ties: the lower index), renormalised with ``norm_topk``, the weighted sum of those experts'
SwiGLUs, plus the shared expert's SwiGLU scaled by ``sigmoid(w . x)`` (or unscaled without the
shared gate). Gradients reach the router, the chosen experts (and only them) and the shared expert;
``top_k > experts`` is refused in the params (a spec error) and by the module.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from atlas_core.errors import SpecError
from atlas_core.moe import MoEParams, SparseMoE
from atlas_core.spec import load_spec

D, E, I = 8, 4, 6


def make(seed=0, **kw) -> SparseMoE:
    """Float64 experts on d_model 8, every weight N(0, 0.5) (the router too, so that its
    probabilities are far from uniform)."""
    torch.manual_seed(seed)
    p = MoEParams(**{"experts": E, "top_k": 2, "hidden": I, **kw})
    moe = SparseMoE(D, p).double()
    with torch.no_grad():
        for param in moe.parameters():
            param.normal_(0.0, 0.5)
    return moe


def tokens(shape=(2, 5), seed=1, requires_grad=False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, D, generator=g, dtype=torch.float64).requires_grad_(requires_grad)


def swiglu(x, w_gate, w_up, w_down):
    return w_down @ (F.silu(w_gate @ x) * (w_up @ x))


def reference(moe: SparseMoE, x: torch.Tensor) -> torch.Tensor:
    """``x: [..., d]``, one token at a time."""
    k, hid = moe.top_k, moe.hidden
    out = []
    for xt in x.reshape(-1, x.shape[-1]):
        p = torch.softmax((moe.router @ xt).float(), dim=0)  # router probabilities in float32
        chosen = sorted(range(p.shape[0]), key=lambda e: (-p[e].item(), e))[:k]
        w = p[chosen]
        if moe.norm_topk:
            w = w / w.sum()
        w = w.to(x.dtype)
        y = sum(w[i] * swiglu(xt, moe.gate_up[e][:hid], moe.gate_up[e][hid:], moe.down[e])
                for i, e in enumerate(chosen))
        if hasattr(moe, "shared"):
            s = swiglu(xt, moe.shared.gate.weight, moe.shared.up.weight, moe.shared.down.weight)
            if hasattr(moe, "shared_gate"):
                s = torch.sigmoid(moe.shared_gate.weight[0] @ xt) * s
            y = y + s
        out.append(y)
    return torch.stack(out).reshape(x.shape)


CASES = {  # id -> MoEParams fields beyond experts=4, hidden=6
    "top2-noshared-norm": {"top_k": 2},
    "top2-noshared-nonorm": {"top_k": 2, "norm_topk": False},
    "top1-noshared-norm": {"top_k": 1},
    "top4of4-noshared-nonorm": {"top_k": 4, "norm_topk": False},
    "top2-shared10-gated-norm": {"top_k": 2, "shared_hidden": 10},
    "top2-shared10-ungated-norm": {"top_k": 2, "shared_hidden": 10, "shared_gate": False},
    "top3-shared10-gated-nonorm": {"top_k": 3, "shared_hidden": 10, "norm_topk": False},
}


@pytest.mark.parametrize("case", list(CASES))
def test_equals_per_token_reference(case):
    moe = make(**CASES[case])
    x = tokens()
    y = moe(x)
    assert y.shape == x.shape and y.dtype == torch.float64
    torch.testing.assert_close(y, reference(moe, x), rtol=1e-7, atol=1e-9)


def test_routing_picks_the_largest_and_renormalises():
    moe = make(top_k=2)
    flat = tokens().reshape(-1, D)
    weights, index = moe.route(flat)
    probs = torch.softmax((flat @ moe.router.T).float(), dim=-1)
    assert weights.shape == index.shape == (10, 2)
    for n in range(10):
        best = probs[n].argsort(descending=True)[:2]
        assert index[n].tolist() == best.tolist()
    torch.testing.assert_close(weights.sum(-1), torch.ones(10, dtype=torch.float64), rtol=1e-6, atol=1e-6)
    raw, _ = make(top_k=2, norm_topk=False).route(flat)
    assert (raw.sum(-1) < 1 - 1e-3).all()  # without norm_topk the chosen probabilities sum below 1


@pytest.mark.parametrize("case", ["top2-shared10-gated-norm", "top3-shared10-gated-nonorm",
                                  "top2-shared10-ungated-norm"])
def test_gradients_equal_reference(case):
    moe = make(**CASES[case])
    x, x_ref = tokens(requires_grad=True), tokens(requires_grad=True)
    w = torch.randn(2, 5, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    names, params = zip(*moe.named_parameters())
    got = torch.autograd.grad((moe(x) * w).sum(), [x, *params])
    want = torch.autograd.grad((reference(moe, x_ref) * w).sum(), [x_ref, *params])
    for name, a, b in zip(["x", *names], got, want):
        assert a.abs().sum() > 0, f"no gradient reaches {name}"
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8, msg=lambda m: f"d/d{name}: {m}")


def test_only_chosen_experts_get_gradients():
    moe = make(top_k=1, shared_hidden=4)
    x = tokens(shape=(1, 2))  # two tokens, one expert each: at least two experts unchosen
    chosen = set(moe.route(x.reshape(-1, D))[1].flatten().tolist())
    moe(x).square().sum().backward()
    assert moe.router.grad.abs().sum() > 0
    assert moe.shared.gate.weight.grad.abs().sum() > 0 and moe.shared_gate.weight.grad.abs().sum() > 0
    for e in range(E):
        used = moe.gate_up.grad[e].abs().sum() > 0 and moe.down.grad[e].abs().sum() > 0
        assert used == (e in chosen), f"expert {e}: chosen={e in chosen}, gradient={bool(used)}"


def test_top_k_above_experts_is_refused():
    with pytest.raises(ValueError, match="top_k=5 exceeds experts=4"):
        MoEParams(experts=4, top_k=5, hidden=6)
    unchecked = MoEParams.model_construct(experts=4, top_k=5, hidden=6, shared_hidden=0, shared_gate=True,
                                          norm_topk=True, blocks=None)
    with pytest.raises(ValueError, match="top_k=5 exceeds experts=4"):
        SparseMoE(D, unchecked)
    spec = {"name": "moe", "model": {"arch": "core:lm", "vocab_size": 16, "d_model": 8, "depth": 1, "heads": 2,
                                     "moe": {"experts": 4, "top_k": 5, "hidden": 6}},
            "memory": {"use": "zoo:gated_deltanet"}}
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    assert [(i.path, i.message) for i in info.value.issues] == [("model.moe", "top_k=5 exceeds experts=4")]


@pytest.mark.parametrize("norm_topk", [True, False], ids=["norm_topk", "no-norm_topk"])
@pytest.mark.parametrize("top_k", [1, 2], ids=lambda k: f"top{k}")
def test_equals_transformers_qwen3_next_sparse_moe_block(top_k, norm_topk):
    # imported here, not at module import: transformers' qwen3_next modeling may pick up fla
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextSparseMoeBlock

    moe = make(top_k=top_k, norm_topk=norm_topk, shared_hidden=10)
    config = Qwen3NextConfig(hidden_size=D, num_experts=E, num_experts_per_tok=top_k, moe_intermediate_size=I,
                             shared_expert_intermediate_size=10, norm_topk_prob=norm_topk, hidden_act="silu")
    hf = Qwen3NextSparseMoeBlock(config).double()
    with torch.no_grad():
        hf.gate.weight.copy_(moe.router)                     # [E, d]
        hf.experts.gate_up_proj.copy_(moe.gate_up)           # [E, 2I, d]: gate rows, then up rows
        hf.experts.down_proj.copy_(moe.down)                 # [E, d, I]
        for name in ("gate", "up", "down"):
            getattr(hf.shared_expert, f"{name}_proj").weight.copy_(getattr(moe.shared, name).weight)
        hf.shared_expert_gate.weight.copy_(moe.shared_gate.weight)
    x, x_hf = tokens(requires_grad=True), tokens(requires_grad=True)
    y, y_hf = moe(x), hf(x_hf)
    torch.testing.assert_close(y, y_hf, rtol=1e-7, atol=1e-9)
    w = torch.randn_like(y)
    (y * w).sum().backward()
    (y_hf * w).sum().backward()
    torch.testing.assert_close(x.grad, x_hf.grad, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(moe.router.grad, hf.gate.weight.grad, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(moe.gate_up.grad, hf.experts.gate_up_proj.grad, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(moe.shared.down.weight.grad, hf.shared_expert.down_proj.weight.grad)


def test_balance_loss_equals_transformers_pooled_over_blocks():
    """``aux_loss`` times transformers' ``load_balancing_loss_func`` over the same blocks' router
    logits (pooled counts and probabilities), with the same gradient to every router."""
    from transformers.models.qwen3_next.modeling_qwen3_next import load_balancing_loss_func

    from atlas_core.moe import take_balance_loss

    blocks = torch.nn.ModuleList([make(seed=s, top_k=2, aux_loss=0.01) for s in range(3)]).train()
    xs = [tokens(seed=10 + s) for s in range(3)]
    for moe, x in zip(blocks, xs):
        moe(x)
    got = take_balance_loss(blocks)
    (g_got,) = torch.autograd.grad(got, [blocks[1].router])
    logits = tuple(x.reshape(-1, D) @ moe.router.T for moe, x in zip(blocks, xs))
    want = 0.01 * load_balancing_loss_func(logits, num_experts=E, top_k=2)
    (g_want,) = torch.autograd.grad(want, [blocks[1].router])
    torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-6, atol=0)
    # our router probabilities are float32 (transformers' softmax keeps float64 here)
    torch.testing.assert_close(g_got, g_want.to(g_got.dtype), rtol=1e-5, atol=1e-6 * g_want.abs().max().item())
    assert got.item() != pytest.approx(0.01 * 2)  # routers far from uniform: not the balanced value k


def test_no_balance_statistics_without_a_coefficient_in_eval_or_once_taken():
    from atlas_core.moe import take_balance_loss

    x = tokens()
    plain = make(top_k=2).train()
    plain(x)
    assert plain.balance is None and take_balance_loss(plain) is None
    moe = make(top_k=2, aux_loss=0.01).eval()
    moe(x)
    assert take_balance_loss(moe) is None  # evaluation records nothing
    moe.train()
    moe(x)
    assert take_balance_loss(moe) is not None
    assert take_balance_loss(moe) is None  # taken once: a later forward starts afresh
