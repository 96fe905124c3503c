"""Baseline: fla-core's pure-PyTorch chunked gated delta rule, ``naive_chunk_gated_delta_rule``.

``fla/ops/gated_delta_rule/naive.py`` of flash-linear-attention (PyPI ``fla-core``) is the
published reference of the chunked WY (UT-transform) form of Gated DeltaNet, written in plain
PyTorch: the same kind of algorithm as ``core:exact_chunk`` on the delta rule with decay, so the
benchmark times them side by side on the ``delta`` rule at the same chunk size (fwd and fwd+bwd of
``<o, dy>`` into q, k, v and the gates).

Map (as in tests/core/test_exact_chunk_fla.py): our ``M = S^T`` (fla keeps ``[Dk, Dv]``), fla's
``beta`` = our ``theta``, fla's log-decay ``g = log(alpha)``, ``scale = 1``; fla computes in float32.
The rules differ with decay: Gated DeltaNet takes the gradient at the decayed memory,
``S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t k_t v_t^T``, where this project's delta rule
with decay takes it at ``M_{t-1}``. So its check is ``external`` (timed side by side, no speedup),
after verifying the adapter where the two rules coincide: without decay (``g = 0``, our
``core:none``) its outputs equal ``core:sequential`` to float32 accuracy.

The module is loaded from its file (it imports only torch and einops), not through ``import
fla``, whose package import pulls in its Triton kernels. When fla-core is not installed,
`subjects` raises ImportError and the benchmark lists "fla-core is not installed" instead.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from atlas_core.bench import Check, Subject
from atlas_core.bench.cases import Case, Inputs, make_inputs

REL = "ops/gated_delta_rule/naive.py"
FLOAT32_TOL = 2e-4  # of the largest output, as in tests/core/test_exact_chunk_fla.py


def load_naive():
    """fla-core's ``gated_delta_rule/naive.py`` as a module (ImportError when it is missing)."""
    spec = importlib.util.find_spec("fla")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("fla-core is not installed (pip install --no-deps fla-core): no "
                          "naive_chunk_gated_delta_rule to time")
    path = Path(list(spec.submodule_search_locations)[0]) / REL
    if not path.is_file():
        raise ImportError(f"this fla-core has no {REL}")
    mod_spec = importlib.util.spec_from_file_location("_atlas_bench_fla_gdr_naive", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


class FlaNaiveSubject(Subject):
    group = "baseline"

    def __init__(self, module, chunk_size: int = 64) -> None:
        self.module = module
        self.chunk_size = chunk_size
        self.name = f"fla naive_chunk_gated_delta_rule(C={chunk_size})"

    def supports(self, case: Case) -> tuple[bool, str]:
        if case.name != "delta":
            return False, "the delta rule with decay (fla's gated delta rule) only"
        return True, ""

    def setup(self, case: Case, sizes: dict[str, int], dtype: torch.dtype):
        # gate names of the case's rule (alpha, theta), for the inputs the runner draws
        return _Ctx(case.rule(sizes["H"], sizes["Dk"], sizes["Dv"], dtype).gate_names)

    def _run(self, q, k, v, log_alpha, beta):
        o, _ = self.module.naive_chunk_gated_delta_rule(
            q, k, v, log_alpha, beta, chunk_size=self.chunk_size, scale=1.0)
        return o

    def forward(self, ctx, inp: Inputs) -> torch.Tensor:
        return self._run(inp.q, inp.k, inp.v, inp.gates["alpha"].log(), inp.gates["theta"])

    def parameters(self, ctx) -> list[torch.Tensor]:
        return []

    def check(self, case: Case) -> Check:
        import atlas_core as ac

        try:
            B, H, D, T = 1, 2, 8, 2 * self.chunk_size + 5
            rule = ac.build_rule({"structure": "core:linear", "bias": "core:l2", "retention": "core:none",
                                  "algorithm": "core:gd"}, heads=H, d_key=D, d_value=D).double()
            inp = make_inputs(case, ("alpha", "theta"), B=B, T=T, H=H, Dk=D, Dv=D, dtype=torch.float64, seed=1)
            with torch.no_grad():
                y, _ = rule(inp.q, inp.k, inp.v, gates={"theta": inp.gates["theta"]}, strategy="core:sequential")
                f32 = lambda x: x.float()  # noqa: E731
                o = self._run(f32(inp.q), f32(inp.k), f32(inp.v), torch.zeros(B, T, H), f32(inp.gates["theta"]))
            err = (o.double() - y).abs().max().item() / max(y.abs().max().item(), 1e-30)
            if not err <= FLOAT32_TOL:
                return Check("FAILED", f"the adapter is wrong: without decay fla's chunked delta rule differs "
                             f"from core:sequential by {err:.2e} (relative, float32; T={T})", err)
            return Check("external", "another transition with decay (the gradient at the decayed memory): "
                         f"timed side by side, not compared; without decay it equals core:sequential "
                         f"({err:.1e} relative, float32, T={T})", err)
        except Exception as exc:  # noqa: BLE001
            return Check("error", f"{type(exc).__name__}: {exc}")


class _Ctx:
    def __init__(self, gate_names) -> None:
        self.gate_names = tuple(gate_names)


def subjects(config=None) -> list[Subject]:
    module = load_naive()  # ImportError: the benchmark reports it
    chunk = getattr(config, "chunk", 64) if config is not None else 64
    return [FlaNaiveSubject(module, chunk)]
