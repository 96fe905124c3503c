"""Where a decoded token's time goes: the weight products (bytes read, GB/s) against the rest.

    python benchmarks/decode_profile.py RUN_OR_CHECKPOINT [--dtype bfloat16] [--tokens 16] [--threads 2]

Loads the model as `atlas generate` does, prefills a 16-token prompt, then times ``--tokens``
decode steps of `atlas_core.decode.Decoder` with every weight product (`decode.fused.matvec`)
timed on its own, and each block kind's step (memory, attention, MLP) in all. Prints, per token:
the total, the products' share with the bytes they read and the rate they read them at, each
block kind's time outside its products, and the machine's read bandwidth (the sum of 1 GiB)
measured in the same process.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from atlas_core.decode import Decoder, blocks, engine, fused
from atlas_core.decode.load import load_for_inference
from atlas_core.decode.norm import argmax


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", help="a run or checkpoint directory (atlas import's output included)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    model = load_for_inference(a.path, dtype=getattr(torch, a.dtype))
    acc: dict[str, float] = defaultdict(float)
    inner = fused.matvec

    def timed_matvec(W, x, b=None, dtype=None):
        t = time.perf_counter()
        y = inner(W, x, b, dtype)
        acc["products_s"] += time.perf_counter() - t
        acc["bytes"] += W.numel() * W.element_size()
        acc["calls"] += 1
        return y

    for mod in (blocks, engine, fused):  # the names each module calls
        mod.matvec = timed_matvec

    def wrap(cls, name):
        call = cls.__call__

        def timed(self, *args, **kwargs):
            t = time.perf_counter()
            y = call(self, *args, **kwargs)
            acc[name] += time.perf_counter() - t
            return y

        cls.__call__ = timed

    for cls, name in ((blocks.MemoryStep, "memory"), (blocks.GenericMemoryStep, "memory (generic)"),
                      (blocks.AttentionStep, "attention"), (blocks.MlpStep, "mlp")):
        wrap(cls, name)
    dec = Decoder(model, max_len=64 + a.tokens)
    nxt = argmax(dec.prefill([torch.arange(16) % model.vocab_size]))
    for _ in range(3):
        nxt = argmax(dec.step(nxt))
    acc.clear()
    t = time.perf_counter()
    for _ in range(a.tokens):
        nxt = argmax(dec.step(nxt))
    total = (time.perf_counter() - t) / a.tokens
    big = torch.ones(1 << 28)
    big.sum()
    t = time.perf_counter()
    for _ in range(3):
        big.sum()
    bw = 3 * big.numel() * 4 / (time.perf_counter() - t) / 1e9
    n = a.tokens
    prod = acc["products_s"] / n
    print(f"{a.dtype}, {torch.get_num_threads()} threads: {1 / total:.2f} tok/s, {total * 1e3:.1f} ms a token")
    print(f"  weight products: {prod * 1e3:.1f} ms ({prod / total:.0%}), {int(acc['calls'] / n)} calls, "
          f"{acc['bytes'] / n / 1e9:.2f} GB read at {acc['bytes'] / acc['products_s'] / 1e9:.1f} GB/s")
    print(f"  everything else: {(total - prod) * 1e3:.1f} ms; the block steps in all (products included):")
    for name in ("memory", "memory (generic)", "attention", "mlp"):
        if acc.get(name):
            print(f"    {name:17s} {acc[name] / n * 1e3:6.1f} ms")
    print(f"  read bandwidth now (sum of 1 GiB): {bw:.1f} GB/s; the products read at "
          f"{acc['bytes'] / acc['products_s'] / 1e9 / bw:.0%} of it")


if __name__ == "__main__":
    main()
