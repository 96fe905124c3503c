"""The ``cuda:chunk_linear`` backend's contract: availability, the per-call verifier's refusals
(the kernel anchors each chunk at its start, so it serves rules whose anchor is the chunk size on
whole anchor blocks, and per-token dot rules), forcing (an error naming the backend and the
reason), disabling, backends bound once per strategy, a whole model on the kernel equal to PyTorch
(decoding included), and the PyTorch fallback of whole models on a machine without CUDA and
without the interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import triton  # noqa: F401 - without Triton this module must fail, not skip

import atlas_core as ac
from atlas_core.backends import explain, select_backend
from atlas_core.errors import StrategyError
from atlas_core.knobs.bias import Bias
from atlas_core.knobs.retention import Retention
from atlas_core.strategies.chunkwise import Chunkwise, ChunkwiseParams
from atlas_plugins.cuda_backend import availability
from atlas_plugins.cuda_backend.backend_chunk import ChunkLinearBackend

from .conftest import DEVICE
from .oracle import H, check_model_on_kernel, make_rule, model_run

pytestmark = pytest.mark.triton
NAME = "cuda:chunk_linear"


def _inputs(rule, T=8, d=8, dtype=torch.float32, seed=0, device=DEVICE):
    """Inputs where the kernels run (CUDA with a GPU, CPU under the interpreter)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, T, H, d, generator=g, dtype=dtype).to(device) for _ in range(3))
    gates = {n: (0.5 + 0.4 * torch.rand(1, T, H, generator=g, dtype=dtype)).to(device) for n in rule.gate_names}
    return q, k, v, gates


def _chunkwise(C=4, backend=None):
    return {"use": "core:chunkwise", "chunk_size": C, **({"backend": backend} if backend else {})}


