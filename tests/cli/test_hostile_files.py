"""Hostile files: every command that takes a spec or a checkpoint gives one clean error, fast.

A path to ``/dev/zero``, a directory, a FIFO, a 10 GiB sparse file (no disk used) or a forged
checkpoint must end in exit 1 and one message naming the path, the problem and the fix, with no
traceback, within a second, in bounded memory. The commands run through `atlas_cli.main.run` (the
``atlas`` entry point) in one child process whose address space is capped at 4 GiB, so a
regression that reads such a file whole fails with a MemoryError instead of taking the machine.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from atlas_core.spec import dump_toml, load_spec
from atlas_cli.main import make_app

TEN_GIB = 10 * 2**30
MEMORY_CAP = 4 * 2**30

SPEC = {
    "schema": "atlas/1",
    "name": "tiny",
    "model": {"arch": "titans:lmm", "vocab_size": 16, "d_model": 16, "depth": 1, "heads": 2},
    "memory": {"structure": "core:linear", "bias": "core:l2", "retention": "core:none",
               "algorithm": "core:gd", "parallel": "core:sequential"},
    "train": {"task": {"use": "mqar", "num_pairs": 2, "seq_len": 16}, "steps": 2,
              "batch_size": 4, "eval_every": 0, "eval_batches": 1, "log_every": 1,
              "device": "cpu"},
}

runner = CliRunner()


def _sparse(path: Path, size: int = TEN_GIB) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)  # a hole: costs no disk
    return path


def _remanifest(ckpt: Path, skip_hash: tuple[str, ...] = ()) -> None:
    """Make the manifest agree with the (edited) files, as a forger would."""
    from atlas_core.train.checkpoint import arch_hash

    manifest = json.loads((ckpt / "manifest.json").read_text())
    for name in manifest["files"]:
        f = ckpt / name
        entry = {"bytes": f.stat().st_size, "sha256": "0" * 64}
        if name not in skip_hash:
            entry["sha256"] = hashlib.sha256(f.read_bytes()).hexdigest()
        manifest["files"][name] = entry
    spec = load_spec((ckpt / "spec.toml").read_text())
    manifest["spec_hash"], manifest["arch_hash"] = spec.spec_hash, arch_hash(spec)
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Hostile paths by name, and a real checkpoint with forged copies."""
    import shutil

    from atlas_core.model import build_model
    from atlas_core.train.checkpoint import save_checkpoint
    from atlas_core.train.checkpoint_meta import CheckpointMeta, task_record
    from atlas_core.train.evaluate import build_task

    root = tmp_path_factory.mktemp("hostile")
    spec = root / "spec.toml"
    spec.write_text(dump_toml(SPEC))
    # a checkpoint as the trainer writes one, without training (the tests only forge it)
    resolved = load_spec(spec)
    table = resolved.train["task"]
    good = save_checkpoint(root / "run", 1, model=build_model(resolved), spec=resolved,
                           optimizer_state=({}, {}), rng={},
                           meta=CheckpointMeta(task=task_record(build_task(table, 16), table)))

    def forged(name: str) -> Path:
        d = root / name
        shutil.copytree(good, d)
        return d

    paths = {"directory": root / "a-directory.toml", "sparse": _sparse(root / "huge.toml")}
    paths["directory"].mkdir()
    if Path("/dev/zero").exists():
        paths["dev_zero"] = Path("/dev/zero")
    if hasattr(os, "mkfifo"):
        os.mkfifo(root / "fifo.toml")
        paths["fifo"] = root / "fifo.toml"

    ckpts = {"empty_dir": root / "empty", "sparse_ckpt": _sparse(root / "huge.ckpt")}
    ckpts["empty_dir"].mkdir()
    if Path("/dev/zero").exists():
        ckpts["zero_device"] = Path("/dev/zero")
        d = forged("manifest-zero")
        (d / "manifest.json").unlink()
        (d / "manifest.json").symlink_to("/dev/zero")
        ckpts["manifest_is_dev_zero"] = d
    d = forged("manifest-huge")
    _sparse(d / "manifest.json")
    ckpts["manifest_is_10gib"] = d
    d = forged("model-huge")
    _sparse(d / "model.safetensors")
    ckpts["model_is_10gib"] = d
    d = forged("model-huge-listed")
    _sparse(d / "model.safetensors")
    _remanifest(d, skip_hash=("model.safetensors",))
    ckpts["model_is_10gib_and_listed"] = d
    d = forged("meta-dir")
    (d / "meta.json").unlink()
    (d / "meta.json").mkdir()
    ckpts["meta_is_a_directory"] = d
    d = forged("spec-huge")
    text = (d / "spec.toml").read_text()
    assert "vocab_size = 16" in text
    (d / "spec.toml").write_text(text.replace("vocab_size = 16", "vocab_size = 16000000"))
    _remanifest(d)
    ckpts["spec_asks_for_a_huge_model"] = d
    run = root / "unsaved-run"  # a run with no checkpoint yet: --resume reads its log
    run.mkdir()
    shutil.copy(spec, run / "spec.toml")
    _sparse(run / "metrics.jsonl")
    return {"spec": spec, "good": good, "paths": paths, "ckpts": ckpts, "root": root,
            "unsaved_run": run}


