"""Hostile specs: mutated example specs are refused with one clean error, or build and run.

A bounded, seeded run of the spec fuzzer (scripts/fuzz_specs.py, which runs 1,200 and more in
worker processes) in this process, each spec under a SIGALRM deadline, then the pathological
cases of the findings by name, then a few files through the real ``atlas spec validate`` and
``atlas build --device meta`` commands.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from atlas_core.errors import AtlasError, SpecError
from atlas_core.spec import SpecFileError, load_spec

ROOT = Path(__file__).resolve().parents[2]
COUNT = 80  # the full run (docs/hardening.md) uses 1,200
SECONDS_PER_SPEC = 20


def _fuzzer():
    spec = importlib.util.spec_from_file_location("fuzz_specs_for_test", ROOT / "scripts" / "fuzz_specs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


fuzz = _fuzzer()


class _Hang(BaseException):
    pass


def _alarm(signum, frame):
    raise _Hang()


def test_mutated_specs_are_refused_cleanly_or_built(tmp_path):
    previous = signal.signal(signal.SIGALRM, _alarm)
    outcomes, bad = Counter(), []
    try:
        for i, (label, data) in enumerate(fuzz.mutations(seed=2024, count=COUNT)):
            path = tmp_path / f"spec{i}.toml"
            path.write_bytes(data)
            signal.alarm(SECONDS_PER_SPEC)
            try:
                result = fuzz.check_file(str(path), forward_params=200_000)
            except _Hang:
                result = {"outcome": "hang", "detail": f"over {SECONDS_PER_SPEC} s"}
            finally:
                signal.alarm(0)
            outcomes[result["outcome"]] += 1
            if result["outcome"] not in ("error", "built"):
                bad.append((label, result))
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert not bad, bad
    # the mutations reach both ends: refusals, and accepted specs that were built and run
    assert outcomes["error"] > COUNT // 2 and outcomes["built"] > 5, outcomes


def test_the_fuzzer_is_reproducible():
    a = list(fuzz.mutations(seed=7, count=30))
    assert a == list(fuzz.mutations(seed=7, count=30))
    assert a != list(fuzz.mutations(seed=8, count=30))


# -- the findings, by name -----------------------------------------------------------------------
EXAMPLE = (ROOT / "examples" / "titans_mag.toml").read_text()
DEEP = (ROOT / "examples" / "titans_deep_lmm.toml").read_text()


def _nested(depth: int) -> str:
    return EXAMPLE + "\n[extra]\nx = " + "{ a = " * depth + "1" + " }" * depth + "\n"


CASES = {
    # name: (spec text, the path of the issue, words the message must hold)
    "depth_1e9": (EXAMPLE.replace("depth = 2", "depth = 1000000000", 1), "model.depth",
                  ["limit 1024", "parameters (limit 1e10)"]),
    "depth_2_64": (EXAMPLE.replace("depth = 2", "depth = 18446744073709551616", 1), "model.depth",
                   ["limit 1024", "parameters"]),
    "d_model_huge": (EXAMPLE.replace("d_model = 128", "d_model = 10000000", 1), "model.d_model",
                     ["limit 65536", "parameters"]),
    "memory_depth_1e6": (DEEP.replace('"titans:mlp", depth = 2', '"titans:mlp", depth = 1000000'),
                         "memory.structure.depth", ["less than or equal to 64"]),
    "mlp_ratio_inf": (EXAMPLE.replace("heads = 4", "heads = 4\nmlp_ratio = inf", 1),
                      "model.mlp_ratio", ["finite"]),
    "lr_nan": (EXAMPLE.replace("[train]", "[train]\nlr = nan", 1), "train.lr", ["finite"]),
    "gate_bias_inf": (EXAMPLE.replace("theta = -4.6", "theta = -inf", 1), "layer.gate_bias.theta",
                      ["finite"]),
    "steps_huge": (EXAMPLE.replace("steps = 2000", "steps = 100000000000", 1), "train.steps",
                   ["1000000000"]),
    "chunk_huge": (EXAMPLE.replace("chunk_size = 16", "chunk_size = 4294967296", 1),
                   "memory.parallel.chunk_size",
                   ["65536"]),
    "name_is_a_list": (EXAMPLE.replace('use = "titans:titans_deep"', "use = [1, 2]", 1), "memory.use",
                       ["must be a rule name"]),
}


def test_the_named_cases_exist_in_the_examples():
    for name, (text, _, _) in CASES.items():
        assert text != EXAMPLE and text != DEEP, name  # the replacement happened


@pytest.mark.parametrize("name", list(CASES))
def test_absurd_values_are_one_issue_with_the_limit(name):
    text, path, words = CASES[name]
    with pytest.raises(SpecError) as info:
        load_spec(text)
    issues = [i for i in info.value.issues if i.path == path]
    assert issues, info.value.issues
    message = issues[0].render()
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("depth", [65, 1000, 100_000])
def test_deep_nesting_is_one_file_error(depth):
    with pytest.raises(SpecFileError, match=f"nested {depth} deep \\(limit 64\\)"):
        load_spec(_nested(depth))


def test_nesting_inside_strings_and_comments_is_not_counted():
    text = EXAMPLE + '\n[extra]\ns = "' + "{[" * 500 + '"\n# ' + "[" * 500 + "\n"
    with pytest.raises(SpecError) as info:  # parsed fine; only the unknown section is refused
        load_spec(text)
    assert [i.path for i in info.value.issues] == ["extra"]


@pytest.mark.parametrize("damage", ["utf8", "nul", "huge"])
def test_damaged_files_are_one_file_error(tmp_path, damage):
    data = EXAMPLE.encode()
    data = {"utf8": data[:40] + b"\xff\xfe" + data[40:], "nul": data[:40] + b"\x00" + data[40:],
            "huge": data + b"#" * (2 << 20)}[damage]
    path = tmp_path / "bad.toml"
    path.write_bytes(data)
    with pytest.raises(SpecFileError):
        load_spec(path)


def test_a_model_too_big_for_the_preflight_is_refused_before_it_is_built():
    """Sizes each within their limits whose product is not: 500 blocks of a 64-layer memory with
    expansion 256 at d_model 1024 (the resolver's closed form counts the blocks alone)."""
    from atlas_core.preflight import check_model_size

    text = DEEP.replace('"titans:mlp", depth = 2', '"titans:mlp", depth = 64, expansion = 256.0')
    text = text.replace("d_model = 128", "d_model = 1024", 1).replace("depth = 2\n", "depth = 500\n", 1)
    spec = load_spec(text)  # every size is within its own limit
    with pytest.raises(SpecError, match=r"model.depth: the model would have ~[0-9.]+e1[1-9] "
                                        r"parameters \(limit 1e10"):
        check_model_size(spec)


# -- the real commands ---------------------------------------------------------------------------
def _atlas(*args, timeout=120):
    env = {k: v for k, v in os.environ.items() if k != "ATLAS_DEBUG"}
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout, env={**env, "OMP_NUM_THREADS": "1"})


