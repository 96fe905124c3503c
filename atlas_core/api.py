"""The Python API of training: `train` a spec, `load` a trained model.

    import atlas_core as ac

    run = ac.train("examples/mqar_default.toml", steps=200, lr=1e-3,
                   **{"model.d_model": 32}, out="runs/small")
    run.run_dir, run.metrics["accuracy"], run.spec.model["d_model"]
    model = run.model                      # the trained model, eval mode (loaded from the run)

    model = ac.load("runs/small")          # a run directory (its latest checkpoint) or a checkpoint
    model.spec, model.codec, model.trained_steps   # resolved spec, text codec (or None), step

`train` is what ``atlas train`` runs (the command only parses its arguments and prints the
result). Its overrides are applied to the spec before validation, exactly as the command's
``KEY.PATH=VALUE`` words are (`atlas_core.spec.overrides`):

- the common options ``steps``, ``lr``, ``batch_size``, ``seq_len``, ``seed``, ``device`` set the
  ``[train]`` keys of the same name;
- any other keyword is a dotted path, given with ``**{"model.d_model": 64}`` (a table value
  replaces the table at that path: ``**{"train.task": {"use": "copy"}}``), or a top-level section
  given as a table, ``model={"d_model": 64}`` (which sets each key it names, here
  ``model.d_model`` only, and keeps the other keys of ``[model]``), or ``name="small"``;
- ``overrides=["train.lr=1e-3", ...]`` takes the command line's text form (values are TOML
  literals).

The order is ``overrides`` first, then the keywords, then the common options: the later of two
overrides of the same path wins. A bad override raises the `SpecError` a bad file would, with
each problem naming the override that set it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from .errors import SpecError

if TYPE_CHECKING:  # the spec package sits on top of the core: loaded when a call needs it
    from .spec.overrides import Override

# the keys of a finished run's result that `Run.metrics` holds
METRIC_KEYS = ("steps", "accuracy", "eval_loss", "perplexity", "eval_tokens", "params", "time_s",
               "tokens_per_s")


@dataclass
class Run:
    """A finished training run: where it is, what it measured, and (loaded on first use) the
    trained model and the resolved spec saved with it."""

    result: dict[str, Any]  # everything `atlas train --format json` prints
    _model: Any = field(default=None, repr=False)
    _spec: Any = field(default=None, repr=False)

    @property
    def run_dir(self) -> Path:
        return Path(self.result["run_dir"])

    @property
    def checkpoint(self) -> Path | None:
        """The final checkpoint directory (None only on a non-main data-parallel rank)."""
        ckpt = self.result.get("checkpoint")
        return Path(ckpt) if ckpt else None

    @property
    def metrics(self) -> dict[str, Any]:
        """The final held-out evaluation and run totals: accuracy, eval_loss, perplexity, ..."""
        return {k: self.result[k] for k in METRIC_KEYS if k in self.result}

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every record of the run's ``metrics.jsonl`` (train, eval and run events)."""
        from .train.metrics import METRICS_FILE, read_metrics

        return read_metrics(self.run_dir / METRICS_FILE)

    @property
    def spec(self):
        """The resolved spec the run trained (its ``spec.toml``, overrides included)."""
        if self._spec is None:
            from .spec import load_spec

            self._spec = load_spec(self.run_dir / "spec.toml")
        return self._spec

    @property
    def model(self):
        """The trained model in eval mode on the CPU, loaded from the final checkpoint (`load`)."""
        if self._model is None:
            if self.checkpoint is None:
                raise ValueError("this process saved no checkpoint (a non-main data-parallel rank)")
            self._model = load(self.checkpoint, device="cpu")
        return self._model

    def __repr__(self) -> str:
        acc = self.result.get("accuracy")
        return f"Run({str(self.run_dir)!r}, steps={self.result.get('steps')}, accuracy={acc})"