SPEC_COMMANDS = {
    "spec validate": ["spec", "validate"],
    "spec show": ["spec", "show"],
    "build": ["build"],
    "build meta": ["build", "--device", "meta"],
    "train": ["train"],
    "compare": ["compare"],
}
CKPT_COMMANDS = {
    "eval": lambda p: ["eval", p],
    "generate": lambda p: ["generate", p, "--prompt-ids", "1"],
    "train --resume": lambda p: ["train", "--resume", p, "--steps", "9", "--no-progress"],
}

DRIVER = textwrap.dedent("""
    import contextlib, io, json, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))
    from atlas_cli.main import run
    job = json.loads(sys.stdin.read())
    # before the clock starts: imports, plugins and a model build (the limit is on the files)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        run(job["warmup"])
    for argv in job["cases"]:
        out, err = io.StringIO(), io.StringIO()
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                run(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code
        except BaseException as exc:  # a crash: record it as the test's failure
            import traceback
            code, err = "crash", io.StringIO(traceback.format_exc())
        seconds = time.perf_counter() - t0
        print(json.dumps({{"argv": argv, "code": code, "stdout": out.getvalue(),
                          "stderr": err.getvalue(), "seconds": seconds}}), flush=True)
""")


def _cases(files) -> dict[str, tuple[list[str], str]]:
    """name -> (argv, the hostile path the message must name)."""
    cases = {}
    for cname, prefix in SPEC_COMMANDS.items():
        for pname, path in files["paths"].items():
            cases[f"{cname} {pname}"] = ([*prefix, str(path)], str(path))
    for cname, make in CKPT_COMMANDS.items():
        for pname, path in files["ckpts"].items():
            cases[f"{cname} {pname}"] = (make(str(path)), str(path))
    run = str(files["unsaved_run"] / "metrics.jsonl")
    cases["train --resume metrics_is_10gib"] = (CKPT_COMMANDS["train --resume"](
        str(files["unsaved_run"])), run)
    return cases


@pytest.fixture(scope="module")
def results(files):
    if sys.platform != "linux":
        pytest.skip("the address-space cap (RLIMIT_AS) is Linux-only")
    cases = _cases(files)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATLAS_")}
    proc = subprocess.run([sys.executable, "-c", DRIVER.format(cap=MEMORY_CAP)],
                          input=json.dumps({"warmup": ["build", "--device", "meta", str(files["spec"])],
                                            "cases": [argv for argv, _ in cases.values()]}),
                          capture_output=True, text=True,
                          env=env, cwd=files["root"], timeout=300)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == len(cases), proc.stderr[-3000:]
    return {name: {**row, "path": cases[name][1]} for name, row in zip(cases, rows)}


EXPECTED = {  # what each message must say: the problem (the path is checked separately)
    "dev_zero": "character device", "zero_device": "no complete checkpoint", "fifo": "named pipe", "directory": "directory",
    "sparse": "over the 1 MiB limit", "empty_dir": "holds no complete checkpoint",
    "sparse_ckpt": "is a file, not a checkpoint", "manifest_is_dev_zero": "character device",
    "manifest_is_10gib": "over the 16 MiB limit", "model_is_10gib": "truncated or altered",
    "model_is_10gib_and_listed": "not a safetensors file", "meta_is_a_directory": "directory",
    "spec_asks_for_a_huge_model": "the weights do not fit",
    "metrics_is_10gib": "line 1 is over 1 MiB, so this is not a metrics log",
}


def test_every_hostile_file_is_one_clean_error(files, results):
    problems = []
    for name, row in results.items():
        kind = next(k for k in EXPECTED if name.endswith(" " + k))
        text = row["stdout"] + row["stderr"]
        lines = [line for line in row["stderr"].splitlines() if line.strip()]
        if row["code"] != 1:
            problems.append(f"{name}: exit {row['code']}: {text[-800:]}")
        elif "Traceback" in text:
            problems.append(f"{name}: traceback: {text[-800:]}")
        elif row["seconds"] > 1.0:
            problems.append(f"{name}: took {row['seconds']:.2f} s")
        elif EXPECTED[kind] not in text:
            problems.append(f"{name}: does not say {EXPECTED[kind]!r}: {text}")
        elif row["argv"][:2] != ["spec", "validate"] and (
                len(lines) != 1 or not lines[0].startswith("error: ")):
            problems.append(f"{name}: not one 'error:' line: {row['stderr']!r}")
        elif Path(row["path"]).name not in text:
            problems.append(f"{name}: the message does not name {row['path']}: {text}")
    assert not problems, "\n".join(problems)


