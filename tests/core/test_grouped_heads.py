"""Grouped value heads (``[layer] value_heads``, atlas_core/layer.py): each q/k head serves
``G = value_heads / heads`` consecutive value heads, as Qwen3.5's ``linear_num_value_heads`` and
fla's ``num_v_heads``; v, the gates, the memory, the output norm and gate are per value head.

- the layer is its documented pipeline with q and k repeated per value head and the rule called
  directly (``core:sequential``): outputs and final state;
- it equals an ungrouped layer (``heads = value_heads``) whose q/k projections and convolutions
  are the grouped layer's rows copied per group: outputs, states and parameter gradients (for
  ``core:lm`` and the Titans architectures too, MAC's retrieval included);
- every strategy that accepts the rule equals ``core:sequential`` (outputs, final state,
  parameter gradients); split calls equal one call; packed documents equal each alone;
- context parallelism over 2 gloo processes equals one process;
- ``value_heads`` unset or equal to ``heads`` is today's layer; bad values give one clear error.

The Triton kernel on a grouped layer: tests/cuda_backend/test_grouped_heads.py (its kernels must
be defined under the interpreter, which that folder's conftest arranges).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import atlas_core as ac
from atlas_core.errors import SpecError
from atlas_core.layer import LayerParams, MemoryLayer
from atlas_core.spec import load_spec
from atlas_core.spec.bounds import lm_estimate

from ..zoo.strategies import accepting
from .test_layer import hand_conv

DT = torch.float64
D_MODEL, D_KEY = 16, 4
TOL = dict(rtol=1e-10, atol=1e-10)

#: fla's Gated DeltaNet layer: mamba2 decay, beta without bias, gated RMSNorm, q scaled
FLA_GDN = {"gate_form": {"alpha": "mamba2", "theta": "no_bias"}, "output_gate": "silu",
           "output_gate_bias": False, "q_scale": "rsqrt_d_key", "conv_init": "normal",
           "qk_norm_eps": 1e-6}


def make_layer(memory, heads: int, value_heads: int | None, strategy="core:sequential", seed=0,
               **layer) -> MemoryLayer:
    torch.manual_seed(seed)
    rule = ac.build_rule(dict(memory) if isinstance(memory, dict) else {"use": memory})
    params = LayerParams(d_key=D_KEY, value_heads=value_heads, **layer)
    return MemoryLayer(D_MODEL, heads, rule, params, strategy=strategy).to(DT)


def _x(B=2, T=13, seed=1) -> torch.Tensor:
    return torch.randn(B, T, D_MODEL, generator=torch.Generator().manual_seed(seed), dtype=DT)


# -- the reference written by hand ----------------------------------------------------------------
def hand_layer(layer: MemoryLayer, x: torch.Tensor):
    """The layer's steps with the layer's weights: projections, conv, SiLU, heads (q/k per key
    head, v per value head), l2 norm, q scale, q and k repeated G times per key head (key head i
    serves value heads i G .. i G + G - 1), gates per value head, the rule by ``core:sequential``,
    output norm, gate, projection."""
    p, H, Hv, n = layer.params, layer.heads, layer.value_heads, layer.steps
    B, T, _ = x.shape
    q, k, v = x @ layer.q_proj.weight.T, x @ layer.k_proj.weight.T, x @ layer.v_proj.weight.T
    q, k, v = (F.silu(hand_conv(z, c)) for z, c in ((q, layer.q_conv), (k, layer.k_conv), (v, layer.v_conv)))
    q = q.reshape(B, T, H, -1)
    k = k.reshape(B, T, n, H, -1) if n > 1 else k.reshape(B, T, H, -1)
    v = v.reshape(B, T, n, Hv, -1) if n > 1 else v.reshape(B, T, Hv, -1)
    eps = p.qk_norm_eps
    q, k = (z / torch.sqrt(z.pow(2).sum(-1, keepdim=True) + eps) for z in (q, k))
    q = q * layer.q_scale
    G = Hv // H
    q = torch.stack([q] * G, dim=-2).flatten(-3, -2)  # [.., H, G, D] -> [.., (H G), D]
    k = torch.stack([k] * G, dim=-2).flatten(-3, -2)
    mask = layer.gate_bias_mask
    raw = (x @ layer.gate_proj.weight.T + layer.gate_proj.bias * mask).split(layer.gate_sizes, -1)
    gates = {}
    for gate, r, form, scale in zip(layer.gate_decls, raw, layer.gate_forms, layer.gate_scales):
        steps = n if gate.name in layer.step_gates else 1
        r = r.reshape(B, T, steps, Hv)[:, :, 0] if steps == 1 else r.reshape(B, T, steps, Hv)
        if form == "mamba2":  # A_log one per value head
            gates[gate.name] = torch.exp(-layer.gate_A_log[gate.name].exp() * F.softplus(r))
        else:
            gates[gate.name] = gate.activate(r, scale)
    y, state = layer.rule(q, k, v, gates=gates, strategy="core:sequential")
    y = y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + p.output_norm_eps) * layer.out_norm.weight
    y = y.reshape(B, T, Hv * layer.d_value)
    if layer.output_gate == "silu":
        y = y * F.silu(x @ layer.out_gate.weight.T)
    elif layer.output_gate == "sigmoid":
        y = y * torch.sigmoid(x @ layer.out_gate.weight.T + layer.out_gate.bias)
    return y @ layer.o_proj.weight.T, state


@pytest.mark.parametrize("memory, heads, G, options", [
    ("titans:titans", 2, 2, {}),
    ("zoo:gated_deltanet", 2, 3, FLA_GDN),
    ("zoo:gated_deltanet", 1, 4, FLA_GDN),
    ("zoo:gated_delta_product", 2, 2, FLA_GDN),
], ids=["titans-H2-G2", "gdn-fla-H2-G3", "gdn-fla-H1-G4", "gdp-fla-H2-G2"])
def test_layer_is_the_rule_on_repeated_qk(memory, heads, G, options):
    layer = make_layer(memory, heads, heads * G, **options)
    x = _x()
    with torch.no_grad():
        y, state = layer(x)
        want, want_state = hand_layer(layer, x)
    torch.testing.assert_close(y, want, **TOL)
    assert state["rule.M"].shape == (2, heads * G, layer.d_value, D_KEY)
    for key, w in want_state.items():
        torch.testing.assert_close(state[f"rule.{key}"], w, **TOL)
    if "mamba2" in options.get("gate_form", {}).values():
        assert layer.gate_A_log["alpha"].shape == (heads * G,)


# -- the ungrouped layer with duplicated q/k weights ---------------------------------------------------
def duplicate_qk(grouped: torch.nn.Module, ungrouped: torch.nn.Module) -> None:
    """Load ``grouped``'s weights into ``ungrouped`` (the same model with ``heads = value_heads``):
    every memory layer's q/k projection and convolution rows (``[(n h d), ...]``), and MAC's
    retrieval query, copied G times per key head; every other tensor as it is."""
    sd = grouped.state_dict()
    for prefix, mod in grouped.named_modules():
        if isinstance(mod, MemoryLayer) and mod.groups > 1:
            G, H, n = mod.groups, mod.heads, mod.steps
            for name, steps in (("q_proj", 1), ("k_proj", n), ("q_conv", 1), ("k_conv", n)):
                key = f"{prefix}.{name}.weight".lstrip(".")
                if key in sd:
                    sd[key] = sd[key].unflatten(0, (steps, H, -1)).repeat_interleave(G, 1).flatten(0, 2)
            parent = prefix.rsplit(".", 1)[0] if "." in prefix else ""
            key = f"{parent}.retrieve_q.weight".lstrip(".")
            if key in sd:
                sd[key] = sd[key].unflatten(0, (H, -1)).repeat_interleave(G, 0).flatten(0, 1)
    ungrouped.load_state_dict(sd)


def _qk_grad_of_grouped(grads: dict, layer: MemoryLayer) -> dict:
    """The ungrouped model's q/k gradients summed over each group: the grouped model's."""
    out = dict(grads)
    G, H, n = layer.groups, layer.heads, layer.steps
    for name, steps in (("q_proj", 1), ("k_proj", n), ("q_conv", 1), ("k_conv", n)):
        key = f"{name}.weight"
        out[key] = grads[key].unflatten(0, (steps, H, G, -1)).sum(2).flatten(0, 2)
    return out


@pytest.mark.parametrize("memory, options", [
    ("titans:titans", {}),
    ("zoo:gated_delta_product", FLA_GDN),
    ("zoo:gated_deltanet", {"rotary": True, **FLA_GDN}),
    ("titans:titans", {"qk_feature_map": "hedgehog"}),
], ids=["titans", "gdp-fla", "gdn-rotary", "titans-hedgehog"])
def test_grouped_equals_ungrouped_with_duplicated_qk_rows(memory, options):
    H, G = 2, 2
    grouped = make_layer(memory, H, H * G, **options)
    plain = make_layer(memory, H * G, None, **options)
    duplicate_qk(grouped, plain)
    x = _x()
    y, st = grouped(x)
    y0, st0 = plain(x)
    torch.testing.assert_close(y, y0, **TOL)
    assert set(st) == set(st0)
    for key in st0:
        got = st[key]
        if key in ("conv.q", "conv.k"):  # the ungrouped caches hold each key head's channels G times
            steps = grouped.steps if key == "conv.k" else 1
            got = got.unflatten(-1, (steps, H, -1)).repeat_interleave(G, -2).flatten(-3)
        torch.testing.assert_close(got, st0[key], **TOL, msg=key)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(5), dtype=DT)
    (y * w).sum().backward()
    (y0 * w).sum().backward()
    got = {k: p.grad for k, p in grouped.named_parameters()}
    want = _qk_grad_of_grouped({k: p.grad for k, p in plain.named_parameters()}, grouped)
    assert set(got) == set(want)
    for key in got:
        torch.testing.assert_close(got[key], want[key], **TOL, msg=key)


# -- every strategy, split calls, packed documents ------------------------------------------------
STRATEGY_CASES = [
    ("titans:titans", 2, 2, {}),
    ({"use": "titans:titans", "anchor": 4}, 2, 2, {}),
    ("zoo:gated_deltanet", 2, 3, FLA_GDN),
    ("zoo:gated_delta_product", 1, 2, FLA_GDN),
]
STRATEGY_IDS = ["titans-H2-G2", "titans-anchor4-H2-G2", "gdn-fla-H2-G3", "gdp-fla-H1-G2"]


def _other_strategies(memory) -> list:
    rule = ac.build_rule(dict(memory) if isinstance(memory, dict) else {"use": memory})
    found = [s for s in accepting(rule, chunks=(1, 4, 5)) if s != "core:sequential"]
    assert found, f"no strategy besides core:sequential accepts {memory}"
    return found


def _run(layer, x, w):
    y, state = layer(x)
    (y * w).sum().backward()
    return y.detach(), {k: t.detach() for k, t in state.items()}, {
        k: p.grad.clone() for k, p in layer.named_parameters()}


@pytest.mark.parametrize("memory, heads, G, options", STRATEGY_CASES, ids=STRATEGY_IDS)
def test_every_strategy_equals_sequential(memory, heads, G, options):
    x = _x()
    w = torch.randn(2, 13, D_MODEL, generator=torch.Generator().manual_seed(2), dtype=DT)
    want = _run(make_layer(memory, heads, heads * G, **options), x, w)
    for strategy in _other_strategies(memory):
        got = _run(make_layer(memory, heads, heads * G, strategy=strategy, **options), x, w)
        torch.testing.assert_close(got[0], want[0], **TOL, msg=f"{strategy}: output")
        for part, name in ((1, "state"), (2, "gradient")):
            assert set(got[part]) == set(want[part])
            for key in want[part]:
                torch.testing.assert_close(got[part][key], want[part][key], rtol=1e-9, atol=1e-9,
                                           msg=f"{strategy}: {name} {key}")


@pytest.mark.parametrize("memory, heads, G, options", STRATEGY_CASES, ids=STRATEGY_IDS)
def test_split_calls_equal_one_call(memory, heads, G, options):
    x = _x()
    for strategy in ["core:sequential"] + _other_strategies(memory):
        layer = make_layer(memory, heads, heads * G, strategy=strategy, **options)
        with torch.no_grad():
            y, state = layer(x)
            ys, st = [], None
            for lo, hi in ((0, 4), (4, 5), (5, 13)):
                part, st = layer(x[:, lo:hi], st)
                ys.append(part)
        torch.testing.assert_close(torch.cat(ys, 1), y, **TOL, msg=str(strategy))
        for key in state:
            torch.testing.assert_close(st[key], state[key], **TOL, msg=f"{strategy}: {key}")


@pytest.mark.parametrize("memory, heads, G, options", STRATEGY_CASES, ids=STRATEGY_IDS)
def test_packed_documents_equal_each_alone(memory, heads, G, options):
    lengths = (5, 1, 7)
    x = _x(B=1, T=sum(lengths))
    cu = torch.tensor([0, 5, 6, 13])
    for strategy in ["core:sequential"] + _other_strategies(memory):
        layer = make_layer(memory, heads, heads * G, strategy=strategy, **options)
        with torch.no_grad():
            y, state = layer(x, cu_seqlens=cu)
            for i, (lo, hi) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
                alone, st = layer(x[:, lo:hi])
                torch.testing.assert_close(y[:, lo:hi], alone, **TOL, msg=f"{strategy}: doc {i}")
                for key in st:
                    torch.testing.assert_close(state[key][i : i + 1], st[key], **TOL,
                                               msg=f"{strategy}: doc {i} {key}")


# -- today's layer, the options, the errors ------------------------------------------------------------
@pytest.mark.parametrize("memory", ["titans:titans", "zoo:gated_delta_product"])
def test_value_heads_unset_or_equal_to_heads_is_todays_layer(memory):
    a, b = make_layer(memory, 2, None), make_layer(memory, 2, 2)
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb) and a.groups == b.groups == 1
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key
    x = _x()
    assert torch.equal(a(x)[0], b(x)[0])
    assert "value_heads" not in repr(a) and "value_heads=4" in repr(make_layer(memory, 2, 4))


def test_grouped_layer_keeps_the_parameter_names():
    grouped, plain = make_layer("titans:titans", 2, 6), make_layer("titans:titans", 2, None)
    assert list(grouped.state_dict()) == list(plain.state_dict())
    shapes = {k: tuple(p.shape) for k, p in grouped.named_parameters()}
    Dk = Dv = D_KEY
    assert shapes["q_proj.weight"] == shapes["k_proj.weight"] == (2 * Dk, D_MODEL)
    assert shapes["q_conv.weight"][0] == shapes["k_conv.weight"][0] == 2 * Dk
    assert shapes["v_proj.weight"] == shapes["out_gate.weight"] == (6 * Dv, D_MODEL)
    assert shapes["v_conv.weight"][0] == 6 * Dv and shapes["o_proj.weight"] == (D_MODEL, 6 * Dv)
    assert shapes["gate_proj.weight"] == (3 * 6, D_MODEL)  # alpha, eta, theta per value head
    assert grouped.rule.structure.heads == 6


SPEC = {"schema": "atlas/1", "name": "grouped",
        "model": {"arch": "core:lm", "vocab_size": 16, "d_model": 16, "depth": 2, "heads": 2},
        "memory": {"use": "zoo:gated_deltanet", "parallel": {"use": "core:exact_chunk", "chunk_size": 4}},
        "layer": {"value_heads": 4, "d_key": 4}}


@pytest.mark.parametrize("value_heads, hint", [(3, "use 2 or 4"), (6, "use 4 or 8"), (1, "use 2 or 4")],
                         ids=["vh3-h2", "vh6-h4", "vh1-h2"])
def test_value_heads_not_a_multiple_is_one_clear_error(value_heads, hint):
    heads = 4 if value_heads == 6 else 2
    spec = copy.deepcopy(SPEC)
    spec["model"]["heads"], spec["layer"]["value_heads"] = heads, value_heads
    with pytest.raises(SpecError) as exc:
        load_spec(spec)
    (issue,) = exc.value.issues
    assert issue.path == "layer.value_heads" and issue.value == value_heads
    assert f"positive multiple of the model's heads = {heads}" in issue.message and hint in issue.hint
    with pytest.raises(SpecError, match=rf"layer\.value_heads: .*multiple of the model's heads = {heads}"):
        MemoryLayer(16, heads, ac.build_rule({"use": "titans:titans"}), LayerParams(value_heads=value_heads))


def test_value_heads_zero_is_one_clear_error():
    spec = copy.deepcopy(SPEC)
    spec["layer"]["value_heads"] = 0
    with pytest.raises(SpecError) as exc:
        load_spec(spec)
    (issue,) = exc.value.issues
    assert issue.path == "layer.value_heads" and issue.value == 0 and "greater than or equal to 1" in issue.message


def test_spec_without_value_heads_resolves_and_sizes_as_before():
    spec = copy.deepcopy(SPEC)
    del spec["layer"]["value_heads"]
    assert load_spec(spec).layer["value_heads"] is None
    model = {"d_model": 64, "heads": 4, "depth": 1}
    before, _ = lm_estimate(model, {})
    grouped, _ = lm_estimate(model, {"value_heads": 8})
    # v, o per value head: 2 * 64 * (8 - 4) * 16 more
    assert grouped - before == 2 * 64 * 4 * 16


@pytest.mark.parametrize("arch", ["core:lm", "titans:mag", "titans:mal", "titans:mac"])
def test_models_equal_ungrouped_models_with_duplicated_qk_rows(arch):
    """A whole model: the grouped memory layers (and MAC's retrieval query, which reads the
    grouped memory) against the ungrouped model with duplicated q/k rows."""
    def build(heads, value_heads):
        spec = copy.deepcopy(SPEC)
        spec["model"].update(arch=arch, heads=heads)
        if arch != "core:lm":
            spec["model"].update(attn_heads=2, **({"segment_size": 4} if arch == "titans:mac" else {}))
        spec["memory"] = {"use": "titans:titans", "parallel": {"use": "core:exact_chunk", "chunk_size": 4}}
        spec["layer"]["value_heads"] = value_heads
        torch.manual_seed(0)
        return ac.build_model(load_spec(spec)).to(DT)

    grouped, plain = build(2, 4), build(4, None)
    duplicate_qk(grouped, plain)
    ids = torch.randint(0, 16, (2, 11), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(grouped(ids), plain(ids), **TOL)
    with torch.no_grad():  # decoding: a 3-token prompt, then a token a step
        outs, state = [], None
        for lo, hi in [(0, 3)] + [(t, t + 1) for t in range(3, 11)]:
            logits, state = grouped.step(ids[:, lo:hi], state)
            outs.append(logits)
    torch.testing.assert_close(torch.cat(outs, 1), plain(ids), rtol=1e-9, atol=1e-9)


# -- context parallelism ---------------------------------------------------------------------------
CP_T = 12


def _cp_model():
    from atlas_core.model import build_model

    spec = copy.deepcopy(SPEC)
    spec["memory"] = {"use": "titans:titans"}
    torch.manual_seed(0)
    model = build_model(load_spec(spec)).double()
    ids = torch.randint(0, 16, (2, CP_T), generator=torch.Generator().manual_seed(3))
    w = torch.randn(2, CP_T, 16, generator=torch.Generator().manual_seed(4), dtype=DT)
    return model, ids, w


def _cp_worker(_payload, info) -> dict:
    """Rank ``info.rank``'s time slice through `atlas_core.distributed.lm.enable`; the logits
    and parameter gradients of the whole sequence gathered (module level: spawned)."""
    import torch.distributed as dist

    from atlas_core.distributed.lm import enable, time_slice

    model, ids, w = _cp_model()
    assert enable(model) == 2
    logits = model(time_slice(ids, info.rank, info.world))
    (logits * time_slice(w, info.rank, info.world)).sum().backward()
    every = [None] * info.world
    dist.all_gather_object(every, logits.detach())
    out = {"logits": torch.cat(every, dim=1).numpy()}
    for n, p in model.named_parameters():
        g = p.grad.clone()
        dist.all_reduce(g)
        out[n] = g.numpy()
    return out


def test_context_parallel_grouped_lm_equals_one_process():
    from atlas_core.train.data_parallel import spawn

    model, ids, w = _cp_model()
    assert {m.groups for m in model.modules() if isinstance(m, MemoryLayer)} == {2}
    logits = model(ids)
    (logits * w).sum().backward()
    got = spawn(_cp_worker, None, 2, "cpu")
    torch.testing.assert_close(torch.from_numpy(got["logits"]), logits.detach(), rtol=1e-9, atol=1e-9)
    for n, p in model.named_parameters():
        torch.testing.assert_close(torch.from_numpy(got[n]), p.grad, rtol=1e-9, atol=1e-9, msg=n)


def test_head_layout_is_consecutive():
    """Key head i serves value heads i G .. i G + G - 1 (transformers' ``repeat_interleave``,
    fla's ``(h g)``): zeroing key head 0's q/k rows changes only value heads 0 .. G - 1."""
    layer = make_layer("titans:titans", 2, 6, conv_size=0, output_norm=False, output_gate="none")
    x = _x()
    with torch.no_grad():
        _, st = layer(x)
        layer.k_proj.weight[:D_KEY] *= -0.5  # key head 0 only
        _, st2 = layer(x)
    changed = (st2["rule.M"] - st["rule.M"]).abs().flatten(2).amax(-1).amax(0)  # per value head
    assert (changed[:3] > 1e-6).all() and (changed[3:] == 0).all(), changed
