"""The figure of `atlas bench inference`: decode and prefill tokens/s per configuration and dtype,
one bar per engine, the machine's read bandwidth in the title."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ENGINES = ("atlas", "transformers", "llama.cpp")


def plot(data: dict[str, Any], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["rows"]
    groups = list(dict.fromkeys((r["config"], r["dtype"]) for r in rows))
    lengths = sorted({int(k.split("_")[1]) for r in rows for k in r if k.startswith("prefill_")})
    panels = [("decode_tok_s", "decode, tokens/s")] + [(f"prefill_{n}_tok_s", f"prefill {n}, tokens/s")
                                                       for n in lengths[:1]]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), squeeze=False)
    width = 0.8 / len(ENGINES)
    for ax, (key, title) in zip(axes[0], panels):
        for j, engine in enumerate(ENGINES):
            xs, ys = [], []
            for i, g in enumerate(groups):
                r = next((r for r in rows if (r["config"], r["dtype"]) == g and r["engine"] == engine), None)
                if r is not None and r.get(key):
                    xs.append(i + (j - 1) * width)
                    ys.append(r[key])
            if xs:
                ax.bar(xs, ys, width, label=engine)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{c}\n{d}" for c, d in groups], fontsize=8)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    m = data["machine"]
    fig.suptitle(f"{m['cpu']}, {m['threads']} threads, read bandwidth {m['read_gbs']:.1f} GB/s", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
