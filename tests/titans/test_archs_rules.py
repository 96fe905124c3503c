"""Titans architectures with memory rules from other plugins and from a third-party plugin (issue 6:
"any memory rule plugs into each architecture"), and decoding cost that stays flat as the sequence
grows: the KV cache never exceeds the window, and the work per generated token (every element any
operator produces) repeats with the chunk/segment period instead of growing."""

from __future__ import annotations

import copy
import types

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import atlas_core as ac
from atlas_core.host import PluginHost, hookimpl
from atlas_core.knobs.bias import Bias

V, T, WINDOW = 32, 13, 3
ARCH_PARAMS = {
    "titans:lmm": {},
    "titans:mag": {"window": WINDOW, "persistent_tokens": 2},
    "titans:mal": {"window": WINDOW, "persistent_tokens": 2},
    "titans:mac": {"segment_size": 4, "persistent_tokens": 2, "window": WINDOW},
}
RULES = {
    # anchored rules under chunked strategies (the chunk size divides the anchor), and a
    # per-token Omega rule under its exact chunked form: every one decodes exactly
    "omeganet": {"use": "omega:omeganet", "bias": {"use": "omega:window", "window": 3}, "anchor": 4,
                 "parallel": {"use": "core:chunkwise", "chunk_size": 4}},
    "omeganet-exact": {"use": "omega:omeganet", "bias": {"use": "omega:window", "window": 3},
                       "parallel": {"use": "core:exact_chunk", "chunk_size": 4}},
    "atlas-linear": {"use": "atlas_muon:atlas_linear",
                     "parallel": {"use": "atlas_muon:atlas_parallel", "chunk_size": 4}},
    "acme-huber": {"use": "acme:huber_titans", "anchor": 8,
                   "parallel": {"use": "core:chunkwise", "chunk_size": 4}},
}


# -- a third-party plugin, in its own namespace, never installed in the process-wide host --------
class HuberBias(Bias):
    """Yaad-style bias: the l2 error clipped to [-delta, delta]."""

    def error(self, pred, v):
        return (pred - v).clamp(-0.5, 0.5)

    def loss(self, pred, v):
        e = (pred - v).abs()
        return torch.where(e <= 0.5, 0.5 * e * e, 0.5 * (e - 0.25)).sum(-1)


@hookimpl
def atlas_register(registry):
    registry.add("bias", "huber", lambda params, ctx: HuberBias(), summary="clipped l2")
    registry.add_preset("huber_titans", knobs={"structure": "core:linear", "bias": "acme:huber",
                                               "retention": "core:decay", "algorithm": "core:momentum"})


@pytest.fixture(scope="module")
def acme_registry():
    host = PluginHost(strict=True).load_entry_points()
    host.add_plugin_module("acme", types.SimpleNamespace(atlas_register=atlas_register, __name__="acme_plugin"))
    return host.registry


def build(arch, rule, registry, seed=0):
    spec = {"name": "tiny",
            "model": {"arch": arch, "vocab_size": V, "d_model": 16, "depth": 2, "heads": 2,
                      "mlp_ratio": 2.0, **ARCH_PARAMS[arch]},
            "memory": copy.deepcopy(RULES[rule]), "layer": {"conv_size": 3}}
    torch.manual_seed(seed)
    return ac.build_model(spec, registry=registry).double().eval()


def ids_for(n, B=2, seed=1):
    return torch.randint(0, V, (B, n), generator=torch.Generator().manual_seed(seed))


CASES = [pytest.param(a, r, id=f"{a.split(':')[1]}-{r}") for a in ARCH_PARAMS for r in RULES]


