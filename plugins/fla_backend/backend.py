"""The ``fla:*`` backends: flash-linear-attention's chunk ops as backends of ``core:exact_chunk``
and ``core:chunkwise``, one backend per op (`mapping.OPS`).

- **available** (`is_available`): fla's ops import and a CUDA device is present (or the tests'
  CPU stand-in is active, `availability.cpu_stand_in`);
- **certified** (`certified`, read when backends are bound; `prefers`, per call, for the device the
  call's tensors are on): a certificate for this backend on this device with the installed fla,
  atlas and Triton (`certificates`), written by `atlas fla certify` after the conformance kit
  passed there. Without one, ``"auto"`` runs the strategy's PyTorch code and `atlas env` says
  why; ``ATLAS_BACKEND=fla:<op>`` (or ``backend = "fla:<op>"`` of core:chunkwise) runs it anyway;
- **per call** (`verify`): the rule is one this op computes (`mapping.op_for`, from the rule's
  declared form), the sequence is not empty, head dims fla takes, float32 compute tensors from
  float32 / bfloat16 / float16 inputs (float64 runs on PyTorch), one CUDA device.

`run` maps the call onto the op (`mapping.run_op`) and counts it in `SERVED` (what `atlas fla
certify` reads to tell a kit check that ran the backend from one that never reached it).
"""

from __future__ import annotations

from collections import Counter

import torch

from atlas_core.backends import Backend

from . import certificates
from .availability import available, device_name, stand_in, tensors_runnable
from .mapping import MAX_KEY_DIM, MIN_HEAD_DIM, OPS, op_for, run_op

#: calls each backend served in this process (backend name -> count)
SERVED: Counter = Counter()
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class FlaBackend(Backend):
    def __init__(self, op: str) -> None:
        if op not in OPS:
            raise ValueError(f"unknown fla op {op!r}; known: {', '.join(OPS)}")
        self.op = op
        self.name = f"fla:{op}"
        self._prefers: dict[tuple, tuple[bool, str]] = {}

    def is_available(self) -> tuple[bool, str]:
        return available()

    def _certificate(self, device=None) -> tuple[bool, str]:
        dev = device_name(device)
        rec, why = certificates.find(self.name, dev)
        if rec is not None:
            return True, ""
        return False, (f"{why}; `atlas fla certify {self.name}` runs the conformance kit on this "
                       f"device and records it, ATLAS_BACKEND={self.name} forces it")

    def certified(self) -> tuple[bool, str]:
        return self._certificate()

    def verify(self, strategy, rule, inputs) -> tuple[bool, str]:
        p = inputs
        op, why = op_for(rule.form)
        if op is None:
            return False, why
        if op != self.op:
            return False, f"fla's {OPS[op][1]} computes this rule (backend fla:{op}), not {OPS[self.op][1]}"
        B, H, T = p.shape
        if T == 0:
            return False, "the sequence is empty"
        dk, dv = p.psi.shape[-1], p.v.shape[-1]
        if dk > MAX_KEY_DIM:
            return False, f"key dim Dk={dk} exceeds {MAX_KEY_DIM} (fla 0.6.0 asserts K <= {MAX_KEY_DIM})"
        if min(dk, dv) < MIN_HEAD_DIM:
            return False, (f"head dims Dk={dk}, Dv={dv}: below {MIN_HEAD_DIM}, some of fla's kernels tile "
                           "a head dim narrower than tl.dot's smallest tile")
        if p.out_dtype not in INPUT_DTYPES:
            return False, (f"inputs of dtype {p.out_dtype}: fla's kernels take float32, bfloat16 and "
                           "float16 (core's PyTorch code runs the rest)")
        tensors = [p.psi, p.phik, p.v, p.alpha, p.gamma, *p.gates.values(), *p.state.values()]
        for x in tensors:
            if x.dtype != torch.float32:
                return False, (f"a tensor of dtype {x.dtype}: fla's kernels take float32, bfloat16 and "
                               "float16 (core's PyTorch code runs the rest)")
        return tensors_runnable(*tensors)

    def prefers(self, strategy, rule, inputs) -> tuple[bool, str]:
        """Automatic dispatch: only on a device this backend is certified on (the call's own, which
        may differ from the one current when the backends were bound)."""
        dev = inputs.psi.device
        k = (str(dev), stand_in(), str(certificates.path()), certificates.generation())
        if k not in self._prefers:
            self._prefers[k] = self._certificate(dev)
        return self._prefers[k]

    def run(self, strategy, rule, inputs):
        from atlas_plugins.cuda_backend.availability import launch_errors, launch_fallback

        try:
            y, M = run_op(self.op, rule, inputs)
        except launch_errors() as exc:  # a Triton launch that fails on this device
            if strategy.bound_backends() is False:  # called by hand, not by a dispatching strategy
                raise
            return launch_fallback(self.name, strategy, exc, lambda: _torch_run(strategy, rule, inputs))
        SERVED[self.name] += 1
        return y, rule.final_state({"M": M}, {}, *rule.extended_inputs(inputs))


def _torch_run(strategy, rule, inputs):
    run_torch = getattr(strategy, "run_torch", None)
    return run_torch(rule, inputs) if run_torch is not None else strategy.run(rule, inputs)


_INSTANCES: dict[str, FlaBackend] = {}


def _build(op: str):
    def build(params, ctx) -> FlaBackend:
        if op not in _INSTANCES:
            _INSTANCES[op] = FlaBackend(op)
        return _INSTANCES[op]

    build.__name__ = f"build_{op}"
    return build


build_delta_rule = _build("delta_rule")
build_gated_delta_rule = _build("gated_delta_rule")
build_kda = _build("kda")
build_gla = _build("gla")
build_simple_gla = _build("simple_gla")
