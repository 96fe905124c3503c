"""The benchmark library behind ``atlas bench`` and ``benchmarks/bench_strategies.py``.

Time (forward, forward + backward) and peak memory against sequence length for each rule and each
strategy that supports it, side by side in one run, with baselines (``benchmarks/baselines/``)
in the same table, and the decoding cost of a built model. Before timing, each subject passes a
float64 equivalence check against ``core:sequential`` on the rule it runs; a subject that fails it
gets no speedup. Modules:

- `cases`: the benchmarked rules and their inputs;
- `subjects`: strategies, layers, baselines, and the equivalence gate;
- `device`: the device (``cpu``, ``cuda``, ``auto``) and the clock of every timed region
  (synchronised on a GPU);
- `memory`: peak memory: CUDA's allocator counter on a GPU, live tensor bytes on the CPU;
- `runner`: `BenchConfig`, `run_bench`;
- `report`: the targets, tables (text, Markdown), the PNG plot.
"""

from .cases import RULES, Case, get_case
from .device import clock, resolve_device
from .memory import LiveTensorBytes, peak_bytes, peak_tensor_bytes
from .report import plot, targets, to_markdown, to_text
from .runner import BenchConfig, BenchResult, Row, run_bench
from .subjects import (
    Check,
    DecodeSubject,
    LayerSubject,
    StrategySubject,
    Subject,
    check_against_rule,
    default_baselines_dir,
    load_baselines,
)

__all__ = [
    "RULES", "Case", "get_case", "clock", "resolve_device", "LiveTensorBytes", "peak_bytes",
    "peak_tensor_bytes", "plot", "targets",
    "to_markdown", "to_text", "BenchConfig", "BenchResult", "Row", "run_bench",
    "Check", "DecodeSubject", "LayerSubject", "StrategySubject", "Subject",
    "check_against_rule", "default_baselines_dir", "load_baselines",
]
