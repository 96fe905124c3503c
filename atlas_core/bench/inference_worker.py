"""One measurement of `atlas_core.bench.inference`, in its own process (``python -m
atlas_core.bench.inference_worker`` with a JSON job on stdin, one JSON line out), so that its
peak resident memory (``ru_maxrss``) is its own.

Jobs: ``make_hf`` (transformers' Qwen3.5 with random weights, saved), ``make_fla_shape`` (an fla
family's default shape as atlas maps it, random weights, saved as an atlas run), ``measure``
(``engine`` atlas or transformers: load in ``dtype``, decode ``decode`` tokens after a 16-token
prompt (``decode_peak_rss_gib``: the peak so far), then prefill each length (``peak_rss_gib``).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _status(key: str) -> float:
    """A ``/proc/self/status`` figure in GiB (0 where there is none)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return 0.0


def _rss_gib() -> float:
    return _status("VmRSS")


def _peak_gib() -> float:
    """This process's peak resident memory: ``VmHWM`` (``ru_maxrss`` keeps the parent's peak across
    the exec that started this process), else ``ru_maxrss``."""
    return _status("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)


def make_hf(job: dict[str, Any]) -> dict[str, Any]:
    from .inference import hide_fla

    hide_fla()
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Qwen3_5TextConfig(**job["config"])
    model = transformers.Qwen3_5ForCausalLM(cfg)
    model.save_pretrained(job["out"], max_shard_size="2GB")
    return {"parameters": sum(p.numel() for p in model.parameters())}


def make_fla_shape(job: dict[str, Any]) -> dict[str, Any]:
    from ..fla_import.mapping import family_for, spec_for
    from ..model import build_model
    from ..spec import load_spec
    from ..train.checkpoint import save_checkpoint
    from ..train.checkpoint_meta import CheckpointMeta

    cfg = {"model_type": job["family"], **job["config"]}
    fam = family_for(cfg)
    raw = spec_for(cfg, fam, job["name"])
    raw["memory"]["parallel"] = "auto"
    spec = load_spec(raw)
    torch.manual_seed(0)
    model = build_model(spec)
    save_checkpoint(job["out"], 0, model=model, spec=spec, optimizer_state=({}, {}), rng={},
                    meta=CheckpointMeta(extra={"made_by": "atlas bench inference: random weights, seed 0"}))
    return {"parameters": sum(p.numel() for p in model.parameters())}


def _weight_bytes(model: torch.nn.Module, tied: bool, embed: torch.Tensor) -> int:
    """The bytes a decoded token reads: every parameter once (an untied input embedding: one row)."""
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
    if not tied:
        total -= embed.numel() * embed.element_size() - embed.shape[1] * embed.element_size()
    return total


def measure_atlas(job: dict[str, Any]) -> dict[str, Any]:
    from ..decode import Decoder
    from ..decode.load import load_for_inference
    from ..decode.norm import argmax

    dtype = DTYPES[job["dtype"]]
    before = _rss_gib()
    t = time.perf_counter()
    model = load_for_inference(job["path"], dtype=dtype)
    out: dict[str, Any] = {"load_s": time.perf_counter() - t, "rss_after_load_gib": _rss_gib() - before}
    tied = model.head.weight is model.embed.weight
    out["weight_bytes_per_token"] = _weight_bytes(model, tied, model.embed.weight)
    vocab = model.vocab_size
    gen = torch.Generator().manual_seed(0)
    if job.get("logits_out"):
        ids = torch.randint(0, vocab, (32,), generator=gen)
        dec = Decoder(model, max_len=64)
        torch.save(dec.prefill([ids])[0].float(), job["logits_out"])
    dec = Decoder(model, max_len=64 + job["decode"])
    logits = dec.prefill([torch.randint(0, vocab, (16,), generator=gen)])
    nxt = argmax(logits)  # greedy, as `atlas_core.decode.generate` chooses
    for _ in range(2):  # warm-up
        nxt = argmax(dec.step(nxt))
    t = time.perf_counter()
    for _ in range(job["decode"]):
        nxt = argmax(dec.step(nxt))
    out["decode_tok_s"] = job["decode"] / (time.perf_counter() - t)
    out["decode_peak_rss_gib"] = _peak_gib()  # before any long prefill: what a decode needs
    del dec
    for n in job["prefill"]:
        ids = torch.randint(0, vocab, (n,), generator=gen)
        dec = Decoder(model, max_len=n + 8)
        t = time.perf_counter()
        dec.prefill([ids])
        out[f"prefill_{n}_tok_s"] = n / (time.perf_counter() - t)
        del dec
    out["peak_rss_gib"] = _peak_gib()
    out["weights_gib"] = out["weight_bytes_per_token"] / (1 << 30)
    return out


def measure_transformers(job: dict[str, Any]) -> dict[str, Any]:
    from .inference import hide_fla

    hide_fla()
    import transformers

    dtype = DTYPES[job["dtype"]]
    before = _rss_gib()
    t = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(job["path"], dtype=dtype).eval()
    out: dict[str, Any] = {"load_s": time.perf_counter() - t, "rss_after_load_gib": _rss_gib() - before}
    emb = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight is emb
    out["weight_bytes_per_token"] = _weight_bytes(model, tied, emb)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        if job.get("logits_out"):
            ids = torch.randint(0, vocab, (1, 32), generator=gen)
            torch.save(model(ids).logits[0, -1].float(), job["logits_out"])
        prompt = torch.randint(0, vocab, (1, 16), generator=gen)
        greedy = dict(do_sample=False, pad_token_id=0)
        model.generate(prompt, max_new_tokens=3, min_new_tokens=3, **greedy)  # warm-up
        t = time.perf_counter()
        model.generate(prompt, max_new_tokens=1, min_new_tokens=1, **greedy)
        first = time.perf_counter() - t
        n = job["decode"]
        t = time.perf_counter()
        model.generate(prompt, max_new_tokens=n + 1, min_new_tokens=n + 1, **greedy)
        out["decode_tok_s"] = n / (time.perf_counter() - t - first)
        out["decode_peak_rss_gib"] = _peak_gib()
        for n in job["prefill"]:
            ids = torch.randint(0, vocab, (1, n), generator=gen)
            t = time.perf_counter()
            model(ids, logits_to_keep=1)
            out[f"prefill_{n}_tok_s"] = n / (time.perf_counter() - t)
    out["peak_rss_gib"] = _peak_gib()
    out["weights_gib"] = out["weight_bytes_per_token"] / (1 << 30)
    return out


def main() -> None:
    job = json.loads(sys.stdin.read())
    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    kind = job["job"]
    if kind == "make_hf":
        result = make_hf(job)
    elif kind == "make_fla_shape":
        result = make_fla_shape(job)
    elif job["engine"] == "atlas":
        result = measure_atlas(job)
    else:
        result = measure_transformers(job)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
