"""llama.cpp as a peer in the inference benchmark: build ``llama-bench``, convert a checkpoint, run it.

    python benchmarks/llama_cpp.py HF_DIR --dtype f32 --prompt 2048 --gen 32
    python benchmarks/llama_cpp.py HF_DIR --dtype bf16 --threads 2 --reps 3 --keep-gguf out.gguf
    python benchmarks/llama_cpp.py --build-only            # fetch + build llama-bench, print its path

prints one JSON line: prefill and decode tokens/s (mean, stddev over ``--reps``) from ``llama-bench``
on the GGUF converted from ``HF_DIR`` (what transformers' ``save_pretrained`` writes), with the
command line, llama.cpp's build commit/number, and the llama-cpp-python version that carried it.

Where llama.cpp comes from. PyPI's ``llama-cpp-python`` source distribution vendors llama.cpp under
``vendor/llama.cpp`` (its C++ sources, ``convert_hf_to_gguf.py`` and the ``gguf-py`` package that
converter is written against). :func:`build_llama_bench` downloads that sdist with pip
(``pip download --no-binary :all: --no-deps llama-cpp-python==VERSION``; the newest 0.3.x when the
pinned one is missing), extracts it under the cache directory and builds only the ``llama-bench``
target: CMake Release, ``GGML_NATIVE=ON`` (this CPU's AVX-512 / AVX-512 BF16), no CUDA, no network
code (``LLAMA_CURL=OFF``, and ``LLAMA_OPENSSL=OFF`` for the versions that replaced curl), static
libraries so the binary stands alone. A binary already in the cache is reused. The cache defaults to
``.cache/llama_cpp/`` at the repository root (git-ignored); nothing of it is committed.

Converting a random-weight checkpoint. The converter reads the tokenizer with transformers'
``AutoTokenizer`` and a random checkpoint has none, so :func:`to_gguf` converts a temporary copy of
the directory (the weight files are symlinked, never rewritten: the GGUF holds the checkpoint's own
weights, at ``--outtype f32`` or ``bf16``) into which it writes a small byte-level BPE tokenizer: the
256 byte symbols, a few merges (llama.cpp refuses a BPE vocabulary without merges) and one special
token. Ids the tokenizer lacks up to the config's ``vocab_size`` are padded by the converter itself
(``[PAD<id>]`` tokens), so the embedding and output matrices keep their shape. The converter then
hashes how the tokenizer splits a test string (``get_vocab_base_pre``) to name the pre-tokenizer and
refuses a hash it does not know, which a made-up tokenizer always is: the converter therefore runs
in a child Python with that one method wrapped, so that an unrecognised hash is written as the
pre-tokenizer ``pre_tokenizer`` (default ``"default"``, which llama.cpp's loader knows) instead of
raising. ``llama-bench`` feeds random token ids and never tokenizes text, so the tokenizer has no
effect on what is measured. (When ``sentencepiece`` is not installed, the child also makes the
converter look for a SentencePiece ``tokenizer.model`` before importing sentencepiece: the Qwen
converters try that file first and fall back to BPE only on FileNotFoundError, but the import comes
first and raises ImportError without the package.)

This module imports nothing of atlas_core; the bench harness imports it by path.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = REPO_ROOT / ".cache" / "llama_cpp"
DTYPES = ("f32", "bf16")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DGGML_CUDA=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
)


def _log(msg: str) -> None:
    print(f"[llama_cpp] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# the source: llama-cpp-python's sdist


def _sdist_version(path: Path) -> str:
    m = re.match(r"llama_cpp_python-(\d+(?:\.\d+)*)$", path.name)
    return m.group(1) if m else ""


def _version_key(v: str) -> tuple:
    return tuple(int(p) for p in v.split("."))


def _download_sdist(cache: Path, version: str | None) -> Path:
    dest = cache / "sdist"
    dest.mkdir(parents=True, exist_ok=True)
    specs = [f"llama-cpp-python=={version}"] if version else []
    specs.append("llama-cpp-python>=0.3,<0.4")  # fallback: the newest 0.3.x
    if version and (dest / f"llama_cpp_python-{version}.tar.gz").is_file():
        return dest / f"llama_cpp_python-{version}.tar.gz"
    for spec in specs:
        _log(f"pip download {spec} (source distribution) -> {dest}")
        cmd = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-d", str(dest), spec]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode == 0:
            found = sorted(dest.glob("llama_cpp_python-*.tar.gz"), key=os.path.getmtime)
            if found:
                return found[-1]
        _log(f"pip download {spec} failed:\n{r.stdout[-2000:]}")
    raise RuntimeError("could not download llama-cpp-python's source distribution from PyPI")


def source_dir(cache_dir: str | Path = DEFAULT_CACHE, version: str | None = LLAMA_CPP_PYTHON_VERSION,
               download: bool = True) -> Path:
    """The extracted llama-cpp-python sdist (``cache_dir/src/llama_cpp_python-X``); downloaded if absent.

    ``version`` None takes whatever is already extracted (newest first), else the newest 0.3.x."""
    cache = Path(cache_dir).resolve()
    src = cache / "src"
    have = sorted((p for p in src.glob("llama_cpp_python-*") if (p / "vendor" / "llama.cpp").is_dir()),
                  key=lambda p: _version_key(_sdist_version(p) or "0"))
    if version:
        have = [p for p in have if _sdist_version(p) == version]
    if have:
        return have[-1]
    if not download:
        raise FileNotFoundError(f"no extracted llama-cpp-python {version or ''} under {src}")
    tgz = _download_sdist(cache, version)
    src.mkdir(parents=True, exist_ok=True)
    _log(f"extracting {tgz.name}")
    with tarfile.open(tgz) as tf:
        top = tf.getnames()[0].split("/")[0]
        if sys.version_info >= (3, 12):
            tf.extractall(src, filter="tar")
        else:
            tf.extractall(src)  # noqa: S202 -- a PyPI sdist we just downloaded
    out = src / top
    if not (out / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        raise RuntimeError(f"{tgz.name} does not vendor llama.cpp under vendor/llama.cpp")
    return out


def llama_cpp_dir(cache_dir: str | Path = DEFAULT_CACHE, version: str | None = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """The vendored llama.cpp tree (``.../vendor/llama.cpp``)."""
    return source_dir(cache_dir, version) / "vendor" / "llama.cpp"


def converter_path(cache_dir: str | Path = DEFAULT_CACHE, version: str | None = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """The vendored ``convert_hf_to_gguf.py``."""
    return llama_cpp_dir(cache_dir, version) / "convert_hf_to_gguf.py"


def gguf_py_path(cache_dir: str | Path = DEFAULT_CACHE, version: str | None = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """The vendored ``gguf-py`` directory (put it on ``sys.path`` to import the matching ``gguf``)."""
    return llama_cpp_dir(cache_dir, version) / "gguf-py"


# ---------------------------------------------------------------------------------------------
# the binary


def build_dir(cache_dir: str | Path = DEFAULT_CACHE, version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    return Path(cache_dir).resolve() / f"build-{version}"


def build_llama_bench(cache_dir: str | Path = DEFAULT_CACHE, version: str = LLAMA_CPP_PYTHON_VERSION,
                      jobs: int | None = None, force: bool = False) -> Path:
    """Path of a ``llama-bench`` built from llama-cpp-python ``version``'s vendored llama.cpp.

    Cached: ``cache_dir/build-VERSION/bin/llama-bench``; built only when absent (or ``force``).
    Takes several minutes on two cores; progress goes to stderr."""
    bdir = build_dir(cache_dir, version)
    binary = bdir / "bin" / "llama-bench"
    if binary.is_file() and os.access(binary, os.X_OK) and not force:
        return binary
    for tool in ("cmake", "make", "c++"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"building llama-bench needs {tool} on PATH")
    lcpp = llama_cpp_dir(cache_dir, version)
    jobs = jobs or os.cpu_count() or 2
    t0 = time.perf_counter()
    configure = ["cmake", "-S", str(lcpp), "-B", str(bdir), *CMAKE_FLAGS]
    _log("configure: " + shlex.join(configure))
    r = subprocess.run(configure, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"cmake configure failed:\n{r.stdout[-4000:]}")
    build = ["cmake", "--build", str(bdir), "--config", "Release", "--target", "llama-bench", "-j", str(jobs)]
    _log("build (minutes on 2 cores): " + shlex.join(build))
    proc = subprocess.Popen(build, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    last = 0.0
    for line in proc.stdout:  # type: ignore[union-attr]
        tail = (tail + [line])[-60:]
        m = re.match(r"\s*\[\s*(\d+)%\]", line)
        if m and time.perf_counter() - last > 15:
            last = time.perf_counter()
            _log(f"  {m.group(1)}% ({last - t0:.0f} s)")
    if proc.wait() != 0 or not binary.is_file():
        raise RuntimeError("building llama-bench failed:\n" + "".join(tail))
    _log(f"built {binary} in {time.perf_counter() - t0:.0f} s")
    return binary


# ---------------------------------------------------------------------------------------------
# the checkpoint: HF directory -> GGUF

_SPECIAL = "<|endoftext|>"
_MERGES = [("Ġ", "t"), ("Ġ", "a"), ("t", "h"), ("i", "n"), ("e", "r"), ("a", "n"), ("o", "n"), ("r", "e")]


def write_stand_in_tokenizer(directory: str | Path, vocab_size: int) -> None:
    """A small byte-level BPE (``tokenizer.json`` + ``tokenizer_config.json``) for a random checkpoint.

    Ids 0..255 are the bytes, then the merged pairs of ``_MERGES``, then ``<|endoftext|>``; every id
    is below ``vocab_size`` (the converter pads the rest)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from atlas_core.hf.tokenizer import byte_symbols

    vocab = {s: i for i, s in enumerate(byte_symbols())}
    for a, b in _MERGES:
        vocab.setdefault(a + b, len(vocab))
    if len(vocab) + 1 > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the stand-in tokenizer ({len(vocab) + 1})")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(_MERGES)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([_SPECIAL])
    d = Path(directory)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": _SPECIAL, "bos_token": None, "pad_token": _SPECIAL, "unk_token": None,
        "model_max_length": 1 << 20,
    }, indent=1))


