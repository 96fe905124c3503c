"""Settings of the conformance kit: the device and the comparison dtype.

Kept free of torch so that the pytest plugin can set them at start-up without importing torch.
The pytest options ``--atlas-device`` and ``--atlas-dtype`` (and `atlas check --device/--dtype`)
write here; the checks read here.

- ``device``: where every tensor of a check lives (``"cpu"`` by default, ``"cuda"`` on a GPU).
- ``dtype``: the dtype of the equivalence and causality checks, ``"float64"`` (default: tight
  tolerances) or ``"float32"`` (looser tolerances, for kernels that only run in float32).
  `check_gradcheck_float64` is always float64 and `check_bf16_close_to_fp32` always compares
  bfloat16 against float32, whatever this says.
- ``strategies``: the strategies a rule or knob is compared with ``core:sequential`` under. None
  (default): the bundled strategies only; a third-party strategy is certified by its own
  package's checks (a `Case` naming it), so a broken one never fails another component. A tuple
  of strategy names or namespaces runs exactly those (``atlas check --strategy``, pytest's
  ``--atlas-strategies``, or the environment variable ``ATLAS_CHECK_STRATEGIES``, all
  comma-separated or repeated).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DTYPES = ("float64", "float32")

# Tolerances per comparison dtype: (chunk size 1 against core:sequential, larger chunks against
# core:sequential (another summation order), gradients, causality).
TOLERANCES = {
    "float64": {"exact": 1e-10, "chunked": 1e-9, "grad": 1e-8, "causal": 1e-12},
    "float32": {"exact": 1e-5, "chunked": 1e-4, "grad": 1e-3, "causal": 1e-6},
}


STRATEGIES_ENV = "ATLAS_CHECK_STRATEGIES"


def _env_strategies() -> tuple[str, ...] | None:
    names = tuple(s.strip() for s in os.environ.get(STRATEGIES_ENV, "").split(",") if s.strip())
    return names or None


@dataclass
class KitConfig:
    device: str = "cpu"
    dtype: str = "float64"
    strategies: tuple[str, ...] | None = None

    def chosen_strategies(self) -> tuple[str, ...] | None:
        """The strategies chosen by `configure` or else by `STRATEGIES_ENV` (None: the bundled)."""
        return self.strategies if self.strategies is not None else _env_strategies()

    def tolerance(self, which: str) -> float:
        return TOLERANCES[self.dtype][which]


CONFIG = KitConfig()


def configure(device: str | None = None, dtype: str | None = None,
              strategies: str | list[str] | tuple[str, ...] | None = None) -> KitConfig:
    """Set the kit's device, comparison dtype and compared strategies (None leaves a setting as
    it is; ``strategies``: names or namespaces, a list or one comma-separated string, ``()`` for
    the bundled ones again)."""
    if dtype is not None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r} is not supported by the kit; use one of {', '.join(DTYPES)}")
        CONFIG.dtype = dtype
    if device is not None:
        if not isinstance(device, str) or not device:
            raise ValueError(f"device={device!r} must be a device string such as 'cpu' or 'cuda'")
        CONFIG.device = device
    if strategies is not None:
        if isinstance(strategies, str):
            strategies = strategies.split(",")
        names = tuple(s.strip() for s in strategies if isinstance(s, str) and s.strip())
        if len(names) != len(tuple(strategies)):
            raise ValueError(f"strategies={strategies!r} must be strategy names or namespaces, e.g. "
                             "'core:chunkwise' or 'acme'")
        CONFIG.strategies = names or None
    return CONFIG
