"""``core:lm`` hybrids: memory, softmax-attention and MLP blocks (``[model] layers``), attention
options (``[model.attention]``) and routed experts (``[model.moe]``), built from spec dicts.

Decoding one token per ``step`` and any uneven split into calls equal the full forward (float64);
packed documents equal each document alone; the layer pattern expands to depth and the resolved
spec round-trips through TOML; every strategy that accepts the memory rule gives the same logits
and gradients inside a hybrid; bad specs are one SpecError at the field; a hybrid refuses context
parallelism by ``model.layers``; greedy ``generate`` is argmax decoding; a hybrid trains.
"""

from __future__ import annotations

import copy

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import SpecError
from atlas_core.spec import load_spec

V, T = 32, 8


def spec(layers=("memory", "attention"), depth=2, attention=None, moe=None, memory=None, **model) -> dict:
    """A tiny core:lm: d_model 16, 2 memory heads, SwiGLU MLPs, Gated DeltaNet memory (sequential)."""
    out = {"name": "hybrid",
           "model": {"arch": "core:lm", "vocab_size": V, "d_model": 16, "depth": depth, "heads": 2,
                     "mlp": "swiglu", "mlp_hidden": 24, **model},
           "memory": memory or {"use": "zoo:gated_deltanet", "parallel": "core:sequential"},
           "layer": {"conv_size": 3}}
    if layers is not None:
        out["model"]["layers"] = list(layers)
    if attention is not None:
        out["model"]["attention"] = attention
    if moe is not None:
        out["model"]["moe"] = moe
    return out


HYBRIDS = {  # id -> spec() arguments
    "mem-attn-pre-H4G2-gate-w3": {"attention": {"heads": 4, "kv_heads": 2, "output_gate": "sigmoid", "window": 3}},
    "attn-mem-post-H2G1-headnorm-norotary": {
        "layers": ("attention", "memory"),
        "attention": {"kv_heads": 1, "block_norm": "post", "qk_norm": "head", "rotary": False}},
    "attn-mem-mlp-pre-H4G2-allnorm-rot0.5-w2-moe": {
        "layers": ("attention", "memory", "mlp"), "depth": 3,
        "attention": {"heads": 4, "kv_heads": 2, "qk_norm": "all", "rotary_fraction": 0.5, "window": 2,
                      "output_gate": "sigmoid", "bias": True},
        "moe": {"experts": 4, "top_k": 2, "hidden": 8, "shared_hidden": 8, "blocks": [1, 3]}},
}


def build(seed=0, **kw):
    torch.manual_seed(seed)
    return ac.build_model(spec(**kw)).double().eval()


def ids(B=2, n=T, seed=1):
    return torch.randint(0, V, (B, n), generator=torch.Generator().manual_seed(seed))


def test_the_hybrid_has_the_blocks_it_names():
    from atlas_core.attention import SoftmaxAttention
    from atlas_core.lm import AttentionBlock, MemoryBlock
    from atlas_core.moe import SparseMoE

    model = build(**HYBRIDS["attn-mem-mlp-pre-H4G2-allnorm-rot0.5-w2-moe"])
    a, m, p = model.blocks
    assert isinstance(a, AttentionBlock) and isinstance(a.attn, SoftmaxAttention) and not a.post
    assert (a.attn.heads, a.attn.kv_heads, a.attn.rotary, a.attn.window) == (4, 2, 2, 2)
    assert isinstance(m, MemoryBlock) and m.memory is not None
    assert isinstance(p, MemoryBlock) and p.memory is None  # an MLP block
    assert isinstance(a.mlp, SparseMoE) and isinstance(p.mlp, SparseMoE) and not isinstance(m.mlp, SparseMoE)


@pytest.mark.parametrize("case", list(HYBRIDS))
def test_one_token_steps_equal_the_full_forward(case):
    model = build(**HYBRIDS[case])
    x = ids()
    with torch.no_grad():
        full = model(x)
        state, steps = None, []
        for t in range(T):
            logits, state = model.step(x[:, t:t + 1], state)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("sizes", [(3, 1, 4), (5, 3), (1, 6, 1)], ids=lambda s: "split-" + "-".join(map(str, s)))