def test_the_real_commands_print_one_error_line(tmp_path):
    files = []
    for name in ("depth_1e9", "mlp_ratio_inf", "memory_depth_1e6"):
        files.append(tmp_path / f"{name}.toml")
        files[-1].write_text(CASES[name][0])
    files.append(tmp_path / "nested.toml")
    files[-1].write_text(_nested(1000))
    # fuzzed specs too: the first few the fuzzer writes, whatever they are
    big = DEEP.replace('"titans:mlp", depth = 2', '"titans:mlp", depth = 64, expansion = 256.0')
    big = big.replace("d_model = 128", "d_model = 1024", 1).replace("depth = 2\n", "depth = 500\n", 1)
    files.append(tmp_path / "too_big_for_the_preflight.toml")
    files[-1].write_text(big)
    for i, (_, data) in enumerate(fuzz.mutations(seed=99, count=6)):
        files.append(tmp_path / f"fuzz{i}.toml")
        files[-1].write_bytes(data)
    p = _atlas("spec", "validate", *map(str, files))
    assert "Traceback" not in p.stdout + p.stderr, p.stderr
    assert p.returncode == 1
    for f in files[:5]:
        assert f"error  {f}: 1 problem" in p.stdout, p.stdout
    assert "parameters (limit 1e10" in p.stdout  # the preflight ran before the meta build
    b = _atlas("build", str(files[3]), "--device", "meta")  # 1,000-deep nesting
    lines = [ln for ln in b.stderr.splitlines() if ln.strip()]
    assert b.returncode == 1 and "Traceback" not in b.stderr
    assert lines and lines[-1].startswith("error: ") and "nested 1000 deep" in lines[-1], b.stderr


def test_outcomes_are_only_clean_errors():
    """The classification itself: an AtlasError is an error, anything else a crash."""
    assert issubclass(SpecFileError, AtlasError)
    res = fuzz.check_file(str(ROOT / "examples" / "titans_lmm.toml"), forward_params=10**7)
    assert res["outcome"] == "built" and res["stage"] == "forward", res
