"""``planted:mesa_chunks``: ``planted:mesa`` chunk by chunk in closed form.

Inside a chunk of C tokens both recurrences are linear with the same decay:
``H_t = P_t H_0 + sum_{j<=t} L[t, j] write_j k_j k_j^T`` with ``L[t, j] = prod_{j<m<=t} forget_m``
(`atlas_core.forms.decay.decay_matrix`) and ``P_t = L[t, 0] forget_0``; likewise ``G``. Every
``H_t`` of the chunk is formed at once ([B, H, C, Dk, Dk]) and the reads are one batched solve.
Exact (another summation order) for every chunk size; the chunk grid restarts at each call.

The planted bugs of `bugs.BUGS` that concern a strategy live here.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from atlas_core import Strategy
from atlas_core.forms.decay import decay_matrix
from atlas_core.params import Params, size_field

from .bugs import planted
from .mesa import MesaRule


class MesaChunksParams(Params):
    chunk_size: int = size_field(64, "chunk", description="tokens per chunk")


class MesaChunks(Strategy):
    name = "planted:mesa_chunks"

    def __init__(self, chunk_size: int) -> None:
        self.chunk_size = chunk_size

    def describe(self) -> str:
        return f"{self.name}(chunk_size={self.chunk_size})"

    def chunk_for(self, rule) -> int:
        return self.chunk_size

    def supports(self, rule) -> tuple[bool, str]:
        if planted("claims_every_rule"):
            return True, ""
        if planted("claims_standalone") and not rule.form.composed:
            return True, ""
        if not isinstance(rule, MesaRule):
            return False, f"{self.name} runs planted:mesa only"
        return True, ""

    def run(self, rule, inputs):
        if not isinstance(rule, MesaRule):  # the planted claims: another plugin's rule, its loop
            return rule.reference(inputs)
        state = inputs.state
        if planted("ignores_state"):
            state = {key: torch.zeros_like(x) for key, x in state.items()}
        ys, rest = [], inputs
        while rest.q.shape[2]:
            head, rest = rest.split(self.chunk_size)
            y, state = self._chunk(rule, head, state)
            if planted("detached_grad"):
                state = {key: x.detach() for key, x in state.items()}
            ys.append(y)
        y = torch.cat(ys, dim=2) if ys else inputs.v.new_zeros(inputs.v.shape)
        if planted("wrong_large_chunk") and self.chunk_size > 4:
            y = y * 1.001
        return y, state

    @staticmethod
    def _chunk(rule: MesaRule, p, state):
        L = decay_matrix(p.forget)  # [B, H, C, C]
        P = L[..., 0] * p.forget[..., :1]  # [B, H, C]: prod of forget up to t
        Lw = L * p.write.unsqueeze(-2)  # [B, H, C, C]: L[t, j] write_j
        H = P[..., None, None] * state["H"].unsqueeze(2) + torch.einsum("bhtj,bhjd,bhje->bhtde", Lw, p.k, p.k)
        G = P[..., None, None] * state["G"].unsqueeze(2) + torch.einsum("bhtj,bhjv,bhjd->bhtvd", Lw, p.v, p.k)
        eye = rule.lam * torch.eye(H.shape[-1], dtype=H.dtype, device=H.device)
        x = torch.linalg.solve(H + eye, p.q.unsqueeze(-1))  # [B, H, C, Dk, 1]
        y = (G @ x).squeeze(-1)  # [B, H, C, Dv]
        return y, {"H": H[:, :, -1], "G": G[:, :, -1]}


def build(params, ctx) -> MesaChunks:
    return MesaChunks((params or MesaChunksParams()).chunk_size)
