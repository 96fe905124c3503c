"""Train flash-linear-attention's own models in the MQAR comparison's harness (docs/mqar_comparison.md).

    OMP_NUM_THREADS=1 python benchmarks/mqar/fla_models.py delta_net --seed 0
    OMP_NUM_THREADS=1 python benchmarks/mqar/fla_models.py gated_deltanet --seed 1
    OMP_NUM_THREADS=1 python benchmarks/mqar/fla_models.py gla --seed 2       # also kda, gated_deltaproduct
    OMP_NUM_THREADS=1 python benchmarks/mqar/fla_models.py delta_net --seed 0 --atlas

fla 0.6.0's ``<Family>ForCausalLM`` (its config defaults, sized like the zoo suite: vocab 64,
hidden 64, 2 layers, 4 heads: of 16 for the delta rules and KDA, GLA's defaults expand_k 0.5 /
expand_v 1, i.e. keys of 8 and values of 16; Gated DeltaProduct with the preset's 2 Householder steps
and forget gate) is trained by atlas's own trainer (`atlas_core.train`) on the
zoo suite's spec (``benchmarks/mqar/zoo/<preset>.toml``: the same MQAR batches, optimiser, schedule,
steps and evaluation); only the model differs: `atlas_core.model.build_model` is replaced, in this
process, by one that returns fla's model. fla's layers call Triton kernels, which need a GPU, so
they run with their entry points replaced by the pure-PyTorch code of tests/fla_oracle/oracle.py
(checked against fla's own naive references by tests/fla_oracle/test_oracle.py). Needs the test
extra (flash-linear-attention). Prints one Markdown row.

``--atlas`` trains, instead, the atlas model that ``atlas import-fla`` makes of fla's model (the
same function for the same weights: tests/fla_oracle/test_import_fla.py) starting from fla's own
initial weights for the seed: the same initial weights, batches and optimiser as fla's run, so
any difference between the two runs comes from the arithmetic, not the draw.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
#: family -> (the zoo suite's spec whose [train] table is used, fla's model class names, config)
FAMILIES = {
    "delta_net": ("deltanet", "DeltaNet", {}),
    "gated_deltanet": ("gated_deltanet", "GatedDeltaNet", {"head_dim": 16}),
    "gla": ("gla", "GLA", {}),
    "kda": ("kda", "KDA", {"head_dim": 16}),
    # the preset's rule: 2 Householder steps a token and the forget gate (fla's defaults: 1, off)
    "gated_deltaproduct": ("gated_delta_product", "GatedDeltaProduct",
                           {"head_dim": 16, "num_householder": 2, "use_forget_gate": True}),
}


class FlaLM:
    """fla's causal LM as the trainer sees a model: ``model(ids) -> logits``."""

    def __new__(cls, fla_model):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.fla = inner
                self.vocab_size = inner.config.vocab_size

            def check_ids(self, ids):
                return None

            def forward(self, ids, cu_seqlens=None):
                if cu_seqlens is not None:
                    raise NotImplementedError("packed documents are not wired for fla's models here")
                return self.fla(input_ids=ids).logits

        return Wrapped(fla_model)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("family", choices=sorted(FAMILIES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], help="a config override key=value (JSON value)")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the spec's)")
    ap.add_argument("--atlas", action="store_true",
                    help="train fla's model as `atlas import-fla` maps it (core:lm with the family's preset "
                    "and fla's layer options), starting from fla's initial weights for this seed")
    args = ap.parse_args(argv)

    import json

    import torch

    sys.path.insert(0, str(ROOT))
    import atlas_core.model as atlas_model
    import fla.models as fm
    from atlas_core.spec import load_spec
    from atlas_core.train.setup import TrainOptions
    from atlas_core.train.launch import train
    from tests.fla_oracle.oracle import fla_on_cpu

    preset, name, extra = FAMILIES[args.family]
    overrides = {k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)}
    config = getattr(fm, f"{name}Config")(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_heads=4,
                                          **extra, **overrides)
    model_cls = getattr(fm, f"{name}ForCausalLM")

    build_atlas = atlas_model.build_model

    def build_fla(spec, **kw):
        torch.manual_seed(int(spec.train.get("seed", 0)) if getattr(spec, "train", None) else 0)
        model = model_cls(config)
        if not args.atlas:
            return FlaLM(model)
        from atlas_core.fla_import import family_for, spec_for, state_dict_for

        cfg = json.loads(config.to_json_string())
        fam = family_for(cfg)
        mapped = spec_for(cfg, fam, name=f"atlas-{args.family}")
        mapped["memory"]["parallel"] = spec.memory["parallel"]  # the zoo spec's exact strategy
        atlas = build_atlas(load_spec(mapped), **kw)
        atlas.load_state_dict(state_dict_for(cfg, fam, model.state_dict()), strict=True)
        return atlas

    spec = load_spec(HERE / "zoo" / f"{preset}.toml").to_dict()
    spec["train"] = {**spec["train"], "seed": args.seed, "eval_every": 0}
    if args.steps is not None:
        spec["train"]["steps"] = args.steps
    spec["name"] = f"{'atlas' if args.atlas else 'fla'}-{args.family}"
    atlas_model.build_model = build_fla
    with fla_on_cpu(), tempfile.TemporaryDirectory() as tmp:
        result = train(TrainOptions(spec=spec, out=str(Path(tmp) / "run"), progress=False))
    label = (f"fla {name}ForCausalLM" + (" as atlas imports it, from fla's init" if args.atlas else "")
             + (f" ({', '.join(args.set)})" if args.set else ""))
    print(f"| {label} | seed {args.seed} | {result['params']:,} | {result['accuracy']:.3f} | "
          f"{result['eval_loss']:.3f} | {result['time_s']:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
