"""Packed documents through whole models: ``model(ids, cu_seqlens=cu)`` equals one forward per
document (float64), for the LMM / core:lm (its packed path: the memory layer's convolution and
rule restart at each boundary) under several rules and strategies, for MAG, MAL and MAC (sliding-
window and segment attention see only their own document) and for the MRU LM; gradients of the
core:lm path equal those of separate forwards; bad cu_seqlens are refused with the value named."""

from __future__ import annotations

import copy

import pytest
import torch

import atlas_core as ac

V = 32
LENGTHS = (1, 6, 9, 6, 2)  # a one-token document, equal lengths, across windows and segments
ARCH_PARAMS = {
    "titans:lmm": {},
    "titans:mag": {"window": 3, "persistent_tokens": 2},
    "titans:mal": {"window": 3, "persistent_tokens": 2},
    "titans:mac": {"segment_size": 4, "persistent_tokens": 2, "window": 3},
}
MEMORIES = {
    "linear-chunk4": {"use": "titans:titans", "anchor": 4,
                      "parallel": {"use": "core:chunkwise", "chunk_size": 4}},
    "linear-exact4": {"use": "titans:titans", "parallel": {"use": "core:exact_chunk", "chunk_size": 4}},
    "omega-seq": {"use": "omega:omeganet", "parallel": "core:sequential"},
}


def _spec(arch, memory, **model):
    return {
        "name": "tiny",
        "model": {"arch": arch, "vocab_size": V, "d_model": 16, "depth": 2, "heads": 2,
                  "mlp_ratio": 2.0, **ARCH_PARAMS.get(arch, {}), **model},
        "memory": copy.deepcopy(MEMORIES[memory]),
        "layer": {"conv_size": 3},
    }


def _cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.long)


def _ids(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (1, sum(LENGTHS)), generator=g)


def _separate(model, ids, cu):
    b = cu.tolist()
    return torch.cat([model(ids[:, a:c]) for a, c in zip(b, b[1:])], dim=1)


CASES = [pytest.param(a, m, id=f"{a.split(':')[1]}-{m}") for a in ARCH_PARAMS for m in MEMORIES]


@pytest.mark.parametrize("arch,memory", CASES)
def test_packed_forward_equals_one_forward_per_document(arch, memory):
    torch.manual_seed(0)
    model = ac.build_model(_spec(arch, memory)).double().eval()
    ids, cu = _ids(), _cu(LENGTHS)
    packed = model(ids, cu_seqlens=cu)
    assert packed.shape == (1, sum(LENGTHS), V)
    torch.testing.assert_close(packed, _separate(model, ids, cu), rtol=1e-9, atol=1e-9)
    # the boundaries matter: the same tokens as one document give other logits after the first
    assert not torch.allclose(packed[:, 1:], model(ids)[:, 1:])


@pytest.mark.parametrize("arch", list(ARCH_PARAMS))
def test_attention_only_blocks_respect_boundaries(arch):
    """A hybrid whose first block carries no memory (an attention block): still per document."""
    torch.manual_seed(1)
    model = ac.build_model(_spec(arch, "linear-exact4", memory_layers=[2])).double().eval()
    ids, cu = _ids(1), _cu(LENGTHS)
    torch.testing.assert_close(model(ids, cu_seqlens=cu), _separate(model, ids, cu), rtol=1e-9, atol=1e-9)


def test_packed_lm_gradients_equal_separate_forwards():
    torch.manual_seed(2)
    model = ac.build_model(_spec("titans:lmm", "linear-exact4")).double()
    ids, cu = _ids(2), _cu(LENGTHS)
    w = torch.randn(1, sum(LENGTHS), V, dtype=torch.float64)
    params = [p for p in model.parameters() if p.requires_grad]
    ga = torch.autograd.grad((model(ids, cu_seqlens=cu) * w).sum(), params, allow_unused=True)
    gb = torch.autograd.grad((_separate(model, ids, cu) * w).sum(), params, allow_unused=True)
    for a, b in zip(ga, gb):
        if a is None or b is None:
            assert a is None and b is None
            continue
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_mru_lm_packed_equals_separate():
    torch.manual_seed(3)
    spec = {"name": "mru", "model": {"arch": "mru:mru_lm", "vocab_size": V, "d_model": 8, "depth": 2,
                                     "heads": 2, "init_scale": 0.5},
            "memory": {"use": "mru:mru", "parallel": "mru:brent_kung"}}
    model = ac.build_model(spec).double().eval()
    ids, cu = _ids(3), _cu(LENGTHS)
    torch.testing.assert_close(model(ids, cu_seqlens=cu), _separate(model, ids, cu), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("arch", ["titans:lmm", "titans:mag"])
def test_bad_cu_seqlens_is_named(arch):
    model = ac.build_model(_spec(arch, "linear-exact4")).double().eval()
    ids = _ids()
    with pytest.raises(ValueError, match="must end at the number of tokens T = 24"):
        model(ids, cu_seqlens=torch.tensor([0, 5, 20]))
    with pytest.raises(ValueError, match="batch size 1"):
        model(ids.expand(2, -1), cu_seqlens=_cu(LENGTHS))


@pytest.mark.parametrize("arch", ["titans:lmm", "titans:mag", "titans:mal"])
def test_lmm_mag_mal_run_packed_documents_in_one_pass(arch):
    """Every block of these models takes cu_seqlens itself: the class declares it, and a packed
    row runs without the per-document fallback; MAC declares the fallback."""
    import atlas_core.varlen as varlen

    model = ac.build_model(_spec(arch, "linear-exact4", memory_layers=[2])).double()
    assert type(model).packs_in_one_pass
    ids = torch.randint(0, V, (1, 12))

    def fallback(*a, **k):
        raise AssertionError("ran each document alone")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(varlen, "per_document", fallback)
        model(ids, cu_seqlens=_cu((5, 7)))
    mac = ac.build_model(_spec("titans:mac", "linear-exact4"))
    assert not type(mac).packs_in_one_pass


@pytest.mark.parametrize("per_document_prefix", [False, True])
def test_packed_window_attention_across_query_blocks(per_document_prefix):
    """Queries run in blocks of 128: a row of 300 tokens crosses several, documents too."""
    from atlas_plugins.titans.attention import SlidingWindowAttention

    torch.manual_seed(4)
    attn = SlidingWindowAttention(8, 2, 5, 10000.0).double()
    lengths = (130, 1, 40, 129)
    cu = _cu(lengths).tolist()
    x = torch.randn(1, sum(lengths), 8, dtype=torch.float64)
    prefix = torch.randn(len(lengths), 3, 8, dtype=torch.float64) if per_document_prefix else \
        torch.randn(3, 8, dtype=torch.float64)
    y = attn.packed(x, cu, prefix)
    ref = torch.cat([attn(x[:, a:b], None, prefix=prefix[i] if per_document_prefix else prefix)[0]
                     for i, (a, b) in enumerate(zip(cu, cu[1:]))], dim=1)
    torch.testing.assert_close(y, ref, rtol=1e-9, atol=1e-9)