@pytest.mark.parametrize("arch,rule", CASES)
def test_rule_from_another_plugin_is_causal_and_decodes_exactly(arch, rule, acme_registry):
    model = build(arch, rule, acme_registry)
    ids = ids_for(T)
    other = ids.clone()
    other[:, 7:] = (other[:, 7:] + 5) % V
    with torch.no_grad():
        full = model(ids)
        assert torch.equal(model(other)[:, :7], full[:, :7])
        assert (model(other)[:, 7:] - full[:, 7:]).abs().max() > 1e-6
        outs, state = [], None
        for i, n in enumerate([2] + [1] * (T - 2)):
            start = 0 if i == 0 else 1 + i
            logits, state = model.step(ids[:, start : start + n], state)
            outs.append(logits)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=0, atol=1e-8)


def test_the_third_party_rule_is_really_used(acme_registry):
    model = build("titans:mag", "acme-huber", acme_registry)
    rule = model.blocks[0].memory.rule
    assert isinstance(rule.bias, HuberBias) and rule.spec["use"] == "acme:huber_titans"
    assert rule.anchor == 8 and model.blocks[0].memory.runner.name == "core:chunkwise"
    with pytest.raises(ac.SpecError, match="acme"):  # the process-wide host does not have it
        build("titans:mag", "acme-huber", None)


@pytest.mark.parametrize("arch", list(ARCH_PARAMS))
def test_a_per_token_rule_is_refused_by_chunks(arch, acme_registry):
    """Chunks of 4 would anchor the per-token Huber rule's gradients (another function): the build
    refuses at memory.parallel with a reason naming the anchor; anchor = 4 is accepted."""
    spec = {"name": "tiny",
            "model": {"arch": arch, "vocab_size": V, "d_model": 16, "depth": 1, "heads": 2,
                      "mlp_ratio": 2.0, **ARCH_PARAMS[arch]},
            "memory": {"use": "acme:huber_titans", "parallel": {"use": "core:chunkwise", "chunk_size": 4}}}
    with pytest.raises(ac.SpecError) as err:
        ac.build_model(copy.deepcopy(spec), registry=acme_registry)
    assert any(i.path == "memory.parallel" for i in err.value.issues), str(err.value)
    assert "anchor" in str(err.value) and "chunk_size=4" in str(err.value)
    spec["memory"]["anchor"] = 4
    assert ac.build_model(spec, registry=acme_registry).blocks[0].memory.rule.anchor == 4


# -- flat decoding cost -----------------------------------------------------------------------------
class Work(TorchDispatchMode):
    """Counts the elements every operator produces: a deterministic stand-in for time."""

    def __init__(self):
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.elements += t.numel()
        return out


def kv_caches(state):
    """Every attention cache in a model state (dicts holding the window's keys "k")."""
    if isinstance(state, dict):
        if "k" in state and "pk" in state:
            yield state
        for v in state.values():
            yield from kv_caches(v)
    elif isinstance(state, (list, tuple)):
        for v in state:
            yield from kv_caches(v)


@pytest.mark.parametrize("arch", list(ARCH_PARAMS))
def test_work_per_token_and_kv_cache_stay_flat(arch):
    """64 tokens one at a time: the work of step t equals that of step t + 16 once the window is
    full (4 divides 16: the same phase of every chunk and segment); no cache exceeds the window."""
    model = build(arch, "omeganet", None)
    ids = ids_for(64, B=1)
    work, state = [], None
    with torch.no_grad():
        for t in range(64):
            with Work() as w:
                _, state = model.step(ids[:, t : t + 1], state)
            work.append(w.elements)
            for cache in kv_caches(state):
                assert cache["k"].shape[2] <= WINDOW - 1 and cache["v"].shape[2] <= WINDOW - 1
    assert work[16:32] == work[32:48] == work[48:64], (work[16:32], work[48:64])
    assert max(work) == max(work[:16])  # nothing costs more later than early on
    if arch in ("titans:mag", "titans:mal"):
        assert len(list(kv_caches(state))) == 2  # one sliding-window KV cache per block
    if arch == "titans:mac":  # MAC buffers the current segment's keys and outputs only
        for block in state["blocks"]:
            assert block["buf"]["sk"].shape[2] < 4 and block["buf"]["y"].shape[1] < 4
