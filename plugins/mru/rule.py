"""``mru:mru``: the Matrix Recurrent Unit as a standalone rule (seed 002; docs/math.md "Matrix
Recurrent Unit").

    H_t = H_{t-1} X_t          (earlier factors on the left),   H_0 = I or the carried state

Call contract (the core's `Rule`: prepare -> strategy.run -> finish)::

    rule = build_rule({"use": "mru:mru"})
    H, state = rule(X, state=None, strategy="mru:brent_kung")

- ``X: [B, T, H, d, d]`` per-token, per-head square matrices;
- ``state``: None (``H_0 = I``) or ``{"H": [B, H, d, d]}``, the state returned by an earlier call;
- ``H: [B, T, H, d, d]`` every prefix product; the returned state is ``{"H": H[:, -1]}``, so two
  calls with the carried state equal one call.

Strategies: ``core:sequential`` runs `reference` (a plain left-to-right loop, autograd through
every step); ``mru:hillis_steele``, ``mru:brent_kung`` and ``mru:sklansky`` run the parallel scans
of `cumprod.py`, each with the closed-form backward. Half-precision inputs are computed in float32
(H is cast back; the state stays float32), as for every core rule: a long product of rounded
factors drifts much faster in 8 mantissa bits.

The rule holds no learned parameters; `MRULayer` (layer.py) produces X.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
from einops import rearrange

from atlas_core.rule import Rule

from .cumprod import FUNCTIONS, cumprod_loop


@dataclass
class MRUInputs:
    """One call, normalised: time at dim -3 so that each (batch, head) is one sequence."""

    X: torch.Tensor  # [B, H, T, d, d], compute dtype
    h0: torch.Tensor | None  # [B, H, d, d] or None (identity)
    out_dtype: torch.dtype

    @property
    def shape(self) -> tuple[int, int, int, int]:
        B, H, T, d, _ = self.X.shape
        return B, H, T, d


class MRURule(Rule):
    """The MRU recurrence ``H_t = H_{t-1} X_t`` over ``X: [B, T, H, d, d]``."""

    state_keys_ = ("H",)
    takes_qkv = False  # its input is X: [B, T, H, d, d] (the MRU layer makes it)

    def __init__(self, spec: Mapping[str, Any] | None = None, default_strategy: Any = "mru:brent_kung"):
        super().__init__()
        self.spec = dict(spec or {"use": "mru:mru"})
        self.default_strategy = default_strategy

    def bind(self, heads: int, d_key: int | None = None, d_value: int | None = None) -> "MRURule":
        """Record the sizes a caller works with (``heads`` and the matrix order ``d = d_key``).

        The rule itself takes its sizes from X on every call; the recorded ones only size
        `example_inputs` (what the conformance kit calls the rule with). ``d_value`` is unused."""
        self.heads, self.order = int(heads), int(d_key if d_key is not None else 2)
        return self

    def example_inputs(self, *, batch: int, seq_len: int, dtype=torch.float32, device=None,
                       generator: torch.Generator | None = None) -> dict:
        """``{"X": [batch, seq_len, heads, d, d]}`` of random rotations (``exp`` of a random
        skew-symmetric matrix, as the MRU layer makes them), so products stay O(1) at any length."""
        heads, d = getattr(self, "heads", 2), getattr(self, "order", 2)
        A = torch.randn(batch, seq_len, heads, d, d, generator=generator, dtype=torch.float64)
        X = torch.linalg.matrix_exp(A - A.mT)
        return {"X": X.to(device=device, dtype=dtype)}

    def state_keys(self) -> list[str]:
        return list(self.state_keys_)

    def init_state(self, batch: int, heads: int, d: int, *, dtype=torch.float32, device=None) -> dict:
        """``{"H": I}`` of shape ``[batch, heads, d, d]``: the state before the first token."""
        eye = torch.eye(d, dtype=dtype, device=device)
        return {"H": eye.expand(batch, heads, d, d).clone()}

    # -- the call -------------------------------------------------------------------------------
    def prepare(self, X: torch.Tensor, state: Mapping[str, torch.Tensor] | None = None) -> MRUInputs:
        if not isinstance(X, torch.Tensor):
            raise ValueError(f"X must be a torch.Tensor [B, T, H, d, d], got {type(X).__name__}")
        if X.dim() != 5:
            raise ValueError(f"X must have 5 dimensions [B, T, H, d, d], got shape {tuple(X.shape)}")
        if not X.is_floating_point():
            raise ValueError(f"X must be a floating-point tensor, got dtype {X.dtype}")
        B, T, H, r, c = X.shape
        if r != c:
            raise ValueError(
                f"X must hold square matrices: its last two dims are {r} x {c} "
                f"(X shape {tuple(X.shape)}); the MRU multiplies d x d states"
            )
        if T < 1:
            raise ValueError(f"X must hold at least one time step; got T=0 (X shape {tuple(X.shape)})")
        cdtype = torch.float32 if X.dtype in (torch.float16, torch.bfloat16) else X.dtype
        h0 = self._check_state(state, (B, H, r, r), cdtype, X.device)
        Xc = rearrange(X.to(cdtype), "b t h r c -> b h t r c")
        return MRUInputs(X=Xc, h0=h0, out_dtype=X.dtype)

    def _check_state(self, state, want: tuple[int, ...], dtype, device) -> torch.Tensor | None:
        if state is None:
            return None
        if not isinstance(state, Mapping):
            raise ValueError(f"state must be a mapping {{'H': [B, H, d, d]}}, got {type(state).__name__}")
        if set(state) != {"H"}:
            raise ValueError(
                f"state has keys {sorted(state)} but the MRU state is {{'H'}}; pass the state "
                "returned by an earlier call"
            )
        h0 = state["H"]
        if not isinstance(h0, torch.Tensor) or tuple(h0.shape) != want:
            got = tuple(h0.shape) if isinstance(h0, torch.Tensor) else type(h0).__name__
            raise ValueError(f"state['H'] must have shape [B, H, d, d] = {list(want)}, got {got}")
        if h0.device != device:
            raise ValueError(f"state['H'] is on {h0.device} but X is on {device}")
        return h0.to(dtype)

    def finish(self, inputs: MRUInputs, output):
        H, state = output
        return rearrange(H, "b h t r c -> b t h r c").to(inputs.out_dtype), state

    # -- how it runs ----------------------------------------------------------------------------
    def reference(self, inputs: MRUInputs):
        """The readable loop, ``H_t = H_{t-1} X_t`` one token at a time (``core:sequential``)."""
        H = cumprod_loop(inputs.X, inputs.h0)  # [B, H, T, d, d]
        return H, {"H": H[:, :, -1]}

    def scan(self, inputs: MRUInputs, algorithm: str):
        """A parallel scan with the closed-form backward (the ``mru:*`` strategies)."""
        H = FUNCTIONS[algorithm].apply(inputs.X, inputs.h0)  # [B, H, T, d, d]
        return H, {"H": H[:, :, -1]}

    def extra_repr(self) -> str:
        return f"default_strategy={self.default_strategy!r}"


def build(params, ctx) -> MRURule:
    return MRURule()