def collect_overrides(overrides: Iterable[str | Override] | None = None,
                      keywords: Mapping[str, Any] | None = None,
                      **common: Any) -> list[Override]:
    """Every override of a `train` call, in the order they apply (module docstring)."""
    from .spec.model import TOP_LEVEL_KEYS
    from .spec.overrides import Override, flag_overrides, from_mapping, parse_overrides

    out: list[Override] = []
    texts = [o for o in overrides or () if not isinstance(o, Override)]
    parsed = iter(parse_overrides(texts))
    for o in overrides or ():  # keep the given order of texts and Override objects
        out.append(o if isinstance(o, Override) else next(parsed))
    for key, value in (keywords or {}).items():
        head = key.split(".", 1)[0]
        if "." not in key and key not in TOP_LEVEL_KEYS:
            raise TypeError(_unknown_keyword(key))
        if head not in TOP_LEVEL_KEYS:
            raise TypeError(_unknown_keyword(key))
        out.extend(from_mapping({key: value}))
    out.extend(flag_overrides(**common))
    return out


def _unknown_keyword(key: str) -> str:
    from .errors import did_you_mean
    from .spec.model import TOP_LEVEL_KEYS
    from .spec.overrides import COMMON_FLAGS

    head = key.split(".", 1)[0]
    hint = did_you_mean(head, [*TOP_LEVEL_KEYS, *COMMON_FLAGS])
    if hint is None and "." not in key:
        from .train.params import TrainParams

        if key in TrainParams.model_fields:
            hint = f"did you mean **{{'train.{key}': ...}}?"
    return (f"train() got an unexpected keyword {key!r}: overrides are dotted paths into the spec "
            f"(**{{'model.d_model': 64}}), sections ({', '.join(TOP_LEVEL_KEYS)}) or the common "
            f"options ({', '.join(COMMON_FLAGS)})" + (f"; {hint}" if hint else ""))


def _spec_to_train(spec: Any, ovs: list[Override]) -> Any:
    """What `TrainOptions.spec` gets: ``spec`` as given when there is no override, else the
    resolved `Spec` with the overrides applied (resolved here, once: training uses it as it is)."""
    from .spec.model import Spec
    from .spec.overrides import load_with_overrides
    from .train.setup import check_spec_file

    if not ovs:
        if isinstance(spec, Spec):
            return spec
        return str(spec) if isinstance(spec, Path) else spec
    if spec is None:
        from .train.setup import default_spec_text

        return load_with_overrides(default_spec_text(), ovs)
    check_spec_file(spec)
    return load_with_overrides(Path(spec) if isinstance(spec, str) and "\n" not in spec else spec,
                               ovs)


def _resumed(opts: Any, ovs: list[Override]) -> Any:
    """``opts`` of a resume without SPEC, prepared (`atlas_core.train.launch.prepare`: the run
    directory read once), its spec the run's own (an unsaved run's ``spec.toml``, else the
    checkpoint's, with the checks `make_plan` makes of it) with ``ovs`` applied."""
    import dataclasses

    from .train.launch import prepare
    from .train.setup import refuse_stored_files

    opts = prepare(opts)
    spec = opts.spec
    if spec is None:
        ckpt = opts.checkpoint
        refuse_stored_files(ckpt.spec, str(ckpt.path / "spec.toml"), opts.resume, ckpt.meta)
        spec = ckpt.spec
    return dataclasses.replace(opts, spec=_override_resolved(spec, ovs))


def _override_resolved(spec: Any, ovs: list[Override]) -> Any:
    """The resolved ``spec`` with ``ovs`` applied: overrides of ``[train]`` alone validate that
    table again (`with_train`; the other tables are resolved already), any other is resolved
    whole."""
    from .spec.overrides import annotate, apply_overrides, load_with_overrides
    from .spec.resolve import with_train

    if any(o.path[0] != "train" or len(o.path) < 2 for o in ovs):
        return load_with_overrides(spec, ovs)
    try:
        return with_train(spec, apply_overrides({"train": dict(spec.train or {})}, ovs)["train"])
    except SpecError as exc:
        raise annotate(exc, ovs, spec.source) from None


