"""Anchored ``omega:window`` rules (``anchor = A``) under ``core:sequential`` and ``core:chunkwise``
(chunk sizes dividing A) against a hand-written ANCHORED loop of Atlas Eq 9: every window term of
every token in a block of A tokens is evaluated at the memory before the block, blocks aligned to
absolute positions from the start of the sequence, also when the sequence is split into calls
(test_omega_chunkwise.py compares the strategies with each other)."""

import pytest
import torch

from .conftest import chunk, gates_for, make_inputs, window_rule


def anchored_eq9(q, k, v, gates, c, algorithm, read, A):
    """Atlas Eq 9 (l2 inner loss, gamma gate, linear memory) with the gradients of each block of
    A tokens (t = 0, A, 2A, ...) at the memory before the block. Returns y, M, Z and the anchor
    memory held at the end (that of the unfinished block, or M when the last block is full)."""
    B, T, H, _ = q.shape
    M = torch.zeros(B, H, v.shape[-1], k.shape[-1], dtype=q.dtype)
    Z = torch.zeros_like(M)
    anchor, ys = M, []
    for t in range(T):
        if t % A == 0:
            anchor = M
        g = torch.zeros_like(M)
        for i in range(max(0, t - c + 1), t + 1):  # the window, reaching into earlier blocks
            err = torch.einsum("bhvp,bhp->bhv", anchor, k[:, i]) - v[:, i]
            g = g + gates["gamma"][:, i, :, None, None] * torch.einsum("bhv,bhp->bhvp", err, k[:, i])
        alpha, theta = gates["alpha"][:, t, :, None, None], gates["theta"][:, t, :, None, None]
        if algorithm == "core:gd":
            M_new = alpha * M - theta * g
        else:
            Z = gates["eta"][:, t, :, None, None] * Z + theta * g
            M_new = alpha * M - Z
        ys.append(torch.einsum("bhvp,bhp->bhv", M_new if read == "after" else M, q[:, t]))
        M = M_new
    return torch.stack(ys, 1), M, Z, (M if T % A == 0 else anchor)


def split_calls(rule, q, k, v, g, cuts, strategy):
    bounds, ys, state = [0, *cuts, q.shape[1]], [], None
    for lo, hi in zip(bounds, bounds[1:]):
        y, state = rule(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi],
                        gates={n: x[:, lo:hi] for n, x in g.items()}, state=state, strategy=strategy)
        ys.append(y)
    return torch.cat(ys, dim=1), state


CASES = [(4, 4, 8, "core:gd", "after"), (4, 8, 3, "core:momentum", "before"),
         (16, 16, 16, "core:momentum", "after"), (2, 6, 5, "core:gd", "before")]


@pytest.mark.parametrize("cuts", [(), (6,), (5, 21), (1, 2, 36)], ids=["one-call", "cut6", "cut5-21", "cut1-2-36"])
@pytest.mark.parametrize("C,A,c,algorithm,read", CASES,
                         ids=[f"C{C}-A{A}-c{c}-{a.split(':')[1]}-{r}" for C, A, c, a, r in CASES])
def test_anchored_rule_equals_hand_written_anchored_loop(C, A, c, algorithm, read, cuts):
    q, k, v, gates = make_inputs(T=37, seed=C + c)
    rule = window_rule(c, "gate", algorithm, read, anchor=A)
    g = gates_for(rule, gates)
    y_ref, M, Z, held = anchored_eq9(q, k, v, gates, c, algorithm, read, A)
    for strategy in ("core:sequential", chunk(C)):
        y, s = split_calls(rule, q, k, v, g, cuts, strategy)
        torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
        torch.testing.assert_close(s["M"], M, rtol=0, atol=1e-10)
        if algorithm == "core:momentum":
            torch.testing.assert_close(s["Z.M"], Z, rtol=0, atol=1e-10)
        torch.testing.assert_close(s["anchor.M"], held, rtol=0, atol=1e-10)
        assert torch.equal(s["anchor.pos"], torch.full((2,), float(37 % A), dtype=torch.float64))