def test_messages_name_the_fix(results):
    assert "pass a spec file (.toml, at most 1 MiB)" in results["build sparse"]["stderr"]
    assert "use an earlier checkpoint" in results["eval manifest_is_10gib"]["stderr"]
    assert "use an earlier checkpoint" in results["eval model_is_10gib_and_listed"]["stderr"]
    validate = results["spec validate directory"]["stdout"]
    assert "a-directory.toml" in validate and "pass a .toml file" in validate


def test_the_installed_atlas_script_refuses_dev_zero(tmp_path):
    """The console script itself (not only `run`): one line, exit 1."""
    import shutil

    exe = shutil.which("atlas")
    if exe is None or not Path("/dev/zero").exists():
        pytest.skip("no `atlas` script on PATH, or no /dev/zero")
    proc = subprocess.run([exe, "spec", "show", "/dev/zero"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "error: /dev/zero: is a character device, not a regular file; pass a spec file "
        "(.toml, at most 1 MiB)"]


# -- read_bounded itself -------------------------------------------------------------------------
def test_read_bounded_reads_up_to_the_limit_and_refuses_more(tmp_path):
    from atlas_core.safe_files import FileRefusedError, read_bounded

    f = tmp_path / "x.toml"
    f.write_bytes(b"a" * 100)
    assert read_bounded(f, 100) == b"a" * 100
    with pytest.raises(FileRefusedError, match=r"x.toml: is 100 bytes, over the 99 bytes limit; fix it"):
        read_bounded(f, 99, fix="fix it")
    with pytest.raises(FileRefusedError, match="no such file"):
        read_bounded(tmp_path / "missing", 10)


def test_a_spec_over_the_limit_is_refused_and_one_under_it_loads(tmp_path):
    from atlas_core.spec import SpecFileError
    from atlas_core.safe_files import SPEC_FILE_LIMIT

    text = dump_toml(SPEC)
    ok = tmp_path / "ok.toml"
    ok.write_text(text + "#" * (SPEC_FILE_LIMIT - len(text) - 1) + "\n")
    assert load_spec(ok).name == "tiny"
    big = tmp_path / "big.toml"
    big.write_text(text + "#" * SPEC_FILE_LIMIT + "\n")
    with pytest.raises(SpecFileError) as info:
        load_spec(big)
    assert info.value.file == str(big) and "over the 1 MiB limit" in str(info.value)


# -- a checkpoint cannot choose the files a command reads ------------------------------------------
def _forge_text_task(files, name: str, secret: Path) -> Path:
    import shutil

    d = files["root"] / name
    shutil.copytree(files["good"], d)
    meta = json.loads((d / "meta.json").read_text())
    meta["task"] = {"use": "core:text", "params": {"path": str(secret), "mode": "byte",
                                                    "seq_len": 8}}
    (d / "meta.json").write_text(json.dumps(meta))
    _remanifest(d)
    return d


def _eval_refused_without_reading(ckpt: Path, monkeypatch) -> str:
    """`atlas eval CKPT` with the text task's file reading made to fail the test: the one error
    line it prints (exit 1, nothing on stdout)."""
    from atlas_core.train.tasks import text

    def no_read(*args, **kwargs):
        raise AssertionError("the text task read a file named by the checkpoint")

    monkeypatch.setattr(text, "_read", no_read)
    r = runner.invoke(make_app(plugin_apps=False), ["eval", str(ckpt)])
    assert r.exit_code == 1 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    return line


def test_eval_never_reads_a_path_named_by_the_checkpoint(files, monkeypatch):
    secret = files["root"] / "secret.txt"
    secret.write_text("x" * 12345)
    ckpt = _forge_text_task(files, "meta-names-a-file", secret)
    line = _eval_refused_without_reading(ckpt, monkeypatch)
    assert line.startswith("error: --task: the checkpoint was trained on core:text with path = ")
    assert "a checkpoint's file is read again only when it is the file the run read" in line
    assert "records no fingerprint" in line
    assert "--task '{use = \"core:text\", path = \"FILE\"}'" in line
    assert "12345" not in line and "12,345" not in line


def _fingerprint(ckpt: Path, secret: Path, size: int, digest: str) -> None:
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["task"]["files"] = {"path": {"path": str(secret), "bytes": size, "sha256": digest}}
    (ckpt / "meta.json").write_text(json.dumps(meta))
    _remanifest(ckpt)


@pytest.mark.parametrize("forged", ["size", "sha256"])
def test_eval_refuses_a_file_that_is_not_the_one_recorded(files, monkeypatch, forged):
    """A forged fingerprint (of a size or a content the file does not have) never gets the file
    read by the task, and the error shows neither its size nor its content."""
    secret = files["root"] / "secret.txt"
    secret.write_text("x" * 12345)
    ckpt = _forge_text_task(files, f"forged-{forged}", secret)
    _fingerprint(ckpt, secret, 12345 if forged == "sha256" else 999,
                 hashlib.sha256(b"y" * 12345).hexdigest())
    line = _eval_refused_without_reading(ckpt, monkeypatch)
    assert "is not the one the run read" in line and "xxxx" not in line
    assert ("12345" not in line and "12,345" not in line) if forged == "size" else "SHA-256" in line


def test_eval_reads_a_recorded_file_that_is_the_one_the_run_read(files):
    """A fingerprint that matches: the checkpoint could only name a file its author knew, so
    ``atlas eval CKPT`` reads it without --task."""
    corpus = files["root"] / "known.txt"
    corpus.write_text("abcd" * 50)
    ckpt = _forge_text_task(files, "meta-known", corpus)
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["task"]["params"]["mode"] = "char"  # 4 ids: the model has 16
    meta["task"]["text"] = {"mode": "char", "vocab": list("abcd")}
    (ckpt / "meta.json").write_text(json.dumps(meta))
    _fingerprint(ckpt, corpus, 200, hashlib.sha256(b"abcd" * 50).hexdigest())
    r = runner.invoke(make_app(plugin_apps=False), ["--format", "json", "eval", str(ckpt)])
    assert r.exit_code == 0, r.output
    assert "path='" + str(corpus) + "'" in json.loads(r.stdout)["task"]


def test_eval_reads_the_file_the_user_names(files):
    """The user names the file; the checkpoint's other task params (seq_len, mode) are kept."""
    from atlas_core.train.checkpoint import load_checkpoint
    from atlas_core.train.inference import eval_task

    corpus = files["root"] / "corpus.txt"
    corpus.write_text("abcd" * 50)
    ckpt = load_checkpoint(_forge_text_task(files, "meta-text", files["root"] / "elsewhere"))
    ckpt.spec = load_spec({**copy.deepcopy(SPEC), "model": {**SPEC["model"], "vocab_size": 256}})
    built = eval_task(ckpt, {"use": "text", "path": str(corpus)})
    assert built.params.path == str(corpus) and built.params.seq_len == 8


def test_resume_does_not_take_a_file_from_the_checkpoints_spec(files, tmp_path):
    """Resuming with the checkpoint's own spec, whose [train] task reads a file: refused, and
    the message says how to resume with a spec the user names."""
    import shutil

    from atlas_core.train.checkpoint import CheckpointError
    from atlas_core.train.setup import TrainOptions, make_plan

    d = tmp_path / "ckpt"
    shutil.copytree(files["good"], d)
    data = load_spec((d / "spec.toml").read_text()).to_dict()
    data["train"]["task"] = {"use": "text", "path": str(tmp_path / "elsewhere.txt")}
    (d / "spec.toml").write_text(load_spec(data).to_toml())
    _remanifest(d)
    with pytest.raises(CheckpointError, match="a checkpoint's file is read again only when it is "
                                              "the file the run read: the checkpoint records no "
                                              r"fingerprint .*; resume with a spec you name.*--resume"):
        make_plan(TrainOptions(resume=str(d), steps=9, progress=False))


def test_a_malformed_task_in_meta_is_a_checkpoint_error(files):
    import shutil

    d = files["root"] / "meta-task-list"
    shutil.copytree(files["good"], d)
    meta = json.loads((d / "meta.json").read_text())
    meta["task"] = [1, 2]
    (d / "meta.json").write_text(json.dumps(meta))
    _remanifest(d)
    for args in (["eval", str(d)], ["generate", str(d), "--prompt", "ab"]):
        r = runner.invoke(make_app(plugin_apps=False), args)
        assert r.exit_code == 1, r.output
        (line,) = r.stderr.strip().splitlines()
        assert line == (f"error: {d / 'meta.json'}: 'task' is not a table with a task name 'use' "
                        "and a 'params' table; use an earlier checkpoint")


# -- names -------------------------------------------------------------------------------------------
def test_plugin_names_with_a_trailing_newline_are_refused(tmp_path):
    r = runner.invoke(make_app(plugin_apps=False),
                      ["plugins", "new", "acme\n", "--dir", str(tmp_path)])
    assert r.exit_code == 1
    assert "plugin name 'acme\\n' must be a lowercase identifier" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_toml_key_with_a_trailing_newline_is_quoted():
    import tomllib

    from atlas_core.spec.toml_io import dumps

    data = {"t": {"a\n": 1, "b": 2}}
    assert tomllib.loads(dumps(data)) == data