@pytest.mark.parametrize("case", list(HYBRIDS))
def test_uneven_calls_equal_one_call(case, sizes):
    model = build(**HYBRIDS[case])
    x = ids()
    with torch.no_grad():
        full = model(x)
        state, parts, a = None, [], 0
        for s in sizes:
            logits, state = model.step(x[:, a:a + s], state)
            parts.append(logits)
            a += s
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", list(HYBRIDS))
def test_packed_documents_equal_each_document_alone(case):
    model = build(**HYBRIDS[case])
    lengths = (1, 5, 3, 4)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    x = ids(B=1, n=sum(lengths))
    with torch.no_grad():
        packed = model(x, cu_seqlens=cu)
        b = cu.tolist()
        alone = torch.cat([model(x[:, s:e]) for s, e in zip(b, b[1:])], dim=1)
        torch.testing.assert_close(packed, alone, rtol=1e-10, atol=1e-10)
        assert not torch.allclose(packed[:, 1:], model(x)[:, 1:])  # the boundaries matter


def test_pattern_expands_to_depth_and_round_trips_through_toml():
    resolved = load_spec(spec(layers=["memory", "attention"], depth=4, attention={"kv_heads": 1},
                              moe={"experts": 2, "top_k": 1, "hidden": 4, "blocks": [2, 4]}))
    assert resolved.model["layers"] == ["memory", "attention", "memory", "attention"]
    assert resolved.model["attention"]["kv_heads"] == 1 and resolved.model["attention"]["window"] is None
    assert resolved.model["moe"]["blocks"] == [2, 4]
    assert load_spec(resolved.to_toml()) == resolved
    # attention blocks without a [model.attention] table get its defaults, filled in the resolved spec
    bare = load_spec(spec(layers=["attention", "memory", "mlp"], depth=3))
    assert bare.model["layers"] == ["attention", "memory", "mlp"]
    assert bare.model["attention"]["block_norm"] == "pre" and bare.model["attention"]["rotary"] is True
    assert load_spec(bare.to_toml()) == bare
    model = ac.build_model(resolved)
    assert [type(b).__name__ for b in model.blocks] == ["MemoryBlock", "AttentionBlock"] * 2


# -- strategies ---------------------------------------------------------------------------------

def _strategies():
    reg = ac.get_registry()
    out = []
    for c in sorted(reg.all("strategy"), key=lambda c: c.name):
        if c.name == "core:sequential":
            continue
        fields = getattr(c.load_params(), "model_fields", {}) or {}
        out.append({"use": c.name, "chunk_size": 3} if "chunk_size" in fields else c.name)
    return out


def _logits_and_grads(model, x):
    logits = model(x)
    w = torch.randn(logits.shape, dtype=logits.dtype, generator=torch.Generator().manual_seed(4))
    names, params = zip(*model.named_parameters())
    return logits, dict(zip(names, torch.autograd.grad((logits * w).sum(), params)))


@pytest.mark.parametrize("rule", ["zoo:gated_deltanet", "zoo:simple_gla"])
def test_every_accepting_strategy_gives_the_same_hybrid(rule):
    hybrid = HYBRIDS["mem-attn-pre-H4G2-gate-w3"]
    ref = build(memory={"use": rule, "parallel": "core:sequential"}, **hybrid)
    x = ids()
    want, want_grads = _logits_and_grads(ref, x)
    accepted, refused = [], []
    for strategy in _strategies():
        try:
            model = ac.build_model(spec(memory={"use": rule, "parallel": strategy}, **hybrid)).double()
        except SpecError as exc:  # refused: named at memory.parallel, with a reason
            assert [i.path for i in exc.issues] == ["memory.parallel"] and exc.issues[0].message.strip()
            refused.append(strategy)
            continue
        model.load_state_dict(ref.state_dict())
        got, grads = _logits_and_grads(model, x)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10, msg=lambda m: f"{strategy}: {m}")
        assert grads.keys() == want_grads.keys()
        for name, g in grads.items():
            torch.testing.assert_close(g, want_grads[name], rtol=1e-8, atol=1e-10,
                                       msg=lambda m: f"{strategy} d/d{name}: {m}")
        accepted.append(strategy)
    wanted = {"zoo:gated_deltanet": "core:exact_chunk", "zoo:simple_gla": "core:chunkwise"}[rule]
    assert wanted in [s["use"] if isinstance(s, dict) else s for s in accepted], (accepted, refused)


