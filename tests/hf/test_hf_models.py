"""Hugging Face transformers: every architecture exports, loads with AutoModelForCausalLM, gives
the native logits, generates the native greedy tokens, and round-trips through save_pretrained."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the Hugging Face integration needs transformers "
                    "(pip install 'atlas-ttm[hf]')")

import torch  # noqa: E402

import atlas_core  # noqa: E402,F401  (registers the classes with the auto classes)
from atlas_core.train.inference import generate_from_checkpoint  # noqa: E402

from .specs import SPECS, VOCAB, make_checkpoint  # noqa: E402

PROMPT = [3, 17, 5, 9, 28]
NEW = 32


@pytest.fixture(scope="module", params=list(SPECS))
def exported(request, tmp_path_factory):
    """(checkpoint dir, exported dir, native model, HF model loaded by AutoModelForCausalLM)."""
    from transformers import AutoModelForCausalLM

    from atlas_core.hf import AtlasForCausalLM, export_checkpoint
    from atlas_core.train.inference import open_checkpoint

    root = tmp_path_factory.mktemp(request.param)
    ckpt = make_checkpoint(root, SPECS[request.param])
    out = root / "hf"
    summary = export_checkpoint(ckpt, out)
    assert {"config.json", "model.safetensors"} <= set(summary["files"])
    _, native, _ = open_checkpoint(str(ckpt), "cpu")
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf) is AtlasForCausalLM
    return ckpt, out, native, hf


def test_weights_and_config_carry_the_spec(exported):
    ckpt, out, native, hf = exported
    from atlas_core.train.checkpoint import load_checkpoint

    spec = load_checkpoint(ckpt).spec
    assert hf.config.spec() == spec and hf.config.atlas_spec_hash == spec.spec_hash
    assert hf.config.vocab_size == VOCAB
    own = hf.model.state_dict()
    for name, tensor in native.state_dict().items():
        assert torch.equal(own[name], tensor), name
    tied = spec.model["tie_embeddings"]
    assert hf.config.tie_word_embeddings is tied
    # the sharing survives loading (and an untied head stays its own weight)
    assert (hf.model.head.weight is hf.model.embed.weight) is tied


def test_logits_equal_native(exported):
    _, _, native, hf = exported
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = native(ids)
        got = hf(ids).logits
        cached = hf(ids, use_cache=True).logits  # the state-carrying path: the same logits
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(cached, want, rtol=0, atol=1e-5)


def test_greedy_generate_equals_atlas_generate(exported):
    ckpt, _, _, hf = exported
    native = generate_from_checkpoint(str(ckpt), prompt_ids=PROMPT, max_new_tokens=NEW,
                                      greedy=True, device="cpu")["ids"]
    out = hf.generate(torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False)
    assert out.shape == (1, len(PROMPT) + NEW)
    assert out[0, : len(PROMPT)].tolist() == PROMPT
    assert out[0, len(PROMPT):].tolist() == native
    assert len(set(native)) > 1  # a sequence that could have gone wrong


@pytest.fixture
def transformers_log():
    """Every record transformers logs during the test (its root logger does not propagate to
    pytest's caplog), with its once-only warnings re-armed."""
    import logging

    from transformers.utils import logging as hf_logging

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    hf_logging.warning_once.cache_clear()
    root = hf_logging.get_logger()
    handler = Keep(level=logging.DEBUG)
    root.addHandler(handler)
    try:
        yield records
    finally:
        root.removeHandler(handler)


def test_generate_feeds_one_token_per_step_with_the_state_as_cache(exported, recwarn, transformers_log):
    from atlas_core.hf import AtlasMemoryCache
    from atlas_core.hf.modeling import CACHE_NAME

    _, _, _, hf = exported
    lengths = []
    step = hf.model.step

    def counting(ids, state=None):
        lengths.append((ids.shape[1], state is None))
        return step(ids, state)

    hf.model.step = counting
    try:
        res = hf.generate(torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False,
                          return_dict_in_generate=True)
    finally:
        del hf.model.step
    # the prompt once, from no state; then one token per call, continuing the state
    assert lengths == [(len(PROMPT), True)] + [(1, False)] * (NEW - 1)
    cache = getattr(res, CACHE_NAME)
    assert isinstance(cache, AtlasMemoryCache)
    assert cache.get_seq_length() == len(PROMPT) + NEW - 1
    names = [n for n, _ in cache.tensors()]
    assert names and cache.nbytes() > 0
    # no deprecation of the cache's name (a warning or transformers' own logged warning)
    said = [str(w.message) for w in recwarn] + [r.getMessage() for r in transformers_log]
    assert not [m for m in said if "deprecat" in m.lower()], said


def test_batched_greedy_generate_equals_native_rows(exported):
    _, _, native, hf = exported
    prompts = torch.tensor([PROMPT, [1, 2, 3, 4, 5]])
    out = hf.generate(prompts, max_new_tokens=8, do_sample=False)
    assert torch.equal(out, native.generate(prompts, 8, greedy=True))


def test_save_pretrained_round_trips_bitwise(exported, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    _, _, _, hf = exported
    hf.save_pretrained(tmp_path / "again")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "again").eval()
    a, b = hf.state_dict(), back.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    config = AutoConfig.from_pretrained(tmp_path / "again")
    for field in ("atlas_spec", "atlas_spec_hash", "text_codec", "vocab_size", "tie_word_embeddings"):
        assert getattr(config, field) == getattr(hf.config, field), field
    ids = torch.tensor([PROMPT])
    assert torch.equal(back.generate(ids, max_new_tokens=8, do_sample=False),
                       hf.generate(ids, max_new_tokens=8, do_sample=False))


def test_labels_give_the_native_loss_and_gradients(exported):
    _, _, native, hf = exported
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(2))
    hf.zero_grad(set_to_none=True)
    native.zero_grad(set_to_none=True)
    loss = hf(ids, labels=ids).loss
    want = native.loss(ids[:, :-1], ids[:, 1:])
    torch.testing.assert_close(loss, want, rtol=0, atol=1e-6)
    loss.backward()
    want.backward()
    grads = {n: p.grad for n, p in native.named_parameters()}
    for name, p in hf.model.named_parameters():
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, grads[name], rtol=1e-5, atol=1e-6)
    hf.zero_grad(set_to_none=True)
    native.zero_grad(set_to_none=True)


