"""`atlas_core.model.sample_next`, which every architecture's generate() uses: greedy, temperature,
top-k and top-p do what they say (checked on the distribution handed to the sampler and on draws),
and bad arguments are ValueErrors naming the value."""

from __future__ import annotations

import pytest
import torch

from atlas_core import model as model_mod
from atlas_core.model import sample_next

LOGITS = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5]], dtype=torch.float64))


def probs_seen(monkeypatch, **kw):
    """The distribution sample_next hands to torch.multinomial."""
    seen = []
    real = torch.multinomial

    def spy(p, n, generator=None):
        seen.append(p.detach().clone())
        return real(p, n, generator=generator)

    monkeypatch.setattr(model_mod.torch, "multinomial", spy)
    sample_next(LOGITS, generator=torch.Generator().manual_seed(0), **kw)
    return seen[0].double()


def test_greedy_and_temperature_zero_take_the_argmax():
    assert sample_next(LOGITS, greedy=True).tolist() == [0, 3]
    assert sample_next(LOGITS, temperature=0).tolist() == [0, 3]


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_scales_the_logits(monkeypatch, temperature):
    p = probs_seen(monkeypatch, temperature=temperature)
    torch.testing.assert_close(p, (LOGITS / temperature).softmax(-1), rtol=0, atol=1e-6)


def test_top_k_keeps_the_k_largest(monkeypatch):
    p = probs_seen(monkeypatch, top_k=2)
    want = torch.tensor([[0.5, 0.3, 0, 0], [0, 0, 0.3, 0.5]], dtype=torch.float64) / 0.8
    torch.testing.assert_close(p, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("top_p,kept", [(0.45, 1), (0.7, 2), (0.79, 2), (0.81, 3), (1.0, 4)])
def test_top_p_keeps_the_smallest_prefix_reaching_p(monkeypatch, top_p, kept):
    """Sorted probabilities 0.5, 0.3, 0.15, 0.05: the prefix whose mass first reaches top_p."""
    p = probs_seen(monkeypatch, top_p=top_p)
    assert (p[0] > 0).sum().item() == kept and (p[1] > 0).sum().item() == kept
    assert p[0, :kept].gt(0).all() and p[1, 4 - kept :].gt(0).all()  # the most likely ones
    torch.testing.assert_close(p.sum(-1), torch.ones(2, dtype=torch.float64), rtol=0, atol=1e-6)


def test_draws_respect_top_k():
    g = torch.Generator().manual_seed(1)
    draws = torch.stack([sample_next(LOGITS, top_k=2, generator=g) for _ in range(200)])
    assert set(draws[:, 0].tolist()) == {0, 1} and set(draws[:, 1].tolist()) == {2, 3}


@pytest.mark.parametrize("kw,match", [
    ({"temperature": -1.0}, r"temperature=-1.0 must be >= 0"),
    ({"top_k": 0}, r"top_k=0 must be >= 1"),
    ({"top_p": 0.0}, r"top_p=0.0 must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p=1.5 must be in \(0, 1\]"),
])
def test_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        sample_next(LOGITS, **kw)
