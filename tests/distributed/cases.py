"""Rules, inputs and the loss shared by the context-parallel tests and their worker processes."""

from __future__ import annotations

import torch

import atlas_core as ac

B, H, D, T = 2, 2, 4, 30
CASES_EXACT = {
    "titans": {"use": "titans:titans"},
    "delta": {"structure": "core:linear", "bias": "core:l2", "algorithm": "core:gd"},
    "omeganet": {"use": "omega:omeganet"},
    "gated_deltanet": {"use": "zoo:gated_deltanet"},
    "gated_delta_product": {"use": "zoo:gated_delta_product"},
}
CASES = {
    "titans": {"use": "titans:titans"},
    "titans_anchor4": {"use": "titans:titans", "anchor": 4},
    "delta": {"structure": "core:linear", "bias": "core:l2", "algorithm": "core:gd"},
    "omeganet": {"use": "omega:omeganet"},
    # the gradient at the decayed memory (affine too, chosen from the knobs' declared traits)
    "gated_deltanet": {"use": "zoo:gated_deltanet"},
    "titans_deep_anchor4": {"use": "titans:titans_deep", "anchor": 4},
    # per-key decay (state_map's key form)
    "kda": {"use": "zoo:kda"},
    # momentum with a per-key decay: affine, no chunk form in state_map (the map is probed)
    "key_momentum": {"structure": "core:linear", "bias": "core:l2", "algorithm": "core:momentum",
                     "retention": "zoo:key_decay"},
    # two sub-steps a token: the map's positions are sub-steps
    "gated_delta_product": {"use": "zoo:gated_delta_product"},
    # under core:exact_chunk each rank forms the chunk pieces once, for its map and its own run
    # (chunks of 4: the slices of 15, 8 and 7 tokens end in a padded chunk)
    **{f"{name}_exact": {**CASES_EXACT[name], "parallel": {"use": "core:exact_chunk", "chunk_size": 4}}
       for name in ("titans", "delta", "omeganet", "gated_deltanet", "gated_delta_product")},
}


def build(name: str):
    torch.manual_seed(0)
    rule = ac.build_rule(dict(CASES[name]), heads=H, d_key=D, d_value=D).double()
    for p in rule.parameters():  # move learned parameters off their initial values
        with torch.no_grad():
            p.add_(0.1 * torch.randn_like(p))
    return rule


def inputs(rule, seed: int = 1, tokens: int = T, pos: int = 1) -> dict:
    """q, k, v, gates for the whole sequence (``tokens`` long), a random initial state (an
    anchored rule's at position ``pos`` of its block) and the loss weights."""
    T = tokens
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    n = rule.steps_per_token  # k, v and the step gates: [B, T, n, ...] with sub-steps
    sub = (n,) if n > 1 else ()
    q = torch.nn.functional.normalize(rnd(B, T, H, D), dim=-1)
    k = torch.nn.functional.normalize(rnd(B, T, *sub, H, D), dim=-1)
    v = rnd(B, T, *sub, H, D)
    gates = {}
    for name in rule.gate_names:
        per_key = (D,) if rule._gate_shapes.get(name) == "key" else ()
        x = torch.rand(B, T, *(sub if name in rule.step_gates else ()), H, *per_key, generator=g,
                       dtype=torch.float64)
        gates[name] = 0.05 + 0.15 * x if name == "theta" else 0.6 + 0.35 * x
    state = {}
    for key, x in rule.init_state(B, dtype=torch.float64).items():
        if key == "anchor.pos":
            state[key] = x
        elif key == "window.gamma":
            state[key] = torch.rand(x.shape, generator=g, dtype=torch.float64)
        else:
            state[key] = x + 0.3 * rnd(*x.shape)
    if "anchor.pos" in state:  # start inside an anchor block: its memory is the carried one
        state["anchor.pos"] = torch.full((B,), float(pos % rule.anchor), dtype=torch.float64)
    wy = rnd(B, T, H, D)
    ws = {key: rnd(*x.shape) for key, x in state.items() if key != "anchor.pos"}
    return {"q": q, "k": k, "v": v, "gates": gates, "state": state, "wy": wy, "ws": ws}


def loss(y, final, wy, ws) -> torch.Tensor:
    """A loss reading every output and (when ``final`` is given) every final state entry."""
    out = (y * wy).sum()
    if final is not None:
        out = out + sum((final[key] * w).sum() for key, w in ws.items())
    return out


def leaves(x: dict) -> dict:
    out = {}
    for key in ("q", "k", "v"):
        out[key] = x[key].detach().clone().requires_grad_(True)
    out["gates"] = {n: t.detach().clone().requires_grad_(True) for n, t in x["gates"].items()}
    out["state"] = {n: t.detach().clone().requires_grad_(n != "anchor.pos")
                    for n, t in x["state"].items()}
    return out