@pytest.fixture
def no_device(monkeypatch):
    """A machine without CUDA and without the interpreter."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_triton_is_importable():
    import triton as t

    assert t.__version__


def test_entry_module_imports_neither_torch_nor_triton():
    code = ("import sys, atlas_plugins.cuda_backend.plugin; "
            "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_registered_for_chunkwise_and_available_here():
    """Available in this session: compiled on the GPU, or under the interpreter without one."""
    rows = {r["backend"]: r for r in explain("core:chunkwise")}
    assert rows[NAME]["status"] == "available", rows
    assert ChunkLinearBackend().is_available() == (True, "")


def test_unavailable_without_cuda_and_without_interpreter(no_device):
    ok, why = ChunkLinearBackend().is_available()
    assert not ok and "no CUDA device" in why
    row = {r["backend"]: r for r in explain("core:chunkwise")}[NAME]
    assert row["status"] == "unavailable" and "no CUDA device" in row["reason"]


def test_unavailable_without_triton(monkeypatch):
    real = availability.importlib.util.find_spec
    monkeypatch.setattr(availability.importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    ok, why = ChunkLinearBackend().is_available()
    assert not ok and "triton is not installed" in why


def test_auto_selects_the_kernel_for_float32_and_falls_back_for_float64():
    """gd without gradients: the case the kernel measured faster on a GPU (``speed_refusal``), so
    automatic dispatch takes it there and under the interpreter alike."""
    rule = make_rule("l2", "gd", "after", 1, d=8, anchor=4)
    strat = Chunkwise(ChunkwiseParams(chunk_size=4))
    p32 = rule.prepare(*_inputs(rule))
    assert isinstance(select_backend(strat, rule, p32), ChunkLinearBackend)
    assert isinstance(strat.bound_backends().select(strat, rule, p32), ChunkLinearBackend)
    p64 = rule.prepare(*_inputs(rule, dtype=torch.float64))
    assert select_backend(strat, rule, p64) is None  # refused: the PyTorch code runs
    assert strat.bound_backends().select(strat, rule, p64) is None


def test_auto_leaves_the_calls_measured_slower_to_pytorch_on_a_gpu():
    """On a GPU (no interpreter) momentum is left to the PyTorch code by automatic dispatch and
    still runs on the kernel when forced; under the interpreter every servable call runs on it."""
    rule = make_rule("l2", "momentum", "after", 1, d=8, anchor=4)
    strat = Chunkwise(ChunkwiseParams(chunk_size=4))
    p32 = rule.prepare(*_inputs(rule))
    picked = select_backend(strat, rule, p32)
    if availability.interpreter_on():
        assert isinstance(picked, ChunkLinearBackend)
    else:
        assert picked is None
    assert isinstance(select_backend(strat, rule, p32, requested=NAME), ChunkLinearBackend)


def test_backends_are_bound_once_per_strategy(monkeypatch):
    """A rule resolves its strategy once (``rule.runner``), which builds and probes its backends
    once; later calls only run the per-call verifier."""
    from atlas_core.host.registry import Registry

    rule = make_rule("l2", "momentum", "after", 1, d=8, anchor=4)
    strategy = _chunkwise()
    q, k, v, gates = _inputs(rule)
    rule(q, k, v, gates=gates, strategy=strategy)  # resolve and bind
    runner = rule.runner(strategy)
    builds, probes, verifies = [], [], []
    real_build = Registry.build
    monkeypatch.setattr(Registry, "build", lambda self, *a, **kw: builds.append(a) or real_build(self, *a, **kw))
    real_avail, real_verify = ChunkLinearBackend.is_available, ChunkLinearBackend.verify
    monkeypatch.setattr(ChunkLinearBackend, "is_available", lambda self: probes.append(1) or real_avail(self))
    monkeypatch.setattr(ChunkLinearBackend, "verify",
                        lambda self, *a: verifies.append(1) or real_verify(self, *a))
    for _ in range(3):
        rule(q, k, v, gates=gates, strategy=strategy)
    assert rule.runner(strategy) is runner and builds == [] and probes == []
    assert len(verifies) == 3  # the per-call verifier runs on every call


def test_disabled_by_environment(monkeypatch):
    rule = make_rule("l2", "gd", "after", 1, d=8, anchor=4)
    p = rule.prepare(*_inputs(rule))
    monkeypatch.setenv("ATLAS_DISABLE_BACKENDS", NAME)
    assert select_backend(Chunkwise(ChunkwiseParams(chunk_size=4)), rule, p) is None


def _refusal(rule, dtype=torch.float32, C=4, d=8, T=8, state=None, device=DEVICE):
    q, k, v, gates = _inputs(rule, T=T, d=d, dtype=dtype, device=device)
    p = rule.prepare(q, k, v, gates=gates, state=state)
    ok, why = ChunkLinearBackend().verify(Chunkwise(ChunkwiseParams(chunk_size=C)), rule, p)
    assert not ok and why
    return why


class Huber(Bias):
    def error(self, pred, v):
        return (pred - v).clamp(-1.0, 1.0)


class Softmaxish(Retention):
    linear = False
    gate_names = ("alpha",)

    def alpha(self, gates, like):
        return gates["alpha"]

    def post(self, W):
        return {k: w / (1 + w.abs().amax()) for k, w in W.items()}


def test_verifier_refusals_give_reasons():
    base = make_rule("l2", "gd", "after", 1, d=8, anchor=4)
    assert "float64" in _refusal(base, dtype=torch.float64)
    big = make_rule("l2", "gd", "after", 1, d=8, anchor=128)
    assert "chunk_size=128 exceeds 64" in _refusal(big, C=128, T=128)
    assert "head dims" in _refusal(make_rule("l2", "gd", "after", 1, d=256, anchor=4), d=256)
    wide = make_rule("l2", "gd", "after", 80, d=8, anchor=64)
    assert "chunk_size + window - 1 = 143 exceeds 128" in _refusal(wide, C=64, T=64)
    deep = ac.build_rule({"structure": "titans:mlp", "algorithm": "core:gd"}, heads=H, d_key=8, d_value=8)
    assert "not the linear matrix memory" in _refusal(deep)
    muon = ac.build_rule({"algorithm": "atlas_muon:muon"}, heads=H, d_key=8, d_value=8)
    assert "not gd or momentum" in _refusal(muon)
    huber = ac.ComposedRule(base.structure, Huber(), base.retention, base.algorithm, base.feature_map)
    assert "l2 and dot" in _refusal(huber)
    soft = ac.ComposedRule(base.structure, base.bias, Softmaxish(), base.algorithm, base.feature_map)
    assert "not a linear" in _refusal(soft)


def test_verifier_serves_only_the_rule_s_own_anchor_blocks():
    """The kernel takes each chunk's gradients at the chunk's start: a per-token l2 rule, or an
    anchor other than the chunk size, would be another function; a call that does not cover whole
    anchor blocks (ragged, or starting inside a block) would need the block's anchor memory."""
    per_token = make_rule("l2", "momentum", "after", 1, d=8)
    assert "anchor=1 differs from chunk_size=4" in _refusal(per_token)
    assert "anchor=8 differs from chunk_size=4" in _refusal(make_rule("l2", "gd", "after", 1, d=8, anchor=8))
    anchored = make_rule("l2", "gd", "after", 1, d=8, anchor=4)
    assert "whole anchor blocks" in _refusal(anchored, T=6)
    state = {k: v.to(DEVICE) for k, v in anchored.init_state(1).items()}
    state["anchor.pos"] = torch.full((1,), 2.0, device=DEVICE)  # two tokens into a block
    assert "whole anchor blocks" in _refusal(anchored, state=state)
    ok = ChunkLinearBackend().verify
    strat = Chunkwise(ChunkwiseParams(chunk_size=4))
    assert ok(strat, anchored, anchored.prepare(*_inputs(anchored, T=12))) == (True, "")
    dot = make_rule("dot", "gd", "after", 1, d=8)  # prediction-free: anchoring changes nothing
    assert ok(strat, dot, dot.prepare(*_inputs(dot, T=7))) == (True, "")
    # the strategy itself refuses the per-token l2 rule at C = 4, naming the anchor
    with pytest.raises(StrategyError, match=r"core:chunkwise cannot run this rule: .*anchor"):
        per_token(*_inputs(per_token), strategy=_chunkwise(backend=NAME))