# -- spec errors --------------------------------------------------------------------------------

BAD = {  # id -> (spec() arguments, the path of the one issue, words its message holds)
    "layers-3-for-depth-4": ({"layers": ["memory", "attention", "mlp"], "depth": 4}, "model.layers",
                             "layers has 3 entries for depth=4"),
    "layers-and-memory_layers": ({"depth": 4, "memory_layers": [1, 3]}, "model.layers",
                                 "set layers or memory_layers, not both"),
    "attention-without-attention-blocks": ({"layers": ["memory", "mlp"], "attention": {"window": 4}},
                                           "model.attention", "no block is an attention block"),
    "attention-without-layers": ({"layers": None, "attention": {"window": 4}}, "model.attention",
                                 "no block is an attention block"),
    "moe-block-5-of-4": ({"depth": 4, "moe": {"experts": 2, "top_k": 1, "hidden": 4, "blocks": [2, 5]}},
                         "model.moe", "moe.blocks [5] are outside 1..depth=4"),
    "kv_heads-3-of-heads-4": ({"attention": {"heads": 4, "kv_heads": 3}}, "model.attention",
                              "kv_heads=3 must divide heads=4"),
}


def _issues(fn, data):
    with pytest.raises(SpecError) as info:
        fn(data)
    return [(i.path, i.message) for i in info.value.issues]


@pytest.mark.parametrize("case", list(BAD))
def test_spec_errors_are_one_issue_at_the_field(case):
    kw, path, words = BAD[case]
    for fn in (load_spec, ac.build_model):
        issues = _issues(fn, spec(**kw))
        assert len(issues) == 1 and issues[0][0] == path and words in issues[0][1], (fn.__name__, issues)


def test_kv_heads_not_dividing_the_models_heads_is_refused_when_built():
    # attention.heads defaults to [model] heads (4 here): the sizes meet when the model is built
    issues = _issues(ac.build_model, spec(heads=4, attention={"kv_heads": 3}))
    assert issues == [("model.attention", "kv_heads=3 must divide heads=4")]


# -- context parallelism, generation, training --------------------------------------------------

def test_hybrid_refuses_context_parallelism_by_its_layers():
    from atlas_core.distributed.lm import check_model

    resolved = load_spec(spec(**HYBRIDS["mem-attn-pre-H4G2-gate-w3"]))
    assert ac.build_model(resolved).context_parallel is False
    with pytest.raises(SpecError) as info:
        check_model(resolved, 2, 64)
    assert [i.path for i in info.value.issues] == ["model.layers"]
    assert "attention" in info.value.issues[0].message
    plain = load_spec(spec(layers=["memory", "mlp"]))
    assert ac.build_model(plain).context_parallel is True
    check_model(plain, 2, 64)  # accepted: no error
    assert ac.build_model(load_spec(spec(layers=None))).context_parallel is True


@pytest.mark.parametrize("case", ["mem-attn-pre-H4G2-gate-w3", "attn-mem-mlp-pre-H4G2-allnorm-rot0.5-w2-moe"])
def test_greedy_generate_is_argmax_decoding(case):
    model = build(**HYBRIDS[case])
    prompt = ids(n=3, seed=2)
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=6, greedy=True)
        by_hand = prompt
        for _ in range(6):
            nxt = model(by_hand)[:, -1].argmax(-1, keepdim=True)
            by_hand = torch.cat([by_hand, nxt], dim=1)
    assert out.shape == (2, 9)
    assert torch.equal(out, by_hand)


def test_a_hybrid_trains():
    torch.manual_seed(0)
    model = ac.build_model(spec(attention={"kv_heads": 1, "window": 4},
                                moe={"experts": 2, "top_k": 1, "hidden": 8, "blocks": [2]}))
    x = ids(B=4, n=16, seed=3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def loss_fn():
        logits = model(x[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1))

    first = loss_fn().item()
    for _ in range(12):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        opt.step()
    last = loss_fn().item()
    assert last < 0.8 * first, (first, last)
