"""``omega:window`` under ``core:chunkwise`` (C > 1) against a hand-written ANCHORED loop of Atlas
Eq 9: every window term of every token in a chunk is evaluated at the memory before the chunk
(test_omega_chunkwise.py compares with the rule's own reference loop)."""

import pytest
import torch

from .conftest import gates_for, make_inputs, window_rule


def anchored_eq9(q, k, v, gates, c, algorithm, read, C):
    B, T, H, _ = q.shape
    M = torch.zeros(B, H, v.shape[-1], k.shape[-1], dtype=q.dtype)
    Z = torch.zeros_like(M)
    anchor, ys = M, []
    for t in range(T):
        if t % C == 0:
            anchor = M
        g = torch.zeros_like(M)
        for i in range(max(0, t - c + 1), t + 1):  # the window, reaching into earlier chunks
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
    return torch.stack(ys, 1), M, Z


@pytest.mark.parametrize("C,c,algorithm,read", [(4, 8, "core:gd", "after"), (4, 3, "core:momentum", "before"),
                                                (16, 16, "core:momentum", "after")],
                         ids=["C4-c8-gd-after", "C4-c3-momentum-before", "C16-c16-momentum-after"])
def test_chunkwise_equals_hand_written_anchored_loop(C, c, algorithm, read):
    q, k, v, gates = make_inputs(T=37, seed=C + c)
    rule = window_rule(c, "gate", algorithm, read)
    y, s = rule(q, k, v, gates=gates_for(rule, gates), strategy={"use": "core:chunkwise", "chunk_size": C})
    y_ref, M, Z = anchored_eq9(q, k, v, gates, c, algorithm, read, C)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(s["M"], M, rtol=0, atol=1e-10)
    if algorithm == "core:momentum":
        torch.testing.assert_close(s["Z.M"], Z, rtol=0, atol=1e-10)
