"""Exports that a Hugging Face client loads by itself: ``config.json``'s ``auto_map`` and the
remote code beside the weights (`atlas_core.hf.remote_code`), and a tokenizer for every text
codec (`atlas_core.hf.tokenizer`).

- In a fresh process that never imports ``atlas_core`` itself: ``AutoModelForCausalLM`` with
  ``trust_remote_code=True`` gives the native logits, ``AutoTokenizer`` encodes as the checkpoint
  does, and ``pipeline("text-generation", model=EXPORT, trust_remote_code=True)`` generates the
  text ``atlas generate --greedy`` generates; without ``trust_remote_code`` (and no
  ``import atlas_core``) the model is refused, as any remote-code model is.
- After ``import atlas_core``, no ``trust_remote_code``: the registered classes load it, as
  before the remote code existed.
- The byte and char tokenizers give the codec's ids and decode them back; a character outside a
  char model's vocabulary is refused (it has no id).
- A model saved again (``save_pretrained``) carries the remote code too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("transformers", reason="the Hugging Face integration needs transformers "
                    "(pip install 'atlas-ttm[hf]')")

import torch  # noqa: E402

import atlas_core  # noqa: E402
from atlas_core.hf import export_checkpoint  # noqa: E402
from atlas_core.hf.remote_code import AUTO_MAP, FILES  # noqa: E402
from atlas_core.train.codec import TextCodec  # noqa: E402
from atlas_core.train.inference import generate_from_checkpoint  # noqa: E402

from .specs import SPECS, make_checkpoint  # noqa: E402

CHARS = list(" .Tabcdehilmnorsty\n")  # 19 characters of a 32-id model
PROMPT = "The memory "


@pytest.fixture(scope="module")
def char_export(tmp_path_factory):
    root = tmp_path_factory.mktemp("remote")
    ckpt = make_checkpoint(root, SPECS["core_lm"], seed=5, text={"mode": "char", "vocab": CHARS})
    out = root / "hf"
    export_checkpoint(ckpt, out)
    return ckpt, out


def test_the_export_names_its_remote_code(char_export):
    _, out = char_export
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"] == AUTO_MAP
    for name in FILES:
        text = (out / name).read_text()
        assert "from atlas_core.hf." in text and "class Atlas" in text
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}


FRESH = textwrap.dedent("""
    import json, sys
    assert "atlas_core" not in sys.modules
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline
    out, prompt, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    try:
        AutoModelForCausalLM.from_pretrained(out, trust_remote_code=False)
        refused = None
    except Exception as exc:  # transformers' own refusal of remote code not trusted
        refused = str(exc)
    assert "atlas_core" not in sys.modules, "loading without trust_remote_code imported atlas_core"
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    tok = AutoTokenizer.from_pretrained(out, trust_remote_code=True)
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    gen = pipeline("text-generation", model=out, trust_remote_code=True)
    # clean_up_tokenization_spaces=False: the pipeline's own default before transformers 5.24
    # turns " ." into "." in the whole text, then cuts the prompt's length off it
    text = gen(prompt, max_new_tokens=n, do_sample=False, return_full_text=False,
               clean_up_tokenization_spaces=False)[0]["generated_text"]
    print(json.dumps({"refused": refused, "ids": ids[0].tolist(), "logits": logits[0].tolist(),
                      "text": text, "class": type(model).__mro__[2].__module__,
                      "imported_by_remote_code": "atlas_core" in sys.modules}))
""")


def test_a_process_that_never_imports_atlas_core_loads_it_with_remote_code(char_export):
    ckpt, out = char_export
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATLAS_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    r = subprocess.run([sys.executable, "-c", FRESH, str(out), PROMPT, "24"], capture_output=True,
                       text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["refused"] and "trust_remote_code" in got["refused"]
    assert got["imported_by_remote_code"] and got["class"] == "atlas_core.hf.modeling"
    codec = TextCodec("char", tuple(CHARS))
    assert got["ids"] == codec.encode(PROMPT)
    native = atlas_core.load(ckpt)
    with torch.no_grad():
        want = native(torch.tensor([got["ids"]]))[0]
    torch.testing.assert_close(torch.tensor(got["logits"]), want, rtol=1e-5, atol=1e-5)
    ours = generate_from_checkpoint(str(ckpt), prompt=PROMPT, max_new_tokens=24, greedy=True,
                                    device="cpu")
    assert got["text"] == ours["text"] and len(ours["ids"]) == 24


def test_with_atlas_core_imported_no_remote_code_is_needed(char_export):
    from transformers import AutoModelForCausalLM

    from atlas_core.hf.modeling import AtlasForCausalLM

    _, out = char_export
    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model) is AtlasForCausalLM


@pytest.mark.parametrize("mode", ["byte", "char"])
def test_byte_and_char_tokenizers_give_the_codecs_ids(mode, tmp_path):
    from transformers import AutoTokenizer

    from atlas_core.hf.tokenizer import hf_tokenizer

    # " ." and " ," stay: no clean-up of decoded text (transformers 5.0 cleaned by default)
    text = "héllo wörld ∑ .\n\nthe end ." if mode == "byte" else "the mode ,\n\nchars . Tlc"
    codec = TextCodec(mode, tuple(sorted(set(text))) if mode == "char" else None)
    hf_tokenizer(codec).save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    ids = tok(text)["input_ids"]
    assert ids == codec.encode(text) and tok.decode(ids) == text == codec.decode(ids)
    assert tok.decode(ids, skip_special_tokens=True) == text
    if mode == "byte":
        assert ids == list(text.encode("utf-8")) and tok.decode([0xE2, 0x88]) == codec.decode([0xE2, 0x88])
    else:
        with pytest.raises(Exception, match="UNK|unk"):
            tok("the zebra")  # z has no id


def test_save_pretrained_carries_the_remote_code(char_export, tmp_path):
    from transformers import AutoModelForCausalLM

    _, out = char_export
    model = AutoModelForCausalLM.from_pretrained(out)
    model.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["auto_map"] == AUTO_MAP
    assert all((tmp_path / "again" / name).is_file() for name in FILES)
