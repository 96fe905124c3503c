"""``atlas spec validate|show``: check TOML specs and print them resolved.

Both take ``KEY.PATH=VALUE`` overrides after the file(s) (`atlas_core.spec.overrides`), so
``atlas spec show FILE model.d_model=64`` previews what ``atlas train FILE model.d_model=64`` trains.

Validation resolves the spec (which builds the memory rule without sizes to run every composition
check), then builds the model on the ``meta`` device (shapes only, no memory) so that the checks an
architecture makes when it is built are reported too: a memory rule it cannot host, sizes a layer
refuses (an MRU head size that is not a perfect square, a deep memory whose residual cannot add).
It then builds the ``[train]`` task as ``atlas train`` does before it starts, reading its data
files (relative to the working directory, as training does), so a missing or empty corpus, a
vocabulary the model cannot hold or a sequence length the text cannot fill fails validation with
the message training gives. A spec that validates therefore builds. Sizes are bounded (`atlas_core.spec.bounds`), and the
parameter count is checked before the model is built (from builds of one and two blocks; a model
of more than 64 blocks is checked through those alone). It imports torch but no kernels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from .common import AtlasTyper, Failed, FormatOption, OutputFormat, emit, examples, out_console, resolve_format
from .overrides import OVERRIDES_HELP, overrides_of, split_words

#: Validation builds a model of at most this many blocks whole on the meta device; a deeper one is
#: checked through the one- and two-block builds of the parameter-count preflight.
WHOLE_BUILD_DEPTH = 64

spec_app = AtlasTyper(help="Validate specs and show them resolved (every default filled).")


def _issue_dict(issue) -> dict[str, Any]:
    value = issue.value
    if value is not None and not isinstance(value, (str, int, float, bool, list, dict)):
        value = repr(value)
    return {"path": issue.path, "message": issue.message, "value": value, "hint": issue.hint,
            "text": issue.render()}


def validate_file(path: str, overrides: list | None = None) -> dict[str, Any]:
    """{file, ok, name, arch, spec_hash, errors}: one spec file checked (with ``overrides``
    applied, `atlas_core.spec.overrides`)."""
    from atlas_core.errors import AtlasError, Issue, SpecError
    from atlas_core.spec import SpecFileError
    from atlas_core.spec.overrides import load_with_overrides

    row: dict[str, Any] = {"file": path, "ok": False, "name": None, "arch": None,
                           "spec_hash": None, "errors": []}
    try:
        spec = load_with_overrides(Path(path), overrides or [])
    except SpecFileError as exc:
        row["errors"] = [{"path": "", "message": exc.message, "value": None, "hint": exc.hint,
                          "line": exc.line, "column": exc.column, "text": str(exc)}]
        return row
    except SpecError as exc:
        row["errors"] = [_issue_dict(i) for i in exc.issues]
        return row
    except (AtlasError, ValueError) as exc:  # e.g. a factory that refused its params
        row["errors"] = [_issue_dict(Issue("", str(exc)))]
        return row
    row.update(name=spec.name, arch=spec.arch, spec_hash=spec.spec_hash)
    # the checks of a valid spec that training makes before it starts, all of them in one pass:
    # the model built on the meta device, and the task built for the model's vocabulary
    from atlas_core.spec.overrides import annotate

    issues = []
    for check, fallback in ((_build_on_meta, "model"), (_check_task, "train.task")):
        try:
            check(spec)
        except SpecError as exc:
            issues += annotate(exc, overrides or []).issues
        except (AtlasError, ValueError) as exc:
            # the task's own message, as `atlas train` prints it; the model's, introduced
            issues.append(Issue(fallback, str(exc) if fallback == "train.task"
                                else f"the model does not build: {exc}"))
    row["errors"] = [_issue_dict(i) for i in issues]
    row["ok"] = not issues
    return row


def _check_task(spec) -> None:
    """Build the ``[train]`` task as `atlas train` does before it starts (`make_plan`): the same
    call, so the same checks and the same messages: a data file that is missing, empty or not
    text, a vocabulary larger than the model's, a sequence length the data cannot fill. Files
    are read relative to the working directory, as training reads them."""
    if spec.train is None:
        return
    from atlas_core.train.evaluate import build_task
    from atlas_core.train.params import train_params

    params = train_params(spec.train)
    build_task(params.task, int(spec.model.get("vocab_size", 0)), params.seq_len)


def _build_on_meta(spec) -> None:
    """Build the model without allocating memory: the architecture's own checks run (after the
    parameter-count preflight, so that an enormous model is refused before it is built)."""
    import torch

    from atlas_core.model import build_model
    from atlas_core.preflight import check_model_size

    check_model_size(spec)  # builds one and two blocks on meta: their checks ran
    depth = spec.model.get("depth")
    if isinstance(depth, int) and depth > WHOLE_BUILD_DEPTH:
        return  # hundreds of blocks built like those two: only their count would differ
    with torch.device("meta"):
        build_model(spec)


@spec_app.command(
    "validate",
    epilog=examples("atlas spec validate examples/titans_lmm.toml",
                    "atlas --format json spec validate examples/*.toml"),
)
def validate(
    words: Annotated[list[str], typer.Argument(
        metavar="FILE KEY.PATH=VALUE",
        help="spec files (.toml), then " + OVERRIDES_HELP + ", applied to every file")],
    fmt: FormatOption = None,
) -> None:
    """Validate spec files; every error is listed. Exit 1 if any file has an error."""
    files, texts = split_words(words)
    if not files:
        raise typer.BadParameter("give at least one spec FILE (.toml)")
    overrides = overrides_of(texts)
    rows = [validate_file(f, overrides) for f in files]

    def human(rows):
        from rich.markup import escape

        con = out_console()
        for r in rows:
            if r["ok"]:
                con.print(f"[green]ok[/]  {escape(r['file'])}  name={escape(r['name'])} "
                          f"arch={escape(r['arch'])} spec_hash={r['spec_hash']}")
            else:
                n = len(r["errors"])
                con.print(f"[red]error[/]  {escape(r['file'])}: {n} problem{'s' if n != 1 else ''}")
                for e in r["errors"]:
                    text = e["text"]
                    if e.get("line") is None and text.startswith(r["file"] + ":"):
                        text = text[len(r["file"]) + 1:].lstrip()
                    con.print(f"  - {text}", markup=False)

    emit(rows, fmt, human)
    if not all(r["ok"] for r in rows):
        raise Failed()


@spec_app.command(
    "show",
    epilog=examples("atlas spec show examples/titans_lmm.toml",
                    "atlas spec show examples/titans_lmm.toml model.d_model=64 train.lr=1e-3",
                    "atlas --format json spec show examples/titans_lmm.toml"),
)
def show(
    words: Annotated[list[str], typer.Argument(
        metavar="FILE KEY.PATH=VALUE", help="a spec file (.toml), then " + OVERRIDES_HELP)],
    fmt: FormatOption = None,
) -> None:
    """Print the resolved spec (every default filled): TOML, or JSON with --format json.

    The TOML starts with comments naming its spec_hash and the strategy that runs it with its
    distribution; the JSON carries the same under "_resolved" (not a spec table).
    """
    import sys

    from atlas_core.spec.overrides import load_with_overrides

    files, texts = split_words(words, at_most=1, what="FILE")
    if not files:
        raise typer.BadParameter("give a spec FILE (.toml)")
    spec = load_with_overrides(Path(files[0]), overrides_of(texts))
    if resolve_format(fmt) is OutputFormat.json:
        from atlas_core.strategies.trust import parallel_info

        about = {"spec_hash": spec.spec_hash, "parallel": parallel_info(spec.memory.get("parallel"))}
        emit({**spec.to_dict(), "_resolved": about}, fmt)
    else:
        sys.stdout.write(spec.to_toml())


def register(app) -> None:
    app.add_typer(spec_app, name="spec")
