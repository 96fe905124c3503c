"""Titans architectures (LMM, MAG, MAL, MAC): causality, cached decoding == full forward (float64)
for every strategy (core:chunkwise on an anchored rule, core:exact_chunk and core:sequential on
per-token rules, core:sequential on an anchored deep rule), generation, bounded decoding state (the
memory state is the layer's flat state dict: no chunk buffer), MAC's committed-memory retrieval,
training, bad input."""

from __future__ import annotations

import copy

import pytest
import torch

import atlas_core as ac
from atlas_core.errors import SpecError

V, T = 32, 13  # T > window (3) and > segment (4): crosses several windows, segments and chunks

ARCH_PARAMS = {
    "titans:lmm": {},
    "titans:mag": {"window": 3, "persistent_tokens": 2},
    "titans:mal": {"window": 3, "persistent_tokens": 2},
    "titans:mac": {"segment_size": 4, "persistent_tokens": 2, "window": 3},
}
MEMORIES = {
    # an anchored rule (anchor 4) under chunkwise at C = 4: decoding one token at a time (the
    # sequential step) must carry the anchor block's position and memory to match the full forward
    "linear-chunk4": {"use": "titans:titans", "anchor": 4,
                      "parallel": {"use": "core:chunkwise", "chunk_size": 4}},
    # chunks of 2 inside anchor blocks of 8: a call may start inside a chunk and inside a block
    "linear-a8-chunk2": {"use": "titans:titans", "anchor": 8,
                         "parallel": {"use": "core:chunkwise", "chunk_size": 2}},
    # the per-token rule, exact in chunks of 4 (the WY form)
    "linear-exact4": {"use": "titans:titans", "parallel": {"use": "core:exact_chunk", "chunk_size": 4}},
    # the deep preset is anchored (16) by default; run by the reference loop
    "deep-seq": {"use": "titans:titans_deep", "structure": {"use": "titans:mlp", "expansion": 1.0},
                 "parallel": "core:sequential"},
}


def spec_for(arch, memory="linear-chunk4", **model):
    return {
        "name": "tiny",
        "model": {"arch": arch, "vocab_size": V, "d_model": 16, "depth": 2, "heads": 2,
                  "mlp_ratio": 2.0, **ARCH_PARAMS[arch], **model},
        "memory": copy.deepcopy(MEMORIES[memory]),
        "layer": {"conv_size": 3},
    }


def build(arch, memory="linear-chunk4", seed=0, **model):
    torch.manual_seed(seed)
    return ac.build_model(spec_for(arch, memory, **model)).double().eval()


CASES = [pytest.param(a, m, id=f"{a.split(':')[1]}-{m}") for a in ARCH_PARAMS for m in MEMORIES]
# a block without memory in each hybrid (an attention block; an MLP block in the LMM)
PARTIAL = [pytest.param(a, id=a.split(":")[1]) for a in ARCH_PARAMS]