def test_generate_without_cache_gives_the_same_tokens(exported):
    """use_cache=False runs the whole sequence again at every step (the slow reference)."""
    _, _, _, hf = exported
    prompt = torch.tensor([PROMPT])
    assert torch.equal(hf.generate(prompt, max_new_tokens=10, do_sample=False, use_cache=False),
                       hf.generate(prompt, max_new_tokens=10, do_sample=False))


def test_cache_size_is_bounded(exported):
    """The cache does not grow with the sequence: 16 more tokens (two MAC segments, past every
    window) leave its size unchanged; the attention keys are the last window - 1 tokens."""
    from atlas_core.hf import AtlasMemoryCache

    _, _, _, hf = exported
    ids = torch.randint(0, VOCAB, (1, 37), generator=torch.Generator().manual_seed(3))
    cache = AtlasMemoryCache()
    with torch.no_grad():
        hf(ids[:, :21], past_key_values=cache, use_cache=True)
        before = {n: tuple(t.shape) for n, t in cache.tensors()}
        for i in range(21, 37):  # one token at a time, as generate feeds them
            hf(ids[:, i:i + 1], past_key_values=cache)
    assert {n: tuple(t.shape) for n, t in cache.tensors()} == before
    assert cache.get_seq_length() == 37
    window = hf.config.atlas_spec["model"].get("window")
    keys = [shape for name, shape in before.items()  # attention keys, not the convolutions' tails
            if name.endswith(".k") and not name.endswith(".conv.k")]
    if hf.config.atlas_spec["model"]["arch"] in ("titans:mag", "titans:mal", "titans:mac"):
        assert keys and all(shape[2] == window - 1 for shape in keys)


def test_sampling_runs_through_the_cache(exported):
    _, _, _, hf = exported
    prompt = torch.tensor([PROMPT])
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        runs.append(hf.generate(prompt, max_new_tokens=12, do_sample=True, temperature=1.5, top_k=0))
    assert torch.equal(runs[0], runs[1]) and runs[0].shape == (1, len(PROMPT) + 12)
    greedy = hf.generate(prompt, max_new_tokens=12, do_sample=False)
    assert not torch.equal(runs[0], greedy)  # it sampled (a hot temperature over 32 ids)
