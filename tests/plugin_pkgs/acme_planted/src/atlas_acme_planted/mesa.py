"""``planted:mesa``: a MesaNet-style standalone rule (von Oswald et al. 2025): each token reads the
least-squares solution of everything written so far.

    H_t = forget_t H_{t-1} + write_t k_t k_t^T          H: [B, H, Dk, Dk]
    G_t = forget_t G_{t-1} + write_t v_t k_t^T          G: [B, H, Dv, Dk]
    y_t = G_t (H_t + lam I)^-1 q_t                      y: [B, T, H, Dv]

Call: ``y, state = rule(q, k, v, gates={"forget": f, "write": w}, state=None, strategy=...)`` with
``q, k: [B, T, H, Dk]``, ``v: [B, T, H, Dv]``, ``f, w: [B, T, H]`` in [0, 1]; ``state = {"H", "G"}``
(zeros when None). ``core:sequential`` runs `reference`; ``planted:mesa_chunks`` runs `MesaInputs`
chunk by chunk in closed form. Planted bug ``standalone_gate_edge_nan``: ``forget`` computed as
``forget (1 - forget) / (1 - forget)``, the same value everywhere but at forget = 1, where it is
0 / 0 = NaN (zero inputs, a repeated token and larger inputs never reach it: only the gate's edge).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from einops import rearrange
from pydantic import Field

from atlas_core.knobs import Gate
from atlas_core.params import Params
from atlas_core.rule import Rule

from .bugs import planted

FORGET = Gate("forget", activation="sigmoid", bias=4.0, range=(0.0, 1.0),
              summary="how much of H and G a token keeps")
WRITE = Gate("write", activation="sigmoid", bias=0.0, range=(0.0, 1.0),
             summary="how strongly a token is written")


class MesaParams(Params):
    lam: float = Field(1.0, gt=0.0, description="the ridge regulariser lam of (H_t + lam I)^-1")


@dataclass
class MesaInputs:
    """One call in the compute dtype, time-major per head: q, k [B, H, T, Dk], v [B, H, T, Dv],
    forget and write [B, H, T], the state at the call's start."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    forget: torch.Tensor
    write: torch.Tensor
    state: dict
    out_dtype: torch.dtype

    def split(self, n: int) -> tuple["MesaInputs", "MesaInputs"]:
        """The first ``n`` tokens and the rest, both with the call's state."""
        cut = lambda x, a, b: x[:, :, a:b]  # noqa: E731
        fields = ("q", "k", "v", "forget", "write")
        head = replace(self, **{f: cut(getattr(self, f), 0, n) for f in fields})
        tail = replace(self, **{f: cut(getattr(self, f), n, None) for f in fields})
        return head, tail


class MesaRule(Rule):
    gates = (FORGET, WRITE)

    def __init__(self, lam: float) -> None:
        super().__init__()
        self.lam = float(lam)
        self.heads, self.d_key, self.d_value = 2, 4, 4

    def bind(self, heads, d_key=None, d_value=None):
        self.heads, self.d_key = int(heads), int(d_key or self.d_key)
        self.d_value = int(d_value or self.d_key)
        return self

    def example_inputs(self, *, batch, seq_len, dtype=torch.float32, device=None, generator=None):
        shape = (batch, seq_len, self.heads)
        q = torch.randn(*shape, self.d_key, generator=generator, dtype=torch.float64)
        k = torch.randn(*shape, self.d_key, generator=generator, dtype=torch.float64)
        v = torch.randn(*shape, self.d_value, generator=generator, dtype=torch.float64)
        gates = {"forget": 0.6 + 0.4 * torch.rand(*shape, generator=generator, dtype=torch.float64),
                 "write": torch.rand(*shape, generator=generator, dtype=torch.float64)}
        out = {"q": q / q.norm(dim=-1, keepdim=True), "k": k / k.norm(dim=-1, keepdim=True), "v": v,
               "gates": gates}
        return {key: ({g: x.to(device=device, dtype=dtype) for g, x in val.items()} if key == "gates"
                      else val.to(device=device, dtype=dtype)) for key, val in out.items()}

    def init_state(self, B, H, Dk, Dv, *, dtype, device) -> dict:
        return {"H": torch.zeros(B, H, Dk, Dk, dtype=dtype, device=device),
                "G": torch.zeros(B, H, Dv, Dk, dtype=dtype, device=device)}

    def prepare(self, q, k, v, gates=None, state=None) -> MesaInputs:
        gates = dict(gates or {})
        if set(gates) != {"forget", "write"}:
            raise ValueError(f"gates must be {{'forget', 'write'}}, got {sorted(gates)}")
        B, T, H, Dk = q.shape
        if k.shape != q.shape or v.shape[:3] != (B, T, H):
            raise ValueError(f"q, k: [B, T, H, Dk] and v: [B, T, H, Dv]; got {tuple(q.shape)}, "
                             f"{tuple(k.shape)}, {tuple(v.shape)}")
        dt = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        heads = lambda x: rearrange(x.to(dt), "b t h ... -> b h t ...")  # noqa: E731
        forget = gates["forget"]
        if planted("standalone_gate_edge_nan"):
            forget = forget * (1 - forget) / (1 - forget)
        if state is None:
            state = self.init_state(B, H, Dk, v.shape[-1], dtype=dt, device=q.device)
        return MesaInputs(heads(q), heads(k), heads(v), heads(forget), heads(gates["write"]),
                          {key: x.to(dt) for key, x in state.items()}, q.dtype)

    def reference(self, inputs: MesaInputs):
        """The readable loop, one token at a time (``core:sequential``)."""
        Hm, Gm = inputs.state["H"], inputs.state["G"]
        eye = self.lam * torch.eye(Hm.shape[-1], dtype=Hm.dtype, device=Hm.device)
        ys = []
        for t in range(inputs.q.shape[2]):
            f = inputs.forget[:, :, t, None, None]  # [B, H, 1, 1]
            w = inputs.write[:, :, t, None, None]
            k, v, q = inputs.k[:, :, t], inputs.v[:, :, t], inputs.q[:, :, t]
            Hm = f * Hm + w * k[..., :, None] * k[..., None, :]
            Gm = f * Gm + w * v[..., :, None] * k[..., None, :]
            x = torch.linalg.solve(Hm + eye, q.unsqueeze(-1))  # [B, H, Dk, 1]
            ys.append((Gm @ x).squeeze(-1))  # [B, H, Dv]
        y = torch.stack(ys, dim=2) if ys else inputs.v.new_zeros(inputs.v.shape)
        return y, {"H": Hm, "G": Gm}

    def finish(self, inputs: MesaInputs, output):
        y, state = output
        return rearrange(y, "b h t d -> b t h d").to(inputs.out_dtype), state


def build(params, ctx) -> MesaRule:
    return MesaRule((params or MesaParams()).lam)