# Run in a child interpreter: argv = [converter, pre_tokenizer, converter args...]. It wraps
# get_vocab_base_pre so that an unknown tokenizer hash becomes `pre_tokenizer` (see the module doc).
_CONVERT_BOOTSTRAP = r"""
import importlib.util, logging, runpy, sys
from pathlib import Path
converter, pre = Path(sys.argv[1]), sys.argv[2]
sys.path[:0] = [str(converter.parent), str(converter.parent / "gguf-py")]
import conversion
base = sys.modules["conversion.base"]
if importlib.util.find_spec("sentencepiece") is None:
    # Qwen's set_vocab tries a SentencePiece tokenizer.model first and falls back to BPE only on
    # FileNotFoundError, but imports sentencepiece before it looks for the file: without the package
    # that is an ImportError. Look for the file first, as the method itself does next.
    for cls in [c for c in vars(base).values() if isinstance(c, type) and "_create_vocab_sentencepiece" in vars(c)]:
        def checked(self, _original=cls._create_vocab_sentencepiece):
            if not (Path(self.dir_model) / "tokenizer.model").is_file():
                raise FileNotFoundError(f"File not found: {Path(self.dir_model) / 'tokenizer.model'}")
            return _original(self)
        cls._create_vocab_sentencepiece = checked
owners = [c for c in vars(base).values() if isinstance(c, type) and "get_vocab_base_pre" in vars(c)]
if not owners:
    raise SystemExit("convert_hf_to_gguf: no get_vocab_base_pre to wrap in conversion.base")
for cls in owners:
    original = cls.get_vocab_base_pre
    def wrapped(self, tokenizer, _original=original):
        # The converter names a BPE pre-tokenizer by hashing how it splits a test string and refuses
        # unknown hashes; the stand-in tokenizer of a random checkpoint is unknown by construction.
        # llama-bench feeds random token ids, so the name written here does not affect the benchmark.
        try:
            return _original(self, tokenizer)
        except NotImplementedError:
            logging.getLogger("llama_cpp_peer").warning(
                "stand-in tokenizer: pre-tokenizer hash unknown to the converter, writing %r", pre)
            return pre
    cls.get_vocab_base_pre = wrapped
sys.argv = [str(converter)] + sys.argv[3:]
runpy.run_path(str(converter), run_name="__main__")
"""


