"""``atlas bench inference``: decoding and prefill at published sizes, beside transformers and
llama.cpp on the same weights (`atlas_core.bench.inference`; docs/benchmarks.md, "Inference on a
CPU").

    atlas bench inference                                  # qwen3.5-0.8b, float32 and bfloat16
    atlas bench inference --configs qwen3.5-0.8b,gated-deltanet-1.3b --llama-bench build/bin/llama-bench
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from .common import FormatOption, emit, examples, log, out_console

EPILOG = examples(
    "atlas bench inference --configs qwen3.5-0.8b --dtypes float32,bfloat16",
    "atlas bench inference --configs tiny --prefill 64 --decode 8 --engines atlas,transformers",
    "atlas bench inference --llama-bench ~/.cache/atlas-bench/llama.cpp/bin/llama-bench --json inference.json",
)


def _human(data: dict[str, Any]) -> None:
    from rich.table import Table

    con = out_console()
    lengths = sorted({int(k.split("_")[1]) for r in data["rows"] for k in r if k.startswith("prefill_")})
    m = data["machine"]
    end = f" at the start, {m['read_gbs_end']:.1f} at the end" if m.get("read_gbs_end") else ""
    table = Table(title=f"{m['cpu']}, {m['threads']} threads; read bandwidth {m['read_gbs']:.1f} GB/s{end}")
    for col in ["config", "dtype", "engine", "decode tok/s", "GB/s", *[f"prefill {n} tok/s" for n in lengths],
                "decode peak RSS GiB", "peak RSS GiB", "weights GiB"]:
        table.add_column(col)
    for r in data["rows"]:
        cells = [r["config"], r["dtype"], r["engine"] + ("" if r.get("equivalent", True) else " (logits differ)"),
                 f"{r.get('decode_tok_s', 0):.2f}", f"{r['decode_gbs']:.1f}" if r.get("decode_gbs") else "",
                 *[f"{r[f'prefill_{n}_tok_s']:.1f}" if r.get(f"prefill_{n}_tok_s") else "" for n in lengths],
                 f"{r['decode_peak_rss_gib']:.2f}" if r.get("decode_peak_rss_gib") else "",
                 f"{r['peak_rss_gib']:.2f}" if r.get("peak_rss_gib") else "",
                 f"{r['weights_gib']:.2f}" if r.get("weights_gib") else ""]
        table.add_row(*cells)
    con.print(table)
    for c in data["equivalence"]:
        con.print(f"{c['config']}: atlas's float32 logits vs transformers': {c['logits_rel_diff']:.1e} relative"
                  + ("" if c["ok"] else "  NOT EQUAL: no speed of this configuration is a result"))


def inference(
    configs: Annotated[str, typer.Option(help="comma-separated: qwen3.5-0.8b, gated-deltanet-1.3b, "
                                         "deltanet-1.3b, tiny")] = "qwen3.5-0.8b",
    dtypes: Annotated[str, typer.Option(help="comma-separated: float32, bfloat16")] = "float32,bfloat16",
    engines: Annotated[str, typer.Option(help="comma-separated: atlas, transformers, llama.cpp (with "
                                         "--llama-bench)")] = "atlas,transformers,llama.cpp",
    prefill: Annotated[str, typer.Option(help="comma-separated prompt lengths to prefill")] = "2048,8192",
    decode: Annotated[int, typer.Option(min=1, help="tokens decoded (timed) per row")] = 32,
    threads: Annotated[int, typer.Option(min=1, help="threads of every engine")] = 2,
    rounds: Annotated[int, typer.Option(min=1, help="the engines take turns this many times; each row "
                                        "reports the median (every round kept in the JSON)")] = 1,
    llama_bench: Annotated[Optional[str], typer.Option(help="a llama-bench binary (benchmarks/llama_cpp.py "
                                                       "builds one): llama.cpp on the same weights")] = None,
    cache: Annotated[Optional[Path], typer.Option(help="where the random checkpoints are kept (default "
                                                  "~/.cache/atlas-bench or $ATLAS_BENCH_CACHE)")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="write the PNG plot here")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="also write the JSON here")] = None,
    fmt: FormatOption = None,
) -> None:
    """Decode and prefill tokens/s and peak resident memory at published sizes, beside transformers
    and llama.cpp on the same weights, with the machine's read bandwidth."""
    from atlas_core.bench.inference import CACHE, CONFIGS, run

    names = [c.strip() for c in configs.split(",") if c.strip()]
    bad = [c for c in names if c not in CONFIGS]
    if bad:
        raise typer.BadParameter(f"{', '.join(bad)}: choose among {', '.join(CONFIGS)}", param_hint="--configs")
    kinds = [d.strip() for d in dtypes.split(",") if d.strip()]
    if any(d not in ("float32", "bfloat16") for d in kinds):
        raise typer.BadParameter(f"{dtypes!r}: float32 and/or bfloat16", param_hint="--dtypes")
    try:
        lengths = [int(n) for n in prefill.split(",") if n.strip()]
    except ValueError:
        raise typer.BadParameter(f"{prefill!r} is not a list of integers", param_hint="--prefill") from None
    data = run(names, kinds, prefill=lengths, decode=decode, threads=threads,
               engines=[e.strip() for e in engines.split(",") if e.strip()], llama_bench=llama_bench,
               cache=cache or CACHE, log=log, rounds=rounds)
    if plot is not None:
        from atlas_core.bench.inference_plot import plot as make_plot

        plot.parent.mkdir(parents=True, exist_ok=True)
        make_plot(data, plot)
        log(f"plot written to {plot}")
    if json_out is not None:
        import json

        json_out.write_text(json.dumps(data, indent=2) + "\n")
        log(f"JSON written to {json_out}")
    emit(data, fmt, _human)


def register(group: typer.Typer) -> None:
    group.command("inference", epilog=EPILOG)(inference)