def test_verifier_accepts_the_largest_sizes():
    rule = make_rule("dot", "momentum", "before", 16, d=128)
    p = rule.prepare(*_inputs(rule, d=128))
    assert ChunkLinearBackend().verify(Chunkwise(ChunkwiseParams(chunk_size=64)), rule, p) == (True, "")
    rule = make_rule("l2", "momentum", "before", 16, d=128, anchor=64)
    p = rule.prepare(*_inputs(rule, d=128, T=64))
    assert ChunkLinearBackend().verify(Chunkwise(ChunkwiseParams(chunk_size=64)), rule, p) == (True, "")


def test_verifier_refuses_the_backward_beyond_its_shared_memory():
    """The backward kernel does not fit a GPU block's shared memory at Dk = 128, barely at
    (C + c - 1) x Dk = 128 x 64, and with momentum not at 128 rows: a call that needs gradients is
    refused there (forward-only calls are served), and served at 64 x 64, and 128 x 32 for gd."""
    strat = Chunkwise(ChunkwiseParams(chunk_size=64))
    cases = [(128, 1, "momentum", "gradients are needed and Dphi=128 > 64"),
             (64, 16, "gd", "(chunk_size + window - 1) x Dphi = 79 x 64 exceeds 4096"),
             (32, 16, "momentum", "gradients are needed with momentum and chunk_size + window - 1 = 79 > 64"),
             (64, 1, "momentum", ""), (32, 16, "gd", "")]
    for d, window, alg, why in cases:
        rule = make_rule("l2", alg, "before", window, d=d, anchor=64)
        q, k, v, gates = _inputs(rule, d=d, T=64)
        p = rule.prepare(q.requires_grad_(True), k, v, gates=gates)
        got = ChunkLinearBackend().verify(strat, rule, p)
        assert got[0] is (not why) and why in got[1], (d, window, got)
        if why:
            with torch.no_grad():
                assert ChunkLinearBackend().verify(strat, rule, rule.prepare(q, k, v, gates=gates)) == (True, "")


def test_verifier_refuses_cpu_tensors_without_the_interpreter(monkeypatch):
    rule = make_rule("l2", "gd", "after", 1, d=8, anchor=4)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "CUDA tensors" in _refusal(rule, device="cpu")


def test_the_kernel_reads_the_error_kind_from_the_form():
    assert make_rule("l2").form.error == "l2"
    assert make_rule("dot").form.error == "dot"
    assert make_rule("l2", window=4).form.error == "l2"  # omega:window around l2
    base = make_rule("l2")
    huber = ac.ComposedRule(base.structure, Huber(), base.retention, base.algorithm, base.feature_map)
    assert huber.form.error is None