def _launch_options() -> set[str]:
    """The `TrainOptions` fields that choose how a run is launched (e.g. the data-parallel
    engine) rather than what it trains: `train` passes them through as keywords."""
    import dataclasses

    from .spec.overrides import COMMON_FLAGS
    from .train.setup import TrainOptions

    spec_keys = {"spec", "out", "resume", "progress", "run_dir_checked", "prepared", "checkpoint",
                 "note", *COMMON_FLAGS}
    return {f.name for f in dataclasses.fields(TrainOptions)} - spec_keys


def train(
    spec: Any = None,
    /,
    *,
    out: str | Path | None = None,
    resume: str | Path | None = None,
    nproc: int = 1,
    progress: bool = False,
    on_step: Callable[[Any], None] | None = None,
    overrides: Iterable[str | Override] | None = None,
    steps: int | None = None,
    lr: float | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    seed: int | None = None,
    device: str | None = None,
    **keywords: Any,
) -> Run:
    """Train ``spec`` (a ``.toml`` path, TOML text, a dict or a `Spec`; None: the embedded MQAR
    spec, or with ``resume`` the checkpoint's) and return the finished `Run`.

    ``out``: the run directory (default ``runs/<name>``, the first free one); ``resume``: a run or
    checkpoint directory to continue; ``nproc``: data-parallel processes; ``progress``: the
    progress bar on stderr; ``on_step(trainer)``: called after every step (one process only).
    Other keywords that name a launch option of `atlas_core.train.setup.TrainOptions` (such as
    the data-parallel engine) are passed to it. Overrides: see the module docstring. Ctrl-C saves a checkpoint and raises
    `atlas_core.train.errors.TrainingInterrupted`."""
    import dataclasses

    from .train.setup import TrainOptions
    from .train.launch import train as run_training

    launch = {k: keywords.pop(k) for k in list(keywords) if k in _launch_options()}
    ovs = collect_overrides(overrides, keywords, steps=steps, lr=lr, batch_size=batch_size,
                            seq_len=seq_len, seed=seed, device=device)
    resume_s = str(resume) if resume is not None else None
    out_s = str(out) if out is not None else None
    opts = TrainOptions(out=out_s, resume=resume_s, progress=progress, **launch)
    if spec is None and resume_s and ovs:  # the spec the run resumes with: the checkpoint's own
        opts = _resumed(opts, ovs)
    else:
        opts = dataclasses.replace(opts, spec=_spec_to_train(spec, ovs))
    return Run(run_training(opts, nproc=nproc, on_step=on_step))


def load(run_or_checkpoint: str | Path, device: str = "cpu", dtype: Any = "float32"):
    """The trained model of a run directory (its latest checkpoint) or a checkpoint directory, in
    eval mode on ``device`` (``cpu``, ``cuda`` or ``auto``), its weights in ``dtype``
    (``"float32"``, ``"bfloat16"``, ``"float16"``, ``"float64"`` or a ``torch.dtype``: built in that
    dtype and filled from the checkpoint piece by piece; a parameter-free memory rule keeps its
    state in float32), with these attributes:

    - ``spec``: the resolved spec it was trained from;
    - ``codec``: the text codec (`atlas_core.train.codec.TextCodec`: ``encode`` / ``decode``) of
      a model trained on text, else None;
    - ``tokenizer``: the subword tokenizer (``tokenizers.Tokenizer``) of a model trained with one
      (text ``mode = "bpe"``), else None;
    - ``checkpoint``: the checkpoint directory; ``trained_steps``: its step; ``task``: the
      training task as recorded (``{"use": ..., "params": ...}``) or None.

    The checkpoint is verified before anything is built (a missing, corrupt or forged checkpoint
    is one `CheckpointError`)."""
    from .decode.load import load_for_inference

    return load_for_inference(run_or_checkpoint, dtype=dtype, device=device)


__all__ = ["Run", "collect_overrides", "load", "train"]