# Converter classes that add multi-token-prediction blocks (Qwen3-Next, Qwen3.5/3.6): without `mtp.*`
# tensors (transformers' *ForCausalLM has none) they assert unless told --no-mtp.
MTP_ARCHITECTURES = frozenset({"Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
                               "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"})


def checkpoint_tensor_names(hf_dir: str | Path) -> list[str]:
    """Tensor names of a safetensors checkpoint, read from the files' headers (no weights loaded)."""
    names: list[str] = []
    for f in sorted(Path(hf_dir).glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        names += [k for k in header if k != "__metadata__"]
    return names


def convert_command(converter: str | Path, hf_dir: str | Path, out_file: str | Path, dtype: str,
                    pre_tokenizer: str = "default", extra_args: list[str] | tuple = (),
                    python: str | None = None) -> list[str]:
    """The child-process command :func:`to_gguf` runs (the converter behind the bootstrap)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    return [python or sys.executable, "-c", _CONVERT_BOOTSTRAP, str(converter), pre_tokenizer,
            str(hf_dir), "--outfile", str(out_file), "--outtype", dtype, *extra_args]


def to_gguf(hf_dir: str | Path, out_file: str | Path, dtype: str = "f32", *,
            cache_dir: str | Path = DEFAULT_CACHE, version: str = LLAMA_CPP_PYTHON_VERSION,
            pre_tokenizer: str = "default", stand_in_tokenizer: bool | None = None) -> Path:
    """Convert a Hugging Face checkpoint directory to GGUF (``dtype`` "f32" or "bf16") with the vendored
    ``convert_hf_to_gguf.py`` and ``gguf-py``.

    ``stand_in_tokenizer`` None writes the stand-in tokenizer only when the directory has no
    ``tokenizer.json`` / ``tokenizer.model``. The checkpoint directory itself is never modified."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    hf_dir = Path(hf_dir).resolve()
    out_file = Path(out_file).resolve()
    config = json.loads((hf_dir / "config.json").read_text())
    if stand_in_tokenizer is None:
        stand_in_tokenizer = not any((hf_dir / f).is_file() for f in ("tokenizer.json", "tokenizer.model"))
    converter = converter_path(cache_dir, version)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llama_cpp_ckpt_") as tmp:
        work = Path(tmp) / hf_dir.name  # the converter names the model after the directory
        work.mkdir()
        for f in hf_dir.iterdir():  # symlinks: the weights are read in place, not copied
            if f.is_file():
                (work / f.name).symlink_to(f)
        if stand_in_tokenizer:
            text_cfg = config.get("text_config", config)
            vocab_size = int(text_cfg.get("vocab_size", config.get("vocab_size")))
            for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt",
                         "special_tokens_map.json", "added_tokens.json"):
                if (work / name).is_symlink():
                    (work / name).unlink()
            write_stand_in_tokenizer(work, vocab_size)
        extra = []
        if (set(config.get("architectures") or []) & MTP_ARCHITECTURES
                and "--no-mtp" in converter.read_text()
                and not any(n.startswith(("mtp.", "model.mtp.")) for n in checkpoint_tensor_names(hf_dir))):
            extra.append("--no-mtp")
        cmd = convert_command(converter, work, out_file, dtype, pre_tokenizer, extra)
        env = dict(os.environ, NO_LOCAL_GGUF="1")  # the bootstrap puts the vendored gguf-py first itself
        _log(f"convert {hf_dir.name} -> {out_file.name} ({dtype}) with {converter}")
        t0 = time.perf_counter()
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0 or not out_file.is_file():
            raise RuntimeError(f"convert_hf_to_gguf.py failed ({r.returncode}):\n{r.stdout[-6000:]}")
        for line in r.stdout.splitlines():
            if "stand-in tokenizer" in line or line.startswith(("WARNING", "ERROR")):
                _log("  converter: " + line)
        _log(f"converted in {time.perf_counter() - t0:.0f} s: {out_file.stat().st_size / 2**30:.2f} GiB")
    return out_file


