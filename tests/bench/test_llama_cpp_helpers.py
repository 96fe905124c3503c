"""benchmarks/llama_cpp.py's pure-Python parts: llama-bench's JSON, the commands, the stand-in tokenizer.

Nothing is downloaded or built: the llama-bench output below was captured from a llama-bench built by
benchmarks/llama_cpp.py (llama-cpp-python 0.3.36, llama.cpp commit 0c1e570) on a 4-layer random
Qwen3.5-shaped model (`-p 64 -n 16 -r 2 -o json`), with fields the parser ignores trimmed."""

import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "llama_cpp.py"


@pytest.fixture(scope="module")
def lc():
    spec = importlib.util.spec_from_file_location("_bench_llama_cpp", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_COMMON = {
    "build_commit": "0c1e570", "build_number": 1, "cpu_info": "Intel(R) Xeon(R) Processor @ 2.50GHz",
    "gpu_info": "", "backends": "CPU", "model_filename": "models/small-f32.gguf",
    "model_type": "qwen35 ?B all F32", "model_size": 3699936, "model_n_params": 924984,
    "n_batch": 2048, "n_ubatch": 512, "n_threads": 2, "type_k": "f16", "type_v": "f16",
    "n_gpu_layers": -1, "flash_attn": -1, "n_depth": 0, "test_time": "2026-11-27T23:17:16Z",
}
SAMPLE = json.dumps([
    dict(_COMMON, n_prompt=64, n_gen=0, avg_ns=56961921, stddev_ns=49513523, avg_ts=1805.747826,
         stddev_ts=1569.626396, samples_ns=[21950574, 91973269], samples_ts=[2915.64, 695.854]),
    dict(_COMMON, n_prompt=0, n_gen=16, avg_ns=90269911, stddev_ns=80936912, avg_ts=296.375963,
         stddev_ts=265.733679, samples_ns=[33038871, 147500951], samples_ts=[484.278, 108.474]),
], indent=2)


def test_parses_prefill_and_decode_rates(lc):
    res = lc.parse_bench_json(SAMPLE)
    assert res["prefill"] == {"tokens": 64, "tokens_per_s": pytest.approx(1805.747826),
                              "stddev": pytest.approx(1569.626396), "samples": [2915.64, 695.854]}
    assert res["decode"]["tokens"] == 16
    assert res["decode"]["tokens_per_s"] == pytest.approx(296.375963)
    assert res["decode"]["stddev"] == pytest.approx(265.733679)
    assert (res["build_commit"], res["build_number"], res["n_threads"]) == ("0c1e570", 1, 2)
    assert res["model_type"] == "qwen35 ?B all F32"


def test_parser_tolerates_log_lines_and_missing_aggregates(lc):
    rows = json.loads(SAMPLE)
    for row in rows:
        del row["avg_ts"], row["stddev_ts"]
    text = "load_backend: loaded CPU backend\n" + json.dumps(rows) + "\nllama_perf: done\n"
    res = lc.parse_bench_json(text)
    assert res["prefill"]["tokens_per_s"] == pytest.approx((2915.64 + 695.854) / 2)
    assert res["decode"]["stddev"] > 0
    with pytest.raises(ValueError):
        lc.parse_bench_json("error: failed to load model")


def test_parses_version_line(lc):
    text = "version: 0.5.0-dev (build 1, commit 0c1e570)\nbuilt with GNU 12.2.0 for Linux x86_64\n"
    assert lc.parse_version(text) == {"version": "0.5.0-dev", "build_number": 1, "build_commit": "0c1e570",
                                      "compiler": "GNU 12.2.0 for Linux x86_64"}


def test_bench_command(lc):
    cmd = lc.bench_command("/x/llama-bench", "/m/model.gguf", threads=2, prompt=2048, gen=32, reps=3)
    assert shlex.join(cmd) == "/x/llama-bench -m /m/model.gguf -t 2 -p 2048 -n 32 -r 3 -o json"


def test_run_llama_bench_with_a_fake_binary(lc, tmp_path):
    fake = tmp_path / "llama-bench"
    out = tmp_path / "out.json"
    out.write_text(SAMPLE)
    fake.write_text(f"#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'version: 0.5.0-dev (build 1, commit 0c1e570)'; "
                    f"exit 0; fi\necho \"$@\" > {tmp_path}/argv\ncat {out}\n")
    fake.chmod(0o755)
    res = lc.run_llama_bench(fake, tmp_path / "m.gguf", threads=2, prompt=64, gen=16, reps=2)
    assert (tmp_path / "argv").read_text().split() == ["-m", str(tmp_path / "m.gguf"), "-t", "2", "-p", "64",
                                                       "-n", "16", "-r", "2", "-o", "json"]
    assert res["prefill_tok_s"] == pytest.approx(1805.747826)
    assert res["decode_tok_s"] == pytest.approx(296.375963)
    assert res["llama_cpp_version"] == "0.5.0-dev"
    assert res["command"].endswith("-o json")


def test_convert_command(lc):
    cmd = lc.convert_command("/s/convert_hf_to_gguf.py", "/ckpt", "/o/m.gguf", "bf16", extra_args=["--no-mtp"])
    assert cmd[0] == sys.executable and cmd[1] == "-c"
    assert cmd[3:] == ["/s/convert_hf_to_gguf.py", "default", "/ckpt", "--outfile", "/o/m.gguf",
                       "--outtype", "bf16", "--no-mtp"]
    compile(cmd[2], "<bootstrap>", "exec")
    with pytest.raises(ValueError):
        lc.convert_command("/s/c.py", "/ckpt", "/o/m.gguf", "q4_0")


def test_stand_in_tokenizer_stays_within_the_vocab(lc, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    lc.write_stand_in_tokenizer(tmp_path, vocab_size=1000)
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.get_vocab_size() < 1000
    ids = tok.encode("the\nline ÿ").ids
    assert ids and max(ids) < 1000
    assert tok.decode(ids) == "the\nline ÿ"
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["eos_token"] == "<|endoftext|>"
    with pytest.raises(ValueError):
        lc.write_stand_in_tokenizer(tmp_path, vocab_size=100)


def test_tensor_names_from_safetensors_headers(lc, tmp_path):
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "model.embed_tokens.weight": {"dtype": "F32", "shape": [1, 1], "data_offsets": [0, 4]}})
    raw = header.encode()
    (tmp_path / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * 4)
    assert lc.checkpoint_tensor_names(tmp_path) == ["model.embed_tokens.weight"]


def test_module_imports_nothing_of_atlas():
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('m', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            "print(sorted(k for k in sys.modules if k.split('.')[0] in ('atlas_core', 'torch', 'transformers')))")
    out = subprocess.run([sys.executable, "-c", code, str(_PATH)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