def ids_for(seed=1, B=2, n=T):
    return torch.randint(0, V, (B, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch,memory", CASES)
def test_causality_exact(arch, memory):
    model = build(arch, memory)
    ids = ids_for()
    t = 6
    other = ids.clone()
    other[:, t + 1 :] = (ids[:, t + 1 :] + 1 + torch.arange(T - t - 1)) % V
    with torch.no_grad():
        a, b = model(ids), model(other)
    assert a.shape == (2, T, V)
    assert torch.equal(a[:, : t + 1], b[:, : t + 1]), (a[:, : t + 1] - b[:, : t + 1]).abs().max()
    assert (a[:, t + 1 :] - b[:, t + 1 :]).abs().max() > 1e-6  # the future does matter


def decode(model, ids, pieces):
    """Logits from feeding ``ids`` in pieces of the given sizes through step()."""
    outs, state, i = [], None, 0
    for n in pieces:
        logits, state = model.step(ids[:, i : i + n], state)
        outs.append(logits)
        i += n
    assert i == ids.shape[1]
    return torch.cat(outs, dim=1), state


@pytest.mark.parametrize("arch,memory", CASES)
def test_cached_decoding_equals_full_forward(arch, memory):
    model = build(arch, memory)
    ids = ids_for(n=T + 6)
    with torch.no_grad():
        full = model(ids)
        one_by_one, _ = decode(model, ids, [3] + [1] * (T + 3))
        uneven, _ = decode(model, ids, [1, 5, 2, 7, 4])
        whole, _ = decode(model, ids, [T + 6])
    torch.testing.assert_close(one_by_one, full, rtol=0, atol=1e-8)
    torch.testing.assert_close(uneven, full, rtol=0, atol=1e-8)
    torch.testing.assert_close(whole, full, rtol=0, atol=1e-8)


# the same rule (same parameters for the same seed) under every strategy that accepts it
SAME_RULE = {
    "anchor4": ({"use": "titans:titans", "anchor": 4},
                ["core:sequential", {"use": "core:chunkwise", "chunk_size": 1},
                 {"use": "core:chunkwise", "chunk_size": 2}, {"use": "core:chunkwise", "chunk_size": 4},
                 {"use": "core:chunkwise"}]),
    "per-token": ({"use": "titans:titans"},
                  ["core:sequential", {"use": "core:exact_chunk", "chunk_size": 3},
                   {"use": "core:exact_chunk", "chunk_size": 16}, {"use": "core:chunkwise", "chunk_size": 1}]),
}


@pytest.mark.parametrize("rule", list(SAME_RULE))
@pytest.mark.parametrize("arch", list(ARCH_PARAMS))
def test_a_strategy_never_changes_the_function(arch, rule):
    """Same rule, same seed: every strategy gives the sequential rule's logits, in one call and
    decoded one token at a time; another anchor is another function."""
    memory, strategies = SAME_RULE[rule]
    ids = ids_for(n=T)

    def logits(mem, parallel):
        spec = spec_for(arch)
        spec["memory"] = {**copy.deepcopy(mem), "parallel": copy.deepcopy(parallel)}
        torch.manual_seed(0)
        model = ac.build_model(spec).double().eval()
        with torch.no_grad():
            return model(ids), decode(model, ids, [2, 3] + [1] * (T - 5))[0]

    ref, ref_steps = logits(memory, "core:sequential")
    torch.testing.assert_close(ref_steps, ref, rtol=0, atol=1e-8)
    for parallel in strategies[1:]:
        got, steps = logits(memory, parallel)
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-8, msg=lambda m: f"{parallel}: {m}")
        torch.testing.assert_close(steps, ref, rtol=0, atol=1e-8, msg=lambda m: f"{parallel}: {m}")
    other = {**memory, "anchor": 8 if memory.get("anchor", 1) == 4 else 4}
    assert (logits(other, "core:sequential")[0] - ref).abs().max() > 1e-6  # the anchor is the rule


@pytest.mark.parametrize("arch", PARTIAL)
def test_memory_layers_choose_blocks(arch):
    model = build(arch, memory_layers=[2])
    has_memory = [any(n.startswith("memory.") for n, _ in b.named_parameters()) for b in model.blocks]
    assert has_memory == [False, True]
    ids = ids_for(n=T)
    with torch.no_grad():
        full = model(ids)
        step, _ = decode(model, ids, [2] + [1] * (T - 2))
        other = ids.clone()
        other[:, 8:] = (other[:, 8:] + 3) % V
        assert torch.equal(model(other)[:, :8], full[:, :8])
    torch.testing.assert_close(step, full, rtol=0, atol=1e-8)


def state_numel(state) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel()
    if isinstance(state, dict):
        return sum(state_numel(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_numel(v) for v in state)
    return 0


def memory_states(arch, state):
    """The memory layer's state of each block (MAG/MAL keep it beside the attention cache)."""
    blocks = state["blocks"]
    if arch in ("titans:mag", "titans:mal"):
        return [b["memory"] for b in blocks]
    if arch == "titans:mac":
        return [b["committed"] for b in blocks]
    return blocks


@pytest.mark.parametrize("arch", list(ARCH_PARAMS))
def test_decoding_state_stays_bounded(arch):
    """No cache grows with the sequence: the state cycles with the window/segment sizes, and the
    memory's state is the layer's flat state dict (no chunk buffer), the same size at every step."""
    model = build(arch)
    ids = ids_for(n=64, B=1)
    sizes, mem_sizes, state = [], [], None
    with torch.no_grad():
        for t in range(64):
            _, state = model.step(ids[:, t : t + 1], state)
            sizes.append(state_numel(state))
            if arch != "titans:mac" or t >= 3:  # MAC commits its memory at the first segment's end
                mem_sizes.append(state_numel(memory_states(arch, state)))
    assert max(sizes[16:32]) == max(sizes[48:64]) > 0
    assert sizes[47] == sizes[63]  # same phase of every period (4 divides 16)
    assert len(set(mem_sizes)) == 1 and mem_sizes[0] > 0, mem_sizes
    for mem in memory_states(arch, state):
        assert set(mem) == {"conv.q", "conv.k", "conv.v", "rule.M", "rule.Z.M", "rule.anchor.pos",
                            "rule.anchor.M"}
        assert all(isinstance(x, torch.Tensor) for x in mem.values())
        assert 0 <= int(mem["rule.anchor.pos"]) < 4  # the position inside an anchor block of 4
    if arch == "titans:lmm":  # nothing else to carry: the size never changes
        assert len(set(sizes)) == 1
        assert [int(m["rule.anchor.pos"]) for m in memory_states(arch, state)] == [64 % 4] * 2


@pytest.mark.parametrize("arch", list(ARCH_PARAMS))
def test_generate_greedy_matches_full_forward_argmax(arch):
    model = build(arch)
    prompt = ids_for(n=3)
    out = model.generate(prompt, max_new_tokens=9, greedy=True)
    assert out.shape == (2, 12) and torch.equal(out[:, :3], prompt)
    with torch.no_grad():
        logits = model(out[:, :-1])
    assert torch.equal(out[:, 3:], logits[:, 2:].argmax(-1))
    # top_k = 1 is greedy; sampled tokens are valid ids and reproducible under a seed
    assert torch.equal(model.generate(prompt, 9, top_k=1), out)
    s1 = model.generate(prompt, 9, temperature=0.8, top_p=0.9, generator=torch.Generator().manual_seed(5))
    s2 = model.generate(prompt, 9, temperature=0.8, top_p=0.9, generator=torch.Generator().manual_seed(5))
    assert torch.equal(s1, s2) and int(s1.min()) >= 0 and int(s1.max()) < V


def test_mac_retrieval_reads_only_committed_memory():
    """Within a segment, the retrieved token h_t depends on x_t and the committed memory only."""
    model = build("titans:mac", depth=1)
    block = model.blocks[0]
    seen = []
    real = block.retrieve
    block.retrieve = lambda s, committed: seen.append(real(s, committed)) or seen[-1]
    ids = ids_for(n=12)
    other = ids.clone()
    other[:, 4] = (ids[:, 4] + 1) % V  # the first token of the second segment
    with torch.no_grad():
        model(ids)
        h_a = torch.cat(seen, 1)
        seen.clear()
        model(other)
        h_b = torch.cat(seen, 1)
    assert torch.equal(h_a[:, 5:8], h_b[:, 5:8])  # same segment: memory not yet committed
    assert (h_a[:, 8:] - h_b[:, 8:]).abs().max() > 1e-8  # next segment: committed memory changed


@pytest.mark.parametrize("arch", list(ARCH_PARAMS))
def test_trains_a_few_steps(arch):
    torch.manual_seed(0)
    model = ac.build_model(spec_for(arch, "deep-seq" if arch == "titans:mag" else "linear-chunk4"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = ids_for(n=17, B=4)
    losses = []
    for _ in range(6):
        loss = model.loss(ids[:, :-1], ids[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    # gradients reach the persistent tokens and the memory layer's learned parameters
    names = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert any("memory.q_proj" in n for n in names)
    if arch != "titans:lmm":
        assert any(n.endswith("persistent") for n in names)


# -- bad input -----------------------------------------------------------------------------------
BAD = [
    ("titans:mag", {"window": 0}, "model.window"),
    ("titans:mal", {"window": 2, "persistent_tokens": 3}, "model.persistent_tokens"),
    ("titans:mac", {"segment_size": 0}, "model.segment_size"),
    ("titans:mac", {"segment_size": 4, "persistent_tokens": 5}, "model.persistent_tokens"),
    ("titans:lmm", {"memory_layers": [0, 3]}, "model.memory_layers"),
    ("titans:mag", {"attn_heads": 3}, "model.attn_heads"),
]


@pytest.mark.parametrize("arch,model,path", BAD, ids=[b[2].split(".")[1] + "-" + b[0][7:] for b in BAD])
def test_bad_model_params_are_spec_errors_with_path(arch, model, path):
    with pytest.raises(SpecError) as err:
        ac.build_model(spec_for(arch, **model))
    assert any(i.path == path for i in err.value.issues), str(err.value)


@pytest.mark.parametrize("arch", list(ARCH_PARAMS))
def test_a_rule_the_architecture_cannot_host(arch):
    spec = spec_for(arch)
    spec["memory"] = {"use": "mru:mru"}  # a standalone rule with its own layer
    with pytest.raises(SpecError) as err:
        ac.build_model(spec)
    assert err.value.issues[0].path.startswith("memory") and "cannot host" in str(err.value)


def test_deep_memory_residual_mismatch_is_a_spec_error():
    spec = spec_for("titans:lmm", "deep-seq")
    spec["layer"]["d_value"] = 4  # d_key = 8: the MLP residual x + f(x) cannot add
    with pytest.raises(SpecError, match="residual") as err:
        ac.build_model(spec)
    assert err.value.issues[0].path == "memory.structure.residual"


@pytest.mark.parametrize("arch", ["titans:mag", "titans:mac"])
def test_other_plugins_rules_plug_in(arch):
    """An Atlas rule (omega window bias, polynomial features, Muon, deep memory) from other plugins,
    with its own chunked strategy: decoding still equals the full forward pass."""
    spec = spec_for(arch)
    spec["memory"] = {"use": "atlas_muon:atlas",
                      "structure": {"use": "titans:mlp", "expansion": 1.0},
                      "parallel": {"use": "atlas_muon:atlas_parallel", "chunk_size": 4}}
    torch.manual_seed(0)
    model = ac.build_model(spec).double().eval()
    ids = ids_for(n=T)
    with torch.no_grad():
        full = model(ids)
        step, _ = decode(model, ids, [2] + [1] * (T - 2))
    torch.testing.assert_close(step, full, rtol=0, atol=1e-8)


@pytest.mark.parametrize("arch", list(ARCH_PARAMS))
def test_model_mlp_option_builds_every_blocks_mlp(arch):
    """``[model] mlp = "swiglu"`` (and ``mlp_hidden``) reach every block, the memory-free ones
    included: no block keeps the default GELU MLP."""
    from atlas_core.lm import FeedForward, SwiGLU

    model = build(arch, memory_layers=[2], mlp="swiglu", mlp_hidden=24)
    mlps = [m for m in model.modules() if isinstance(m, (SwiGLU, FeedForward))]
    assert len(mlps) == len(model.blocks) and all(isinstance(m, SwiGLU) for m in mlps)
    hidden = {p.shape[0] for m in mlps for n, p in m.named_parameters() if p.dim() == 2
              and p.shape[1] == 16}
    assert hidden == {24}
    with torch.no_grad():
        assert torch.isfinite(model(ids_for())).all()
