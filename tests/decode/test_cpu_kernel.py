"""The decode step's compiled CPU matrix-vector product (`atlas_core.decode.cpu_kernel`) against
float64 arithmetic and against its readable reference, ``F.linear`` (`fused.reference_matvec`):
float32 and bfloat16 weights (bfloat16 rows 32 values a load where K allows), sizes that leave
ragged row groups and vector tails, up to 8 rows;
``ATLAS_CPU_KERNELS=0`` runs the reference; a decoder gives the same logits either way."""

from __future__ import annotations

import shutil

import pytest
import torch

from atlas_core.decode import cpu_kernel
from atlas_core.decode.fused import matvec, reference_matvec

needs_compiler = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler on this machine")


@needs_compiler
def test_the_kernel_builds_where_a_compiler_is():
    assert cpu_kernel.kernel() is not None


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N,K,B", [(1, 1, 1), (7, 17, 1), (1027, 333, 3), (33, 96, 3), (64, 1024, 8), (4099, 2048, 2)])
def test_kernel_equals_float64_and_the_reference(dtype, N, K, B):
    g = torch.Generator().manual_seed(N + K + B)
    W = torch.randn(N, K, generator=g).to(dtype)
    x = torch.randn(B, K, generator=g)
    b = torch.randn(N, generator=g)
    with torch.no_grad():
        y = matvec(W, x, b)
        exact = x.double() @ W.double().T + b.double()
        ref = reference_matvec(W.float(), x, b)
    assert y.dtype == torch.float32 and y.shape == (B, N)
    scale = exact.abs().max()
    assert (y.double() - exact).abs().max() <= 2e-6 * scale * max(1.0, K / 256) ** 0.5
    assert (y - ref).abs().max() <= 2e-6 * scale.float() * max(1.0, K / 256) ** 0.5


@needs_compiler
def test_bfloat16_activations_come_back_bfloat16():
    W = torch.randn(33, 64).bfloat16()
    x = torch.randn(2, 64).bfloat16()
    with torch.no_grad():
        y = matvec(W, x)
    assert y.dtype == torch.bfloat16
    exact = x.double() @ W.double().T
    assert (y.double() - exact).abs().max() <= 1e-2 * exact.abs().max()


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("ATLAS_CPU_KERNELS", "0")
    assert cpu_kernel.kernel() is None
    W, x = torch.randn(10, 20), torch.randn(1, 20)
    with torch.no_grad():
        assert torch.equal(matvec(W, x), reference_matvec(W, x))


def test_not_used_with_gradients_or_many_rows():
    W, x = torch.randn(10, 20), torch.randn(1, 20)
    assert not cpu_kernel.usable(W, x)  # grad mode on
    with torch.no_grad():
        assert cpu_kernel.usable(W, x)
        assert not cpu_kernel.usable(W, torch.randn(9, 20))
        assert not cpu_kernel.usable(W.double(), x.double())
        assert not cpu_kernel.usable(W.t(), torch.randn(1, 10))


@needs_compiler
def test_a_decoder_gives_the_same_logits_with_and_without_the_kernel(monkeypatch):
    import atlas_core as ac
    from atlas_core.decode import Decoder

    spec = {"schema": "atlas/1", "name": "k", "memory": {"use": "zoo:gated_deltanet"},
            "layer": {"value_heads": 4},
            "model": {"arch": "core:lm", "vocab_size": 40, "d_model": 32, "depth": 2, "heads": 2,
                      "mlp": "swiglu", "layers": ["memory", "attention"], "attention": {"heads": 4, "kv_heads": 2}}}
    torch.manual_seed(0)
    model = ac.build_model(spec).eval()
    prompt, nexts = torch.randint(0, 40, (9,)), torch.randint(0, 40, (6, 1))

    def run() -> torch.Tensor:
        dec = Decoder(model, max_len=32)
        out = [dec.prefill([prompt])]
        for ids in nexts:
            out.append(dec.step(ids))
        return torch.stack(out)

    fast = run()
    monkeypatch.setenv("ATLAS_CPU_KERNELS", "0")
    slow = run()
    assert torch.allclose(fast, slow, rtol=1e-5, atol=1e-5)
