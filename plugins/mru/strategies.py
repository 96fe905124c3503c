"""The MRU's parallel-scan strategies: ``mru:hillis_steele``, ``mru:brent_kung``, ``mru:sklansky``.

Each runs the ``mru:mru`` rule (``H_t = H_{t-1} X_t``, ``X: [B, T, H, d, d]``) as an inclusive
prefix scan under matrix multiplication, with a custom ``torch.autograd.Function`` whose backward is
the closed form of seed 002 (``dL/dX_i = H_{i-1}^T B_i``, B by a reverse scan with the same
algorithm). They support only MRU rules: for anything else ``supports`` answers (False, reason), so
``"auto"`` dispatch passes them over for composed memory rules.

Costs for T tokens of d x d matrices (seed 002; `scans.count_steps` measures them):

    strategy          sequential steps      matrix products
    core:sequential   T                     T
    mru:hillis_steele ceil(log2 T)          ~T log2 T
    mru:sklansky      ceil(log2 T)          ~T/2 log2 T
    mru:brent_kung    <= 2 log2 T           < 2T
"""

from __future__ import annotations

from atlas_core.strategies.base import Strategy

from .rule import MRURule

SUMMARIES = {
    "hillis_steele": "MRU product scan, Hillis-Steele: ceil(log2 T) steps, T log T products",
    "brent_kung": "MRU product scan, Brent-Kung: 2 log2 T steps, < 2T products (work-efficient)",
    "sklansky": "MRU product scan, Sklansky: ceil(log2 T) steps, T/2 log T products",
}


class MRUScan(Strategy):
    """Runs an `MRURule` with one of the scan algorithms of `scans.py`."""

    def __init__(self, algorithm: str) -> None:
        if algorithm not in SUMMARIES:
            raise ValueError(f"unknown MRU scan {algorithm!r}; choose one of {', '.join(SUMMARIES)}")
        self.algorithm = algorithm
        self.name = f"mru:{algorithm}"

    def supports(self, rule) -> tuple[bool, str]:
        if not isinstance(rule, MRURule):
            what = getattr(rule, "spec", None) or type(rule).__name__
            return False, (
                f"{self.name} computes cumulative matrix products and runs only the mru:mru rule; "
                f"got {what!r}"
            )
        return True, ""

    uses_backends = True

    def run(self, rule: MRURule, inputs):
        backend = self.bound_backends().select(self, rule, inputs)
        if backend is not None:
            return backend.run(self, rule, inputs)
        return rule.scan(inputs, self.algorithm)


def build_hillis_steele(params, ctx) -> MRUScan:
    return MRUScan("hillis_steele")


def build_brent_kung(params, ctx) -> MRUScan:
    return MRUScan("brent_kung")


def build_sklansky(params, ctx) -> MRUScan:
    return MRUScan("sklansky")
