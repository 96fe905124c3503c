"""Shared builders for the kernel tests: a rule, float64 leaf inputs with a carried initial state,
and one forward + backward through a chosen backend.

The references are ``core:chunkwise``'s PyTorch code (``backend = "torch"``) and the rule itself
(``core:sequential``), in float64; the kernel runs in float32 (or half). All see the same leaves;
gradients are taken of one fixed random linear functional of the output and of the final state,
w.r.t. every input: q, k, v, each gate and each differentiable entry of the initial state (memory,
momentum and the carried Omega window). An anchored rule's state also carries the position in its
anchor block (``anchor.pos``, 0 here: the kernel serves calls that start on a block) and the
block's anchor memory (``anchor.M``, unused at position 0): both are inputs, not leaves.
"""

from __future__ import annotations

import torch

import atlas_core as ac

B, H, D = 1, 2, 16


def rel_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    scale = want.pow(2).mean().sqrt().item()
    err = (got - want).pow(2).mean().sqrt().item()
    return err / scale if scale > 0 else err


def bias_spec(bias: str, window: int, gamma: str = "gate"):
    if window == 1 and gamma == "gate":
        return f"core:{bias}"
    return {"use": "omega:window", "window": window, "inner": f"core:{bias}", "gamma": gamma}


def make_rule(bias="l2", algorithm="gd", read="after", window=1, gamma="gate",
              retention="core:decay", d=D, anchor=1):
    spec = {"bias": bias_spec(bias, window, gamma), "retention": retention,
            "algorithm": f"core:{algorithm}", "read": read, "anchor": anchor}
    return ac.build_rule(spec, heads=H, d_key=d, d_value=d)


def make_leaves(rule, T: int, seed: int = 0, d: int = D) -> dict[str, torch.Tensor]:
    """float64 leaves: inputs, gates and a non-zero carried state (every key of the rule's state;
    an anchored rule's ``anchor.*`` entries at position 0 do not require gradients)."""
    g = torch.Generator().manual_seed(seed)
    f64 = dict(dtype=torch.float64)

    def unit(*shape):  # l2-normalised q/k, as the memory layer's qk_norm gives them
        return torch.nn.functional.normalize(torch.randn(*shape, generator=g, **f64), dim=-1)

    leaves = {"q": unit(B, T, H, d), "k": unit(B, T, H, d), "v": torch.randn(B, T, H, d, generator=g, **f64)}
    for name in rule.gate_names:
        lo, hi = {"theta": (0.1, 0.9), "gamma": (0.3, 0.9)}.get(name, (0.5, 0.98))
        leaves[name] = lo + (hi - lo) * torch.rand(B, T, H, generator=g, **f64)
    for key, x in rule.init_state(B, dtype=torch.float64).items():
        if key == "anchor.pos":
            leaves["state." + key] = torch.zeros(x.shape, **f64)  # a block starts here
        elif key == "window.gamma":
            leaves["state." + key] = 0.3 + 0.6 * torch.rand(x.shape, generator=g, **f64)
        elif key == "window.k":
            leaves["state." + key] = unit(*x.shape)
        else:
            leaves["state." + key] = 0.3 * torch.randn(x.shape, generator=g, **f64)
    return {k: v if k.startswith("state.anchor.") else v.requires_grad_(True) for k, v in leaves.items()}


def run(rule, leaves, *, chunk_size: int, backend: str, dtype=torch.float64, seed: int = 1,
        device: str = "cpu"):
    """y, final state and the gradients (float64, on the CPU) of a fixed functional, through
    ``backend`` (``"sequential"``: the rule's reference loop, ``core:sequential``) on ``device``."""
    cast = {k: v.to(device=device, dtype=dtype) for k, v in leaves.items()}
    gates = {n: cast[n] for n in rule.gate_names}
    state = {k[len("state."):]: v for k, v in cast.items() if k.startswith("state.")}
    strategy = ("core:sequential" if backend == "sequential" else
                {"use": "core:chunkwise", "chunk_size": chunk_size, "backend": backend})
    y, final = rule(cast["q"], cast["k"], cast["v"], gates=gates, state=state, strategy=strategy)
    g = torch.Generator().manual_seed(seed)
    y, final = y.cpu(), {k: v.cpu() for k, v in final.items()}
    loss = (y.double() * torch.randn(y.shape, generator=g, dtype=torch.float64)).sum()
    for key in sorted(final):
        w = torch.randn(final[key].shape, generator=g, dtype=torch.float64)
        loss = loss + (final[key].double() * w).sum()
    wrt = {k: v for k, v in leaves.items() if v.requires_grad}
    grads = torch.autograd.grad(loss, list(wrt.values()), allow_unused=False)
    return y.detach().double(), {k: v.detach().double() for k, v in final.items()}, dict(zip(wrt, grads))


def compare(got, want) -> dict[str, float]:
    """Relative RMS errors of y, every final-state entry and every gradient."""
    (yg, sg, gg), (yw, sw, gw) = got, want
    errs = {"y": rel_rms(yg, yw)}
    errs.update({f"state[{k}]": rel_rms(sg[k], sw[k]) for k in sw})
    errs.update({f"grad[{k}]": rel_rms(gg[k], gw[k]) for k in gw})
    return errs


def model_run(spec, ids: torch.Tensor, device: str = "cpu", seed: int = 0):
    """Logits and parameter gradients (on the CPU) of the model of ``spec`` built and run on
    ``device`` over ``ids``, and the model."""
    torch.manual_seed(seed)
    model = ac.build_model(spec).to(device)
    logits = model(ids.to(device))
    logits.square().mean().backward()
    grads = {n: p.grad.cpu() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach().cpu(), grads, model


def check_model_on_kernel(spec, ids: torch.Tensor, monkeypatch):
    """The model of ``spec`` on the ``cuda:chunk_linear`` kernel (which must run; taking every call
    it can serve, also those automatic dispatch leaves to PyTorch on a GPU) equals the
    PyTorch path (``ATLAS_BACKEND=torch``): logits, every parameter gradient, and decoding (a
    3-token prompt, then one token per step) equals the kernel's full forward. Returns the model."""
    from atlas_plugins.cuda_backend.backend_chunk import ChunkLinearBackend

    from .conftest import DEVICE

    calls = []
    real_run = ChunkLinearBackend.run
    monkeypatch.setattr(ChunkLinearBackend, "run", lambda self, *a: calls.append(1) or real_run(self, *a))
    # automatic dispatch leaves calls with gradients to the PyTorch code on a GPU (measured
    # slower there); this check is about what the kernel computes, so it takes every call it serves
    monkeypatch.setattr(ChunkLinearBackend, "prefers", lambda self, *a: (True, ""))
    got, g_got, model = model_run(spec, ids, DEVICE)
    assert calls, "the kernel backend was not used"
    with torch.no_grad():
        outs, state = [], None
        for lo, hi in [(0, 3)] + [(t, t + 1) for t in range(3, ids.shape[1])]:
            logits, state = model.step(ids[:, lo:hi].to(DEVICE), state)
            outs.append(logits.cpu())
    assert rel_rms(torch.cat(outs, 1), got) <= 1e-5
    monkeypatch.setenv("ATLAS_BACKEND", "torch")
    ran = len(calls)
    want, g_want, _ = model_run(spec, ids)
    assert len(calls) == ran, "the reference ran on the kernel"
    assert rel_rms(got, want) <= 1e-5
    assert set(g_got) == set(g_want)
    for name in g_want:
        assert rel_rms(g_got[name], g_want[name]) <= 1e-4, name
    return model