def test_forced_backend_that_refuses_names_backend_and_reason(monkeypatch):
    rule = make_rule("l2", "gd", "after", 1, d=8, anchor=4)
    q, k, v, gates = _inputs(rule, dtype=torch.float64)
    with pytest.raises(StrategyError, match=rf"{NAME}.*refused this call.*float64"):
        rule(q, k, v, gates=gates, strategy=_chunkwise(backend=NAME))
    with pytest.raises(StrategyError, match=rf"{NAME}.*refused this call.*whole anchor blocks"):
        rule(*_inputs(rule, T=6), strategy=_chunkwise(backend=NAME))
    monkeypatch.setenv("ATLAS_BACKEND", NAME)
    big = make_rule("l2", "gd", "after", 1, d=8, anchor=128)
    with pytest.raises(StrategyError, match=rf"{NAME}.*chunk_size=128 exceeds 64"):
        big(*_inputs(big, T=128), strategy=_chunkwise(C=128))


def test_forced_backend_without_cuda_says_unavailable(no_device):
    rule = make_rule("l2", "gd", "after", 1, d=8, anchor=4)
    with pytest.raises(StrategyError, match=rf"{NAME}.*unavailable: no CUDA device"):
        rule(*_inputs(rule), strategy=_chunkwise(backend=NAME))


SPEC = {
    "schema": "atlas/1", "name": "tiny-titans",
    "model": {"arch": "titans:lmm", "vocab_size": 32, "d_model": 32, "depth": 1, "heads": 2},
    "memory": {"use": "titans:titans", "anchor": 8, "parallel": {"use": "core:chunkwise", "chunk_size": 8}},
}
IDS = torch.randint(0, 32, (1, 16), generator=torch.Generator().manual_seed(1))  # two anchor blocks


def test_model_uses_the_kernel_and_matches_pytorch(monkeypatch):
    check_model_on_kernel(SPEC, IDS, monkeypatch)


def test_model_runs_on_pytorch_without_cuda(no_device, monkeypatch):
    calls = []
    monkeypatch.setattr(ChunkLinearBackend, "run", lambda self, *a: calls.append(1))
    logits, grads, _ = model_run(SPEC, IDS)
    assert not calls and torch.isfinite(logits).all() and grads


def test_available_only_after_a_probe_kernel_ran(monkeypatch):
    """Availability launches a tiny kernel once; a failure to compile or launch it is a reason
    ("unavailable"), not a crash inside a model's forward."""
    monkeypatch.setattr(availability, "_PROBED", {})
    assert availability.triton_available() == (True, "")
    assert list(availability._PROBED) == [(DEVICE if DEVICE == "cpu" else f"cuda:{torch.cuda.current_device()}",
                                           availability.interpreter_on())]
    from atlas_plugins.cuda_backend import probe

    def broken(device):
        raise RuntimeError("PassManager::run failed\nmore detail")

    monkeypatch.setattr(availability, "_PROBED", {})
    monkeypatch.setattr(probe, "run_probe", broken)
    ok, why = ChunkLinearBackend().is_available()
    assert not ok
    assert why.startswith("a probe kernel failed to compile or launch on ")
    assert why.endswith("RuntimeError: PassManager::run failed")


def test_launch_failure_falls_back_to_pytorch_with_one_warning(monkeypatch):
    """A configuration that cannot launch (here: Triton's shared-memory check, faked) runs the
    PyTorch code with one warning naming the backend and the failure; a forced backend raises."""
    import warnings

    from triton.runtime.errors import OutOfResources

    from atlas_plugins.cuda_backend import chunk_linear as op

    def too_big(*args):
        raise OutOfResources(263680, 232448, "shared memory")

    monkeypatch.setattr(op.ChunkLinearFn, "apply", too_big)
    monkeypatch.setattr(availability, "_WARNED", set())
    rule = make_rule("l2", "gd", "after", 1, d=8, anchor=4)  # gd: automatic dispatch takes it on a GPU
    q, k, v, gates = _inputs(rule)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y1, s1 = rule(q, k, v, gates=gates, strategy=_chunkwise())
        y2, _ = rule(q, k, v, gates=gates, strategy=_chunkwise())
    msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1, msgs
    assert "cuda:chunk_linear: the kernel failed to launch (OutOfResources" in msgs[0]
    assert "core:chunkwise runs its PyTorch code" in msgs[0]
    y_ref, s_ref = rule(q, k, v, gates=gates, strategy=_chunkwise(backend="torch"))
    assert torch.equal(y1, y_ref) and torch.equal(y2, y_ref) and torch.equal(s1["M"], s_ref["M"])
    with pytest.raises(StrategyError, match=rf"{NAME} was requested but its kernel failed to launch"):
        rule(q, k, v, gates=gates, strategy=_chunkwise(backend=NAME))
