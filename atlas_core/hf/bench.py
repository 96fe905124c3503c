"""Decoding speed of Hugging Face ``generate`` against the native ``MemoryLM.generate``.

    python -m atlas_core.hf.bench [SPEC ...] [--new-tokens 128] [--prompt 16] [--repeats 3]

Per spec (default: examples/titans_lmm.toml, titans_mag.toml, mru_lm.toml), greedy decoding of
one prompt on the CPU with one thread: the best CPU time of ``repeats`` runs for each loop, and a
check that both produced the same tokens. Prints one line per spec.
"""

from __future__ import annotations

import argparse
import time

DEFAULT = ["examples/titans_lmm.toml", "examples/titans_mag.toml", "examples/mru_lm.toml"]


def _best(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.process_time()
        out = fn()
        best = min(best, time.process_time() - start)
    return best, out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("specs", nargs="*", default=DEFAULT)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    import torch

    from atlas_core.model import build_model

    from .config import AtlasConfig
    from .modeling import AtlasForCausalLM

    torch.set_num_threads(1)
    torch.manual_seed(0)
    n = args.new_tokens
    for path in args.specs:
        native = build_model(path).eval()
        hf = AtlasForCausalLM(AtlasConfig.from_spec(native.spec), native=native).eval()
        prompt = torch.randint(0, native.vocab_size, (1, args.prompt))
        native.generate(prompt, 4, greedy=True)  # warm-up
        hf.generate(prompt, max_new_tokens=4, do_sample=False)
        t_native, a = _best(lambda: native.generate(prompt, n, greedy=True), args.repeats)
        t_hf, b = _best(lambda: hf.generate(prompt, max_new_tokens=n, do_sample=False), args.repeats)
        same = "same tokens" if torch.equal(a, b) else "TOKENS DIFFER"
        print(f"{path}: native {n / t_native:.0f} tokens/s, HF {n / t_hf:.0f} tokens/s ({same})")


if __name__ == "__main__":
    main()