def grads(rule, lv: dict) -> dict:
    """Named gradients after a backward: inputs, gates, initial state, parameters."""
    out = {key: lv[key].grad for key in ("q", "k", "v")}
    out.update({f"gates.{n}": t.grad for n, t in lv["gates"].items()})
    out.update({f"state.{n}": t.grad for n, t in lv["state"].items() if n != "anchor.pos"})
    out.update({f"param.{n}": p.grad for n, p in rule.named_parameters()})
    return out


def reference(name: str) -> dict:
    """One call on the whole sequence in one process: y, final state, gradients."""
    rule = build(name)
    x = inputs(rule)
    lv = leaves(x)
    y, final = rule(lv["q"], lv["k"], lv["v"], gates=lv["gates"] or None, state=lv["state"],
                    strategy="core:sequential")  # the rule's reference loop
    loss(y, final, x["wy"], x["ws"]).backward()
    return {"y": y.detach(), **{f"final.{k}": t.detach() for k, t in final.items()},
            **grads(rule, lv)}


def parallel(name: str, info) -> dict:
    """This rank's part of the context-parallel run, gathered on every rank (same keys as
    `reference`)."""
    import torch.distributed as dist

    from atlas_core.distributed import context_parallel

    rule = build(name)
    x = inputs(rule)
    lv = leaves(x)
    R, r = info.world, info.rank

    def part(t):  # this rank's slice along time
        return t.tensor_split(R, dim=1)[r]

    y, final = context_parallel(rule, part(lv["q"]), part(lv["k"]), part(lv["v"]),
                                {n: part(t) for n, t in lv["gates"].items()}, lv["state"])
    loss(y, final if r == R - 1 else None, part(x["wy"]), x["ws"]).backward()
    g = grads(rule, lv)
    mine = {"y": y.detach(), "final": {k: t.detach() for k, t in final.items()}, "grads": g}
    every = [None] * R
    dist.all_gather_object(every, mine)
    out = {"y": torch.cat([e["y"] for e in every], dim=1)}
    out.update({f"final.{k}": t for k, t in every[-1]["final"].items()})
    for key in g:
        parts = [e["grads"][key] for e in every]
        if key in ("q", "k", "v") or key.startswith("gates."):  # each rank holds its slice's
            out[key] = torch.cat([p.tensor_split(R, dim=1)[i] for i, p in enumerate(parts)], dim=1)
        elif key.startswith("state."):  # the initial state is rank 0's
            out[key] = parts[0]
        else:  # parameters: each rank holds its slice's contribution
            out[key] = sum(p for p in parts if p is not None)
    return out


def run_all(names, info) -> dict:
    """Every case; tensors as numpy arrays (a tensor handed between processes would be shared
    memory that ends with the worker)."""
    def arrays(d):
        return {k: (None if t is None else t.numpy()) for k, t in d.items()}

    out = {name: arrays(parallel(name, info)) for name in names}
    out["lm"] = arrays(lm_parallel(info))
    return out


LM_SPEC = {
    "schema": "atlas/1",
    "name": "cp-lm",
    "model": {"arch": "core:lm", "vocab_size": 16, "d_model": 16, "depth": 2, "heads": 2,
              "mlp_ratio": 2.0},
    "memory": {"use": "titans:titans"},
}


def lm_reference(spec: dict = LM_SPEC, tokens: int = T) -> dict:
    """A model's logits on whole sequences and the gradients of a loss over them."""
    from atlas_core.model import build_model
    from atlas_core.spec import load_spec

    torch.manual_seed(0)
    model = build_model(load_spec(spec)).double()
    ids = torch.randint(0, 16, (B, tokens), generator=torch.Generator().manual_seed(3))
    w = torch.randn(B, tokens, 16, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    return model, ids, w


def lm_whole() -> dict:
    model, ids, w = lm_reference()
    logits = model(ids)
    (logits * w).sum().backward()
    return {"logits": logits.detach(),
            **{f"param.{n}": p.grad for n, p in model.named_parameters()}}


def lm_parallel(info) -> dict:
    """The same with `atlas_core.distributed.lm.enable`: each rank runs its time slice."""
    import torch.distributed as dist

    from atlas_core.distributed.lm import enable, time_slice

    model, ids, w = lm_reference()
    assert enable(model) == 2
    R, r = info.world, info.rank
    logits = model(time_slice(ids, r, R))
    (logits * time_slice(w, r, R)).sum().backward()
    every = [None] * R
    dist.all_gather_object(every, logits.detach())
    out = {"logits": torch.cat(every, dim=1)}
    for n, p in model.named_parameters():
        g = p.grad.clone()
        dist.all_reduce(g)
        out[f"param.{n}"] = g
    return out
