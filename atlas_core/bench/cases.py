"""The rules the benchmark measures, and the inputs it feeds them.

A `Case` is one memory rule (a spec for `atlas_core.build_rule`), one memory layer (``kind =
"layer"``: ``x: [B, T, d_model]`` in, the layer's output out), or decoding with a built model
(``kind = "decode"``: a ``core:lm`` model around the rule, one-token ``model.step`` calls after a
T-token prompt). `make_inputs` draws inputs with the shapes of docs/math.md — ``q, k: [B, T, H, Dk]``
(l2-normalised, as the memory layer feeds them), ``v: [B, T, H, Dv]``, each gate ``[B, T, H]`` in
the range the layer's default gate biases give — from a fixed seed, so every strategy of a case
sees the same numbers.

A subject may run a case's rule rebuilt with another ``anchor`` (`Case.rule(..., anchor=A)`):
the rule with every gradient of an A-token block taken at the block's start memory, the rule
``core:chunkwise`` runs at chunk sizes dividing A. The case's own rule keeps its spec's anchor
(the presets' defaults: 1 for ``titans:titans``, 16 for ``titans:titans_deep`` and Atlas).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

OMEGA16 = {"use": "omega:window", "window": 16, "inner": "core:l2", "gamma": "uniform"}
#: the decode case: its rule's anchor (divisible by every chunk size it is decoded with) and the
#: ``[model]`` table of the core:lm model around it (d_model = heads * dim of the run)
DECODE_ANCHOR = 1024
DECODE_CHUNKS = (16, 1024)
DECODE_MODEL = {"arch": "core:lm", "vocab_size": 256, "depth": 2}

#: name -> (title, rule spec)
RULES: dict[str, tuple[str, dict[str, Any]]] = {
    "titans": ("Titans, linear memory (l2, decay, momentum)", {"use": "titans:titans"}),
    "titans_deep": ("Titans, deep memory (titans:mlp depth 2, x4; l2, decay, momentum)",
                    {"use": "titans:titans_deep"}),
    "omega16": ("OmegaNet, window c=16 (uniform), poly map, decay, gd",
                {"use": "omega:omeganet", "bias": OMEGA16}),
    "atlas": ("Atlas (titans:mlp, window 8 gated, poly map, decay, Muon)",
              {"use": "atlas_muon:atlas"}),
    "atlas_linear": ("Atlas on linear memory (window 8 gated, poly map, decay, Muon)",
                     {"use": "atlas_muon:atlas_linear"}),
    "delta": ("Delta rule with decay (linear, l2, decay, gd: Titans without momentum)",
              {"structure": "core:linear", "bias": "core:l2", "retention": "core:decay",
               "algorithm": "core:gd"}),
    "moneta": ("Moneta (MIRAS: linear memory, lp bias p=3, lq retention q=4, gd; a nonlinear "
               "retention: core:chunkwise's stepped form)", {"use": "miras:moneta"}),
    "titans_deep_layer": ("Deep-memory layer x: [B, T, H*D] (Titans deep vs titans-pytorch "
                          "NeuralMemory)", {"use": "titans:titans_deep"}),
    "decode": (f"Decoding: core:lm ({DECODE_MODEL['depth']} blocks, titans:titans with anchor "
               f"{DECODE_ANCHOR}), ms per one-token model.step after a T-token prompt",
               {"use": "titans:titans", "anchor": DECODE_ANCHOR}),
}
LAYER_CASES = {"titans_deep_layer"}
DECODE_CASES = {"decode"}
#: `LayerParams` of the layer cases. The deep-memory layer matches titans-pytorch NeuralMemory's
#: defaults where the layers differ: no short convolution and no per-head output norm (it has
#: neither); the output gate and the q/k l2 norm stay on (it has a per-head output gate).
LAYER_PARAMS = {"titans_deep_layer": {"conv_size": 0, "output_norm": False}}
DEFAULT_RULES = ("titans", "titans_deep", "omega16", "atlas", "delta", "titans_deep_layer", "decode")

#: gate name -> (low, high) of a uniform draw. The layer's default biases give alpha ~ 0.95,
#: eta ~ 0.88, theta ~ 0.01; the benchmark takes larger learning rates so that the memory changes,
#: small enough that the deep memory does not diverge (the timings do not depend on the values).
GATE_RANGES = {"alpha": (0.95, 1.0), "eta": (0.8, 0.95), "theta": (0.02, 0.1), "gamma": (0.5, 1.0)}


@dataclass
class Case:
    name: str
    title: str
    spec: dict[str, Any]
    kind: str = "rule"  # "rule" | "layer" | "decode"
    layer: dict[str, Any] = field(default_factory=dict)  # LayerParams of a layer case
    _rules: dict = field(default_factory=dict, repr=False)

    def rule_spec(self, anchor: int | None = None) -> dict[str, Any]:
        """The case's rule spec, or the same rule with ``anchor`` (None: the spec's own)."""
        return dict(self.spec) if anchor is None else {**self.spec, "anchor": anchor}

    def rule(self, heads: int, d_key: int, d_value: int, dtype=torch.float32, anchor: int | None = None,
             device: torch.device | str | None = None):
        """The case's rule (rebuilt with ``anchor`` when given), built once per size, dtype,
        anchor and device (seeded, and built on the CPU before it is moved: learned initial
        weights and feature-map coefficients are the same for every strategy, every anchor and
        every device). ``device`` None: the CPU."""
        from ..rule import build_rule

        dev = torch.device(device) if device is not None else torch.device("cpu")
        key = (heads, d_key, d_value, dtype, anchor) + ((str(dev),) if dev.type != "cpu" else ())
        if key not in self._rules:
            with torch.random.fork_rng():
                torch.manual_seed(0)
                rule = build_rule(self.rule_spec(anchor), heads=heads, d_key=d_key,
                                  d_value=d_value).to(dtype)
            self._rules[key] = rule if dev.type == "cpu" else rule.to(dev)
        return self._rules[key]

    def model_spec(self, sizes: dict[str, int], strategy: Any) -> dict[str, Any]:
        """A decode case's model: ``core:lm`` around the case's rule, run by ``strategy``."""
        model = {**DECODE_MODEL, "d_model": sizes["H"] * sizes["Dk"], "heads": sizes["H"]}
        return {"schema": "atlas/1", "name": f"bench-{self.name}", "model": model,
                "memory": {**self.spec, "parallel": strategy}}


def get_case(name: str) -> Case:
    if name not in RULES:
        from ..errors import did_you_mean

        hint = did_you_mean(name, RULES) or f"choose from {', '.join(RULES)}"
        raise ValueError(f"unknown benchmark rule {name!r}; {hint}")
    title, spec = RULES[name]
    kind = "layer" if name in LAYER_CASES else "decode" if name in DECODE_CASES else "rule"
    return Case(name, title, dict(spec), kind, dict(LAYER_PARAMS.get(name, {})))


@dataclass
class Inputs:
    """One call's tensors. Rule cases: q, k, v, gates; layer cases: x. ``dy`` is the output
    gradient fed to backward."""

    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    v: torch.Tensor | None = None
    gates: dict[str, torch.Tensor] = field(default_factory=dict)
    x: torch.Tensor | None = None
    dy: torch.Tensor | None = None

    def leaves(self) -> list[torch.Tensor]:
        ts = [self.q, self.k, self.v, *self.gates.values(), self.x]
        return [t for t in ts if t is not None]

    def requires_grad_(self, flag: bool = True) -> "Inputs":
        for t in self.leaves():
            t.requires_grad_(flag)
        return self

    def zero_grad(self) -> None:
        for t in self.leaves():
            t.grad = None


    def to(self, device: torch.device | str) -> "Inputs":
        """The same inputs on ``device`` (new leaf tensors; the CPU ones themselves on the CPU)."""
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Inputs(q=move(self.q), k=move(self.k), v=move(self.v),
                      gates={n: move(g) for n, g in self.gates.items()}, x=move(self.x), dy=move(self.dy))


def make_inputs(case: Case, gate_names, *, B: int, T: int, H: int, Dk: int, Dv: int,
                dtype=torch.float32, seed: int = 0, device: torch.device | str | None = None) -> Inputs:
    """The case's inputs (module docstring), drawn on the CPU from ``seed`` and then moved to
    ``device`` (None: the CPU), so that every device sees the same numbers."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)

    if case.kind == "layer":
        inp = Inputs(x=rand(B, T, H * Dk), dy=rand(B, T, H * Dk))
    elif case.kind == "decode":  # token ids: a prompt of T tokens (the decoded tokens: `decode_tokens`)
        vocab = DECODE_MODEL["vocab_size"]
        inp = Inputs(x=torch.randint(0, vocab, (B, T), generator=g))
    else:
        q = torch.nn.functional.normalize(rand(B, T, H, Dk), dim=-1)
        k = torch.nn.functional.normalize(rand(B, T, H, Dk), dim=-1)
        gates = {}
        for name in gate_names:
            lo, hi = GATE_RANGES.get(name, (0.0, 1.0))
            gates[name] = (lo + (hi - lo) * torch.rand(B, T, H, generator=g, dtype=torch.float64)).to(dtype)
        inp = Inputs(q=q, k=k, v=rand(B, T, H, Dv), gates=gates, dy=rand(B, T, H, Dv))
    if device is None or torch.device(device).type == "cpu":
        return inp
    return inp.to(device)
