"""Inference at published sizes on a CPU: decode and prefill speed, peak resident memory, beside
transformers and llama.cpp on the same weights (``atlas bench inference``,
``benchmarks/bench_inference.py``; docs/benchmarks.md, "Inference on a CPU").

Configurations (random weights, seed 0):

- ``qwen3.5-0.8b``: transformers' Qwen3.5 at the 0.8B shape (24 layers: 18 Gated DeltaNet with 16
  key and 16 value heads of 128 + 6 gated attention layers with 8 query / 2 key-value heads of
  256, hidden 1024, MLP 3584, vocab 248,320, tied embeddings: 752M parameters). transformers builds
  it and saves it; atlas imports that directory (`atlas_core.model_import`); llama.cpp converts it.
- ``gated-deltanet-1.3b``: fla's Gated DeltaNet 1.3B default (hidden 2048, 21 layers, 6 heads of
  256, expand_v 2, vocab 32,000), as ``atlas import`` maps it; no peer runs the family on a CPU.
- ``deltanet-1.3b``: fla's DeltaNet 1.3B default (hidden 2048, 24 layers, 16 heads of 128).
- ``tiny``: a small Qwen3.5 for tests.

Each measurement runs in a fresh process (`atlas_core.bench.inference_worker`), so its peak
resident memory is its own: load the weights in the dtype (float32 or bfloat16), prefill each
length once (the last position's logits only), decode ``decode`` tokens after a short prompt. The
machine's read bandwidth (the sum of a 1 GiB float32 tensor, best of five) is measured in the same
run; each decode row's effective bandwidth is the weight bytes a token reads times tokens/s.
Before any speed is reported, atlas's float32 logits are compared with transformers' on the same
ids (a row whose logits differ past 1e-3 relative is marked and its speed not reported as a win).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .device import cpu_name

WORKER = "atlas_core.bench.inference_worker"
CACHE = Path(os.environ.get("ATLAS_BENCH_CACHE", Path.home() / ".cache" / "atlas-bench"))


def _qwen(**over) -> dict[str, Any]:
    cfg = dict(vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
               num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
               linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
               linear_conv_kernel_dim=4, tie_word_embeddings=True, rms_norm_eps=1e-6,
               rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})
    cfg.update(over)
    return cfg


@dataclass(frozen=True)
class Config:
    name: str
    family: str  # "qwen3_5_text" (transformers builds the weights) or an fla model_type
    config: dict[str, Any] = field(default_factory=dict)
    summary: str = ""


CONFIGS: dict[str, Config] = {
    "qwen3.5-0.8b": Config("qwen3.5-0.8b", "qwen3_5_text", _qwen(),
                           "Qwen3.5-0.8B shape: 18 Gated DeltaNet + 6 gated attention layers, hidden 1024"),
    "gated-deltanet-1.3b": Config("gated-deltanet-1.3b", "gated_deltanet",
                                  dict(hidden_size=2048, num_hidden_layers=21, num_heads=6, head_dim=256,
                                       expand_v=2.0, vocab_size=32000),
                                  "fla's Gated DeltaNet 1.3B default: hidden 2048, 21 layers, 6 heads of 256"),
    "deltanet-1.3b": Config("deltanet-1.3b", "delta_net",
                            dict(hidden_size=2048, num_hidden_layers=24, num_heads=16, vocab_size=32000),
                            "fla's DeltaNet 1.3B default: hidden 2048, 24 layers, 16 heads of 128"),
    "tiny": Config("tiny", "qwen3_5_text",
                   _qwen(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
                         linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16),
                   "a small Qwen3.5 (tests)"),
}


def bandwidth_gbs(repeats: int = 5, gib: float = 1.0) -> float:
    """The machine's read bandwidth now: the sum of a ``gib`` GiB float32 tensor, best of ``repeats``."""
    x = torch.ones(int(gib * (1 << 30)) // 4)
    x.sum()
    best = min(_timed(x.sum) for _ in range(repeats))
    return x.numel() * 4 / best / 1e9


def _timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def hide_fla() -> None:
    """transformers picks fla's GPU kernels (and causal_conv1d) when they import: hidden, so its
    own PyTorch paths run (what a CPU user gets). Call before importing transformers' models."""
    for name in [n for n in sys.modules if n.split(".")[0] in ("fla", "causal_conv1d")]:
        del sys.modules[name]
    sys.modules["fla"] = None  # type: ignore[assignment]
    sys.modules["causal_conv1d"] = None  # type: ignore[assignment]


def prepare(config: Config, cache: Path = CACHE, log: Callable[[str], None] = print) -> dict[str, str]:
    """The configuration's checkpoints, made once and cached: ``{"hf": transformers' directory
    (Qwen only), "atlas": the atlas run}``."""
    root = cache / config.name
    out: dict[str, str] = {}
    atlas = root / "atlas"
    if config.family == "qwen3_5_text":
        hf = root / "hf"
        out["hf"] = str(hf)
        if not (hf / "config.json").is_file():
            log(f"{config.name}: building transformers' model with random weights (seed 0) in {hf}")
            _run_worker({"job": "make_hf", "config": config.config, "out": str(hf)})
        if not (atlas / "checkpoints").is_dir():
            log(f"{config.name}: atlas import {hf} {atlas}")
            from ..model_import import import_checkpoint

            import_checkpoint(hf, atlas, overwrite=True)
    elif not (atlas / "checkpoints").is_dir():
        log(f"{config.name}: building atlas's model with random weights (seed 0) in {atlas}")
        _run_worker({"job": "make_fla_shape", "family": config.family, "config": config.config,
                     "name": config.name, "out": str(atlas)})
    out["atlas"] = str(atlas)
    return out


def _run_worker(job: dict[str, Any], threads: int | None = None, timeout: float = 3600) -> dict[str, Any]:
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    proc = subprocess.run([sys.executable, "-m", WORKER], input=json.dumps(job), capture_output=True,
                          text=True, env=env, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the benchmark worker failed ({job.get('job')}, exit {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def measure(engine: str, path: str, dtype: str, *, prefill: list[int], decode: int, threads: int,
            logits_out: str | None = None) -> dict[str, Any]:
    """One engine (``atlas`` or ``transformers``) on one checkpoint, in a fresh process."""
    return _run_worker({"job": "measure", "engine": engine, "path": path, "dtype": dtype, "prefill": prefill,
                        "decode": decode, "threads": threads, "logits_out": logits_out}, threads=threads)


def compare_logits(a: str, b: str) -> float:
    """Relative difference (max abs over max abs) of two saved logits tensors."""
    x, y = torch.load(a), torch.load(b)
    return float((x - y).abs().max() / y.abs().max())


def merge_rounds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from an engine's rounds: each speed (``*_tok_s``) the median of its rounds, with every
    round's value kept (``*_tok_s_rounds``); peak memory the largest; the rest from the first."""
    import statistics

    row = dict(runs[0])
    for key in runs[0]:
        values = [r[key] for r in runs if isinstance(r.get(key), (int, float)) and r.get(key)]
        if key.endswith("_tok_s") and values:
            row[key] = statistics.median(values)
            row[f"{key}_rounds"] = values
        elif key.endswith("rss_gib") and values:
            row[key] = max(values)
    return row


def run(configs: list[str], dtypes: list[str], *, prefill: list[int], decode: int, threads: int,
        engines: list[str], llama_bench: str | None = None, cache: Path = CACHE,
        log: Callable[[str], None] = print, rounds: int = 1) -> dict[str, Any]:
    """Every configuration x dtype x engine; a dict ``{"machine", "rows", "equivalence"}``. With
    ``rounds`` > 1 the engines of a configuration and dtype take turns that many times (this
    host's speed drifts by a fifth from one minute to the next), each row the median
    (`merge_rounds`)."""
    import tempfile

    rows, checks = [], []
    bw = bandwidth_gbs()
    log(f"read bandwidth now: {bw:.1f} GB/s (sum of 1 GiB, best of 5)")
    for name in configs:
        cfg = CONFIGS[name]
        paths = prepare(cfg, cache, log)
        with tempfile.TemporaryDirectory() as tmp:
            for dtype in dtypes:
                taken: dict[str, list[dict[str, Any]]] = {}
                for turn in range(rounds):
                    for engine in engines:
                        if engine == "transformers" and "hf" not in paths:
                            continue
                        if engine == "llama.cpp":
                            if llama_bench is None or "hf" not in paths:
                                continue
                            log(f"{name} {dtype} llama.cpp: measuring (round {turn + 1} of {rounds})")
                            one = _llama(llama_bench, paths["hf"], dtype, prefill, decode, threads, cache / name)
                        else:
                            src = paths["hf"] if engine == "transformers" else paths["atlas"]
                            keep = f"{tmp}/{engine}-{dtype}.pt" if dtype == "float32" and turn == 0 else None
                            log(f"{name} {dtype} {engine}: measuring (prefill {prefill}, decode {decode} tokens; "
                                f"round {turn + 1} of {rounds})")
                            one = measure(engine, src, dtype, prefill=prefill, decode=decode, threads=threads,
                                          logits_out=keep)
                        taken.setdefault(engine, []).append(one)
                for engine, runs in taken.items():
                    row = merge_rounds(runs)
                    row.update(config=name, dtype=dtype, engine=engine, rounds=len(runs))
                    if engine == "llama.cpp":  # the same weights: the bytes a token reads as atlas counts them
                        same = [r for r in rows if r["config"] == name and r["dtype"] == dtype
                                and r.get("weight_bytes_per_token")]
                        if same:
                            row["weight_bytes_per_token"] = same[0]["weight_bytes_per_token"]
                    if row.get("decode_tok_s") and row.get("weight_bytes_per_token"):
                        row["decode_gbs"] = row["decode_tok_s"] * row["weight_bytes_per_token"] / 1e9
                    rows.append(row)
                    log(_line(row))
            if "transformers" in engines and "hf" in paths and "float32" in dtypes:
                diff = compare_logits(f"{tmp}/atlas-float32.pt", f"{tmp}/transformers-float32.pt")
                checks.append({"config": name, "logits_rel_diff": diff, "ok": diff < 1e-3})
                log(f"{name}: atlas's float32 logits vs transformers': {diff:.2e} relative")
    bad = {c["config"] for c in checks if not c["ok"]}
    for row in rows:
        row["equivalent"] = row["config"] not in bad
    bw_end = bandwidth_gbs()
    log(f"read bandwidth at the end: {bw_end:.1f} GB/s")
    return {"machine": {"read_gbs": bw, "read_gbs_end": bw_end, "threads": threads, "torch": torch.__version__,
                        "cpu": cpu_name()}, "rows": rows, "equivalence": checks}


def _llama(binary: str, hf_dir: str, dtype: str, prefill: list[int], decode: int, threads: int,
           cache: Path) -> dict[str, Any]:
    """llama.cpp's llama-bench on the same weights (benchmarks/llama_cpp.py converts them to GGUF)."""
    root = Path(__file__).resolve().parents[2] / "benchmarks"
    sys.path.insert(0, str(root))
    try:
        import llama_cpp as peer  # benchmarks/llama_cpp.py
    finally:
        sys.path.remove(str(root))
    short = {"float32": "f32", "bfloat16": "bf16"}[dtype]
    gguf = cache / f"model-{short}.gguf"
    if not gguf.is_file():
        peer.to_gguf(hf_dir, gguf, short)
    out: dict[str, Any] = {}
    for n in prefill:
        r = peer.run_llama_bench(binary, gguf, threads=threads, prompt=n, gen=decode)
        out[f"prefill_{n}_tok_s"] = r["prefill_tok_s"]
        out["decode_tok_s"] = r["decode_tok_s"]
        out["llama_cpp"] = r.get("build", "")
    return out


def _line(row: dict[str, Any]) -> str:
    pre = ", ".join(f"prefill {k.split('_')[1]}: {v:.1f} tok/s" for k, v in row.items()
                    if k.startswith("prefill_") and k.endswith("_tok_s") and v)
    gbs = f" ({row['decode_gbs']:.1f} GB/s)" if row.get("decode_gbs") else ""
    rss = f", peak RSS {row['peak_rss_gib']:.2f} GiB" if row.get("peak_rss_gib") else ""
    if row.get("decode_peak_rss_gib"):
        rss += f" (decode alone {row['decode_peak_rss_gib']:.2f} GiB)"
    return (f"  {row['config']} {row['dtype']} {row['engine']}: decode {row.get('decode_tok_s', 0):.2f} "
            f"tok/s{gbs}, {pre}{rss}")


__all__ = ["CONFIGS", "Config", "bandwidth_gbs", "prepare", "measure", "run", "hide_fla"]