# ---------------------------------------------------------------------------------------------
# the benchmark


def bench_command(binary: str | Path, gguf: str | Path, threads: int = 2, prompt: int = 2048, gen: int = 32,
                  reps: int = 3) -> list[str]:
    """``llama-bench -m GGUF -t THREADS -p PROMPT -n GEN -r REPS -o json``."""
    return [str(binary), "-m", str(gguf), "-t", str(threads), "-p", str(prompt), "-n", str(gen),
            "-r", str(reps), "-o", "json"]


def _extract_json(text: str):
    """The JSON array llama-bench prints (tolerating log lines around it)."""
    start = text.find("[")
    end = text.rfind("]")
    if start < 0 or end < start:
        raise ValueError("no JSON array in llama-bench's output")
    return json.loads(text[start:end + 1])


def _rate(row: dict, key: str, samples_key: str) -> tuple[float, float, list]:
    samples = list(row.get(samples_key) or [])
    mean = row.get(key)
    if mean is None and samples:
        mean = statistics.fmean(samples)
    std = row.get(key.replace("avg", "stddev"))
    if std is None:
        std = statistics.stdev(samples) if len(samples) > 1 else 0.0
    return float(mean), float(std), [float(s) for s in samples]


def parse_bench_json(text: str) -> dict:
    """Prefill and decode tokens/s (mean, stddev, per-rep samples) and the build from llama-bench's
    ``-o json`` output.

    llama-bench prints one record per test: prompt processing has ``n_prompt > 0, n_gen == 0``,
    generation ``n_prompt == 0, n_gen > 0``; ``avg_ts`` / ``stddev_ts`` are tokens per second."""
    rows = _extract_json(text)
    if isinstance(rows, dict):
        rows = [rows]
    out: dict = {"prefill": None, "decode": None}
    for row in rows:
        n_prompt, n_gen = int(row.get("n_prompt", 0)), int(row.get("n_gen", 0))
        if n_prompt > 0 and n_gen == 0:
            kind, tokens = "prefill", n_prompt
        elif n_gen > 0 and n_prompt == 0:
            kind, tokens = "decode", n_gen
        else:
            kind, tokens = f"pg_{n_prompt}_{n_gen}", n_prompt + n_gen
        mean, std, samples = _rate(row, "avg_ts", "samples_ts")
        out[kind] = {"tokens": tokens, "tokens_per_s": mean, "stddev": std, "samples": samples}
    first = rows[0] if rows else {}
    for key in ("build_commit", "build_number", "cpu_info", "backends", "model_type", "model_size",
                "model_n_params", "n_threads", "type_k", "type_v", "n_batch", "n_ubatch"):
        if key in first:
            out[key] = first[key]
    return out


