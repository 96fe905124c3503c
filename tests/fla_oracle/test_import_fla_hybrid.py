"""``atlas import`` of fla's hybrid configs (``attn``: softmax attention in place of the memory
layer of the listed layers) and of grouped value heads (``num_v_heads``): each model, small,
perturbed off its init, saved with ``save_pretrained`` and imported through the CLI, gives fla's
logits (run on the CPU oracle, tests/fla_oracle/oracle.py: fla's ``Attention`` through
``softmax_attention``, GVA through ``recurrence``) within 1e-4 relative in float32, also split into
calls that carry the state and under a chunked strategy; ``atlas generate --greedy`` continues a
prompt as fla's model does; a hybrid with grouped value heads runs ``atlas eval`` and
``atlas export-hf`` (fla's logits and greedy tokens through transformers). Attention layers with
different settings are refused by name."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fla.models", reason="flash-linear-attention is in the test extra")

import torch  # noqa: E402

import atlas_core as ac  # noqa: E402
from atlas_core.errors import SpecError  # noqa: E402
from atlas_core.fla_import import import_fla  # noqa: E402

from .test_import_fla import VOCAB, fla_logits, fla_model, invoke  # noqa: E402

#: id -> (family, config options off the family's test defaults (test_import_fla.FAMILIES),
#: the [model] layers the import must give, the [layer] value_heads it must give)
CASES = {
    # grouped query heads (4 query heads over 2 key/value heads, head size 8) and q/k/v biases,
    # between two memory layers
    "gdn-attn-gqa-bias": ("gated_deltanet", {"num_hidden_layers": 3, "attn": {
        "layers": [1], "num_heads": 4, "num_kv_heads": 2, "qkv_bias": True}},
        ["memory", "attention", "memory"], None),
    # a sliding window of 4 tokens (the sequences are 23 long) and another rotary base
    "gdn-attn-window": ("gated_deltanet", {"num_hidden_layers": 3, "attn": {
        "layers": [0, 2], "num_heads": 2, "window_size": 4, "rope_theta": 500.0}},
        ["attention", "memory", "attention"], None),
    # a list of specs, equal but for their layers: one [model.attention]
    "gdn-attn-list": ("gated_deltanet", {"num_hidden_layers": 3, "attn": [
        {"layers": [2], "num_heads": 4, "num_kv_heads": 1, "window_size": 6},
        {"layers": [0], "num_heads": 4, "num_kv_heads": 1, "window_size": 6}]},
        ["attention", "memory", "attention"], None),
    "delta_net-attn": ("delta_net", {"attn": {"layers": [1], "num_heads": 2, "num_kv_heads": 1}},
                       ["memory", "attention"], None),
    "kda-attn": ("kda", {"attn": {"layers": [0], "num_heads": 2, "qkv_bias": True}},
                 ["attention", "memory"], None),
    # grouped value heads: value head i reads q/k head i // 2 (fla's kernels, and [layer] value_heads)
    "gdn-gva": ("gated_deltanet", {"num_v_heads": 4}, None, 4),
    # fla 0.6.0's GatedDeltaProduct model does not pass num_v_heads to its layers (its config class
    # has no such option, config.json keeps it as an extra): ungrouped there, ungrouped here
    "gdp-num_v_heads-unread": ("gated_deltaproduct", {"num_v_heads": 4}, None, None),
    "kda-gva": ("kda", {"num_v_heads": 6}, None, 6),
    "gdn-gva-attn": ("gated_deltanet", {"num_v_heads": 4, "attn": {"layers": [1], "num_heads": 2}},
                     ["memory", "attention"], 4),
}


@pytest.fixture(scope="module", params=list(CASES))
def imported(request, tmp_path_factory):
    family, over, layers, value_heads = CASES[request.param]
    model = fla_model(family, seed=7, **over)
    src, out = tmp_path_factory.mktemp(f"fla-{request.param}"), tmp_path_factory.mktemp(request.param) / "run"
    model.save_pretrained(src)
    result = invoke("--format", "json", "import", src, out)
    assert result.exit_code == 0, result.output
    return request.param, model, out, json.loads(result.output)


def test_logits_equal_fla(imported):
    case, model, out, summary = imported
    family, over, layers, value_heads = CASES[case]
    atlas = ac.load(out)
    spec = atlas.spec.to_dict()
    assert summary["family"] == family
    assert spec["model"].get("layers") == layers  # the attention layers where fla's attn puts them
    assert spec["layer"].get("value_heads") == value_heads
    attn = over.get("attn")
    if attn is not None:
        a = attn if isinstance(attn, dict) else attn[0]
        table = spec["model"]["attention"]
        assert (table["heads"], table["kv_heads"], table["head_dim"]) == (
            a["num_heads"], a.get("num_kv_heads", a["num_heads"]), 32 // a["num_heads"])
        assert table["window"] == a.get("window_size") and table["bias"] == a.get("qkv_bias", False)
        assert table["rotary_base"] == a.get("rope_theta", 10000.0)
    ids = torch.randint(0, VOCAB, (2, 23), generator=torch.Generator().manual_seed(1))
    want = fla_logits(model, ids)
    with torch.no_grad():
        got = atlas(ids)
    assert want.abs().max() > 0.1  # not a degenerate model
    assert ((got - want).norm() / want.norm()).item() < 1e-4
    tol = {"rtol": 1e-4, "atol": 1e-4 * want.abs().max().item()}
    torch.testing.assert_close(got, want, **tol)
    # split into calls that carry the state (the attention's key/value cache, its window included),
    # and under a chunked strategy: the same function
    with torch.no_grad():
        first, state = atlas.step(ids[:, :10])
        mid, state = atlas.step(ids[:, 10:11], state)
        rest, _ = atlas.step(ids[:, 11:], state)
    torch.testing.assert_close(torch.cat([first, mid, rest], 1), want, **tol)
    spec["memory"]["parallel"] = {"use": "core:exact_chunk", "chunk_size": 8}
    chunked = ac.build_model(spec)
    chunked.load_state_dict(atlas.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(chunked(ids), want, **tol)


def test_generate_continues_as_fla(imported):
    case, model, out, _ = imported
    prompt = [3, 17, 5, 9, 30, 2]
    result = invoke("--format", "json", "generate", out, "--prompt-ids", " ".join(map(str, prompt)),
                    "--greedy", "--max-new-tokens", "6", "--device", "cpu")
    assert result.exit_code == 0, result.output
    got = json.loads(result.output)["ids"]
    ids = torch.tensor([prompt])
    for _ in range(6):  # fla's greedy continuation, recomputing the whole sequence each token
        ids = torch.cat([ids, fla_logits(model, ids)[:, -1:].argmax(-1)], 1)
    assert got[-6:] == ids[0, -6:].tolist()


@pytest.mark.parametrize("second", [{"num_kv_heads": 2}, {"window_size": 8}, {"rope_theta": 500.0}],
                         ids=["num_kv_heads", "window_size", "rope_theta"])
def test_attention_specs_with_different_settings_are_refused(second, tmp_path):
    attn = [{"layers": [0], "num_heads": 4}, {"layers": [2], "num_heads": 4, **second}]
    fla_model("gated_deltanet", num_hidden_layers=3, attn=attn).save_pretrained(tmp_path / "src")
    with pytest.raises(SpecError) as err:
        import_fla(tmp_path / "src", tmp_path / "out")
    assert "config.attn" in str(err.value) and "different settings" in str(err.value)
    assert not (tmp_path / "out").exists()
    result = invoke("import", tmp_path / "src", tmp_path / "out2")
    assert result.exit_code != 0 and "config.attn" in result.output
    assert not (tmp_path / "out2").exists()


def test_eval_and_export_hf_of_a_hybrid_with_grouped_value_heads(tmp_path):
    transformers = pytest.importorskip("transformers")
    family, over, _, _ = CASES["gdn-gva-attn"]
    model = fla_model(family, seed=8, **{**over, "attn": {"layers": [1], "num_heads": 4, "num_kv_heads": 2,
                                                           "window_size": 5}})
    model.save_pretrained(tmp_path / "src")
    out = tmp_path / "run"
    assert invoke("import", tmp_path / "src", out).exit_code == 0
    result = invoke("--format", "json", "eval", out, "--task", '{use = "mqar", num_pairs = 4, seq_len = 32}',
                    "--batches", "1", "--batch-size", "4", "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert 0.0 <= json.loads(result.output)["accuracy"] <= 1.0
    result = invoke("export-hf", out, tmp_path / "hf")
    assert result.exit_code == 0, result.output
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(2))
    want = fla_logits(model, ids)
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    # Hugging Face's decoding carries the state (the attention's windowed cache included) token by token
    ids = torch.tensor([[3, 17, 5, 9]])
    got = hf.generate(ids, max_new_tokens=7, do_sample=False)
    for _ in range(7):
        ids = torch.cat([ids, fla_logits(model, ids)[:, -1:].argmax(-1)], 1)
    assert got.tolist() == ids.tolist()
