"""Settings of the conformance kit: the device and the comparison dtype.

Kept free of torch so that the pytest plugin can set them at start-up without importing torch.
The pytest options ``--atlas-device`` and ``--atlas-dtype`` (and `atlas check --device/--dtype`)
write here; the checks read here.

- ``device``: where every tensor of a check lives (``"cpu"`` by default, ``"cuda"`` on a GPU).
- ``dtype``: the dtype of the equivalence and causality checks, ``"float64"`` (default: tight
  tolerances) or ``"float32"`` (looser tolerances, for kernels that only run in float32).
  `check_gradcheck_float64` is always float64 and `check_bf16_close_to_fp32` always compares
  bfloat16 against float32, whatever this says.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("float64", "float32")

# Tolerances per comparison dtype: (chunk size 1 against core:sequential, larger chunks against
# core:sequential (another summation order), gradients, causality).
TOLERANCES = {
    "float64": {"exact": 1e-10, "chunked": 1e-9, "grad": 1e-8, "causal": 1e-12},
    "float32": {"exact": 1e-5, "chunked": 1e-4, "grad": 1e-3, "causal": 1e-6},
}


@dataclass
class KitConfig:
    device: str = "cpu"
    dtype: str = "float64"

    def tolerance(self, which: str) -> float:
        return TOLERANCES[self.dtype][which]


CONFIG = KitConfig()


def configure(device: str | None = None, dtype: str | None = None) -> KitConfig:
    """Set the kit's device and comparison dtype (None leaves a setting as it is)."""
    if dtype is not None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r} is not supported by the kit; use one of {', '.join(DTYPES)}")
        CONFIG.dtype = dtype
    if device is not None:
        if not isinstance(device, str) or not device:
            raise ValueError(f"device={device!r} must be a device string such as 'cpu' or 'cuda'")
        CONFIG.device = device
    return CONFIG