def parse_version(text: str) -> dict:
    """``llama-bench --version``'s ``version: 0.5.0-dev (build 1, commit 0c1e570)`` as a dict."""
    out: dict = {}
    m = re.search(r"version:\s*(\S+)\s*\(build\s*(\d+),\s*commit\s*([0-9a-fA-F]+|unknown)\)", text)
    if m:
        out = {"version": m.group(1), "build_number": int(m.group(2)), "build_commit": m.group(3)}
    m = re.search(r"built with (.+)", text)
    if m:
        out["compiler"] = m.group(1).strip()
    return out


def llama_bench_version(binary: str | Path) -> dict:
    r = subprocess.run([str(binary), "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return parse_version(r.stdout)


def run_llama_bench(binary: str | Path, gguf: str | Path, threads: int = 2, prompt: int = 2048, gen: int = 32,
                    reps: int = 3, timeout: float | None = None) -> dict:
    """Run llama-bench on ``gguf`` and return::

        {"prefill_tok_s", "prefill_stddev", "decode_tok_s", "decode_stddev",  # tokens/s, over reps
         "prefill", "decode",            # per-test dicts (tokens, tokens_per_s, stddev, samples)
         "command", "build_commit", "build_number", "llama_cpp_version", ...}  # what ran, which llama.cpp
    """
    version = llama_bench_version(binary)
    cmd = bench_command(binary, gguf, threads, prompt, gen, reps)
    _log("run: " + shlex.join(cmd))
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({r.returncode}):\n{r.stderr[-4000:]}")
    res = parse_bench_json(r.stdout)
    res["command"] = shlex.join(cmd)
    res["llama_cpp_version"] = version.get("version")
    if version.get("compiler"):
        res["compiler"] = version["compiler"]
    res["prefill_tok_s"] = res["prefill"]["tokens_per_s"] if res.get("prefill") else None
    res["prefill_stddev"] = res["prefill"]["stddev"] if res.get("prefill") else None
    res["decode_tok_s"] = res["decode"]["tokens_per_s"] if res.get("decode") else None
    res["decode_stddev"] = res["decode"]["stddev"] if res.get("decode") else None
    return res


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir", nargs="?", help="a Hugging Face checkpoint directory (save_pretrained)")
    ap.add_argument("--dtype", choices=DTYPES, default="f32")
    ap.add_argument("--prompt", type=int, default=2048, help="prefill tokens (llama-bench -p)")
    ap.add_argument("--gen", type=int, default=32, help="decoded tokens (llama-bench -n)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cache-dir", default=str(DEFAULT_CACHE))
    ap.add_argument("--version", default=LLAMA_CPP_PYTHON_VERSION, help="llama-cpp-python sdist version")
    ap.add_argument("--binary", help="an existing llama-bench (skips the build)")
    ap.add_argument("--gguf", help="an existing GGUF (skips the conversion; hf_dir may be omitted)")
    ap.add_argument("--keep-gguf", help="write the converted GGUF here and keep it (default: a temp file)")
    ap.add_argument("--pre-tokenizer", default="default",
                    help="pre-tokenizer name written for a stand-in tokenizer the converter does not know")
    ap.add_argument("--build-only", action="store_true", help="build llama-bench, print its path, exit")
    args = ap.parse_args(argv)

    binary = Path(args.binary) if args.binary else build_llama_bench(args.cache_dir, args.version)
    if args.build_only:
        print(binary)
        return 0
    if not args.gguf and not args.hf_dir:
        ap.error("give HF_DIR or --gguf")
    tmp = None
    try:
        if args.gguf:
            gguf = Path(args.gguf)
        else:
            if args.keep_gguf:
                gguf = Path(args.keep_gguf)
            else:
                tmp = tempfile.TemporaryDirectory(prefix="llama_cpp_gguf_")
                gguf = Path(tmp.name) / f"model-{args.dtype}.gguf"
            to_gguf(args.hf_dir, gguf, args.dtype, cache_dir=args.cache_dir, version=args.version,
                    pre_tokenizer=args.pre_tokenizer)
        load_before = _load_average()
        res = run_llama_bench(binary, gguf, args.threads, args.prompt, args.gen, args.reps)
        res.update({"hf_dir": args.hf_dir, "dtype": args.dtype, "gguf_bytes": gguf.stat().st_size,
                    "llama_cpp_python": args.version, "loadavg_before": load_before,
                    "loadavg_after": _load_average()})
        print(json.dumps(res))
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
