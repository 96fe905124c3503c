"""Every shell command of the docs runs: the fenced ``bash`` blocks of README.md and docs/*.md.

The commands are found when the test runs (docs change; a new command is run without editing this
file), each run at small settings in a sandbox directory that links the repository's inputs
(``examples/``, ``docs/``, ...), so that ``runs/``, ``hf/`` and other outputs never touch the
checkout. What is changed and what is left out is in the three reviewed tables below:

- `NOT_RUN`: commands deliberately not run, each with the reason;
- `SUBSTITUTIONS`: rewrites that make a command small (fewer steps, shorter sequences, ...);
- `SETUP`: what a document's commands use but the document does not create in a ``bash`` block
  (a run its Python example trains, the user's own corpus), made before its commands run.

Within one document the ``atlas train`` commands run first (later commands read their runs),
then the rest in document order. ``atlas`` commands run in one Python process per document (the
CLI's own entry point; the start-up of torch is paid once); ``python``/``bash`` commands run as
subprocesses. A failure is reported with the document, the line, the command as run, the exit
status and the end of its output; a command matching no table is simply run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# -- the reviewed tables --------------------------------------------------------------------------
NOT_RUN: list[tuple[str, str]] = [
    (r"^bash scripts/(setup|test)\.sh", "installs into a virtual environment (and runs the whole "
     "suite): the test environment is already installed"),
    (r"^pip install", "installs packages from an index or a path; the test environment has them"),
    (r"^pytest\b", "runs another test suite (the coordinator runs it)"),
    (r"^torchrun\b", "a multi-process launch; tests/train/test_distributed.py covers "
     "data-parallel training"),
    (r"--nproc [2-9]", "spawns processes; tests/train/test_distributed.py covers --nproc"),
    (r"--context-parallel [2-9]", "spawns processes; the context-parallel tests in tests/ "
     "compare it with one process"),
    (r"scripts/(fuzz_specs|kill_train)\.py", "a robustness campaign of many minutes (its "
     "figures are in docs/hardening.md)"),
    (r"benchmarks/compare_mqar\.py", "a benchmark of minutes to hours; atlas compare is tested "
     "in tests/train/test_compare.py"),
    (r"benchmarks/mqar/fla_models\.py", "trains fla's model for many minutes; its pieces (the CPU "
     "oracle, fla's models on it) are tested in tests/fla_oracle"),
    (r"benchmarks/bench_strategies\.py", "the benchmark sweep (writes docs/img); "
     "tests/bench/test_bench_cli.py runs the script at tiny sizes"),
    (r"^atlas bench\s*$", "the full sweep of docs/benchmarks.md (about 40 minutes)"),
    (r"^atlas bench inference --configs qwen3\.5", "builds and runs a 0.8B model beside transformers "
     "and llama.cpp (minutes to an hour); tests/bench/test_inference_bench.py runs it at a tiny size"),
    (r"^atlas bench inference --configs (gated-)?deltanet-1\.3b", "builds and runs 1.3B models (about "
     "ten minutes); tests/bench/test_inference_bench.py runs the command at a tiny size"),
    (r"benchmarks/decode_profile\.py ~/\.cache/atlas-bench", "reads the 2.8 GiB checkpoint `atlas bench "
     "inference` caches; the decoder it times is tested in tests/decode"),
    (r"--device cuda|\bcuda\b", "needs a GPU"),
]

SUBSTITUTIONS: list[tuple[str, str, str]] = [
    # (pattern, replacement, why)
    (r"--steps \d+", "--steps 2", "two optimizer steps show that a training command runs"),
    (r"^(atlas train\b(?!.*--steps).*)$", r"\1 --steps 2", "the same, where no --steps is given"),
    (r"--lengths [\d,]+", "--lengths 16", "one short sequence length per benchmark"),
    (r"^(atlas bench\b(?! inference)(?!.*--lengths).*)$", r"\1 --lengths 16", "the same, where no "
     "--lengths is given"),
    (r"^(atlas bench\b(?! inference)(?!.*--rules).*)$", r"\1 --rules delta", "one rule where the command "
     "names none (all seven at once is tests/bench's and the full sweep's job)"),
    (r"^(atlas bench\b(?! inference).*)$", r"\1 --batch 1 --heads 1 --dim 4 --chunk 8 --exact-chunks 8 "
     "--decode-chunks 16,32 --decode-tokens 2 --repeats 1 --threads 1 --no-memory "
     "--no-baselines", "tiny benchmark sizes, strategies only (the flags given last win; "
     "tests/bench/test_bench_cli.py runs the baselines)"),
    (r"^(python benchmarks/bench_context_parallel\.py.*)$", r"\1 --T 64 --R 1 2 --repeat 1 "
     "--heads 1 --dim 4 --rules titans:titans/exact", "one tiny rule at R = 1 and 2 (the flags "
     "given last win; the figures of docs/distributed.md take minutes)"),
    (r"--max-new-tokens \d+", "--max-new-tokens 4", "a few generated tokens"),
    (r"--batches \d+", "--batches 1", "one evaluation batch"),
    (r"--vocab-size \d+", "--vocab-size 300", "a tokenizer the small generated corpus can fill"),
    (r"(?<![\w/.-])spec\.toml\b", "examples/mqar_default.toml", "`spec.toml` stands for "
     "the reader's own spec"),
    (r"fuzz_specs\.py --count \d+", "fuzz_specs.py --count 12", "a dozen mutated specs "
     "(tests/hostile/test_spec_fuzz.py runs 80)"),
    (r"--cli \d+", "--cli 1", "one fuzzed file through the real commands"),
    (r"kill_train\.py --kills \d+", "kill_train.py --kills 1 --every 2",
     "one killed run (tests/hostile/test_train_kill.py runs four)"),
]

_TINY_CORPUS = (
    "import json, pathlib\n"
    "text = pathlib.Path('docs/math.md').read_text()\n"
    "paras = [p for p in text.split('\\n\\n') if p.strip()][:60]\n"
    "pathlib.Path('corpus.jsonl').write_text(''.join(json.dumps({'text': p}) + '\\n' for p in paras))\n"
)

def _doc_spec(doc: str) -> str:
    """The first ``toml`` block of ``doc`` as written (docs/data.md's is a whole spec: the test
    validates and trains it), reading the tokenizer SETUP trains under another name."""
    text = (ROOT / doc).read_text()
    block = re.search(r"^```toml\n(.*?)^```", text, re.S | re.M).group(1)
    return block.replace('"tokenizer.json"', '"setup-tok.json"')


def _install_doc_package(package: str, dist: str, namespace: str, files: list[str]) -> str:
    """A script that "installs" a package docs/plugins.md writes out in the sandbox: its python
    blocks that start with ``# src/<package>/<file>.py`` become that package (``files`` in the
    doc's order), with a dist-info naming the entry point (the doc's `atlas check` lines then
    certify it)."""
    return (
        "import pathlib, re\n"
        "doc = pathlib.Path('docs/plugins.md').read_text()\n"
        f"blocks = re.findall(r'```python\\n# src/{package}/(\\w+\\.py)\\n(.*?)```', doc, re.S)\n"
        f"assert [b[0] for b in blocks] == {files!r}, [b[0] for b in blocks]\n"
        f"pkg = pathlib.Path('{package}'); pkg.mkdir()\n"
        "(pkg / '__init__.py').write_text('')\n"
        "for name, code in blocks: (pkg / name).write_text(code)\n"
        f"info = pathlib.Path('{package}-0.1.0.dist-info'); info.mkdir()\n"
        f"(info / 'METADATA').write_text('Metadata-Version: 2.1\\nName: {dist}\\nVersion: 0.1.0\\n')\n"
        f"(info / 'entry_points.txt').write_text('[atlas_core.plugins]\\n{namespace} = {package}.plugin\\n')\n"
    )


# the strategy example of "Writing a strategy", and the standalone rule of "Walkthrough: a
# MesaNet-style least-squares rule" with its spec (the doc shows its [memory] and [layer] tables:
# a whole spec of a plugin the test process lacks would fail tests/test_docs_specs.py), which the
# doc's commands check and train
_INSTALL_STRATEGY_EXAMPLE = _install_doc_package("atlas_acme_chunks", "atlas-acme-chunks", "acme_chunks",
                                                 ["plugin.py", "chunked.py"])
_MESA_SPEC_HEAD = ('schema = "atlas/1"\nname = "mesa-small"\n\n[model]\narch = "core:lm"\nvocab_size = 64\n'
                   'd_model = 32\ndepth = 2\nheads = 2\n\n[train]\ntask = { use = "mqar", num_pairs = 4, '
                   'seq_len = 32 }\nsteps = 200\nbatch_size = 8\nlr = 3e-3\nwarmup_steps = 10\n'
                   'eval_every = 100\n\n')
_INSTALL_STANDALONE_EXAMPLE = _install_doc_package("acme_mesa", "acme-mesa", "mesa", ["rule.py", "plugin.py"]) + (
    "tables = re.search(r'```toml\\n# in mesa\\.toml[^\\n]*\\n(.*?)```', doc, re.S).group(1)\n"
    f"pathlib.Path('mesa.toml').write_text({_MESA_SPEC_HEAD!r} + tables)\n"
)

# the reader's own checkpoint directory of the import guide: a small random Qwen3.5 saved by
# transformers under the name the docs use, with the user's corpus and a tokenizer trained on it
_TINY_QWEN = (
    "import pathlib, transformers\n"
    "text = pathlib.Path('docs/math.md').read_text()\n"
    "pathlib.Path('corpus.txt').write_text(text)\n"
    "cfg = transformers.Qwen3_5TextConfig(vocab_size=300, hidden_size=32, intermediate_size=48, "
    "num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8, "
    "linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4)\n"
    "transformers.Qwen3_5ForCausalLM(cfg).save_pretrained('Qwen3.5-0.8B')\n"
)
_IMPORT_SETUP = [f"python -c {shlex.quote(_TINY_QWEN)}",
                 "atlas tokenizer train corpus.txt --vocab-size 300 --out Qwen3.5-0.8B/tokenizer.json"]

SETUP: dict[str, list[str]] = {
    # README's Python example trains runs/mqar-small before `atlas export-hf` reads it; its import
    # example reads the reader's Qwen3.5 directory
    "README.md": ["atlas train examples/mqar_default.toml --steps 2 --out runs/mqar-small", *_IMPORT_SETUP],
    "docs/import.md": _IMPORT_SETUP,
    # the user's corpus, and the doc's spec as corpus.toml (its own commands validate and train it)
    "docs/data.md": [f"python -c {shlex.quote(_TINY_CORPUS)}",
                     # under another name: the doc's own command writes tokenizer.json, after the
                     # run (trains go first) that needs one
                     "atlas tokenizer train corpus.jsonl --vocab-size 300 --out setup-tok.json",
                     f"write corpus.toml {shlex.quote(_doc_spec('docs/data.md'))}"],
    # the strategy example and the standalone rule, which the doc's `atlas check` lines certify
    "docs/plugins.md": [f"python -c {shlex.quote(_INSTALL_STRATEGY_EXAMPLE)}",
                        f"python -c {shlex.quote(_INSTALL_STANDALONE_EXAMPLE)}"],
    # the runs the Hugging Face guide exports
    "docs/huggingface.md": [
        "atlas train examples/text_char.toml --steps 2 --out runs/text-char",
        "atlas train examples/mqar_default.toml --steps 2 --out runs/mqar"],
}
# `runs/mqar/checkpoints/step-000002000` and the like name a later step than 2 steps reach
STEP_DIR = (r"checkpoints/step-\d{9}", "checkpoints/step-000000002")

# what the sandbox links from the checkout (inputs only: nothing is written through them except
# by commands in NOT_RUN)
LINKED = ["examples", "docs", "benchmarks", "packages", "scripts", "atlas_core", "plugins"]
PER_DOC_TIMEOUT = 600  # seconds; a loaded machine runs many times slower than an idle one


# -- finding the commands -------------------------------------------------------------------------
def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def commands(doc: Path) -> list[tuple[int, str]]:
    """(line number, command) for every command of the doc's ``bash``/``sh`` blocks; a trailing
    backslash joins lines; comment lines and blank lines are skipped."""
    out = []
    lines = doc.read_text().splitlines()
    fence, i = None, 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if fence is None:
            m = re.match(r"^(`{3,}|~{3,})\s*(bash|sh|shell)\s*$", stripped)
            if m:
                fence = m.group(1)
            i += 1
            continue
        if stripped.startswith(fence):
            fence = None
            i += 1
            continue
        start, text = i + 1, stripped
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1].rstrip() + " " + lines[i].strip()
        i += 1
        if text and not text.startswith("#"):
            out.append((start, text))
    return out


def strip_comment(command: str) -> str:
    """The command without a trailing ``# comment`` (a ``#`` inside quotes is kept)."""
    quote = None
    for k, ch in enumerate(command):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or command[k - 1].isspace()):
            return command[:k].rstrip()
    return command


def plan(doc: Path) -> tuple[list[dict], list[tuple[int, str, str]]]:
    """The commands to run (setup first, then trains, then the rest) and those skipped."""
    rel = doc.relative_to(ROOT).as_posix()
    run, skipped = [], []
    for line, raw in commands(doc):
        cmd = strip_comment(raw)
        reason = next((why for pat, why in NOT_RUN if re.search(pat, cmd)), None)
        if reason:
            skipped.append((line, cmd, reason))
            continue
        small = cmd
        for pat, rep, _ in SUBSTITUTIONS:
            small = re.sub(pat, rep, small)
        small = re.sub(STEP_DIR[0], STEP_DIR[1], small)
        run.append({"line": line, "doc": cmd, "cmd": small})
    trains = [c for c in run if c["cmd"].startswith("atlas train") and "--resume" not in c["cmd"]]
    rest = [c for c in run if c not in trains]
    setup = [{"line": 0, "doc": s, "cmd": s} for s in SETUP.get(rel, [])]
    return setup + trains + rest, skipped


# -- running them -----------------------------------------------------------------------------------
DRIVER = r'''
import contextlib, io, json, os, resource, shlex, subprocess, sys, time, traceback
from pathlib import Path
sys.argv = ["atlas"]
from atlas_cli.main import run as atlas
results = []
for item in json.loads(sys.stdin.read()):
    cmd = item["cmd"]
    out, err, code = io.StringIO(), io.StringIO(), 0
    t0 = time.perf_counter()
    c0 = time.process_time() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    try:
        if cmd.startswith("write "):
            _, name, body = shlex.split(cmd)
            Path(name).write_text(body)
        else:
            argv = shlex.split(cmd)
            env = {}
            while argv and "=" in argv[0] and not argv[0].startswith("-"):
                key, value = argv.pop(0).split("=", 1)
                env[key] = value
            target = None
            if ">" in argv:
                k = argv.index(">")
                target, argv = argv[k + 1], argv[:k] + argv[k + 2:]
            if argv[0] == "atlas" and not env:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    try:
                        atlas(argv[1:])
                    except SystemExit as exc:
                        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if target:
                    Path(target).write_text(out.getvalue())
            else:
                if argv[0] == "python":
                    argv[0] = sys.executable
                elif argv[0] == "atlas":
                    argv = [sys.executable, "-m", "atlas_cli.main", *argv[1:]]
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=180,
                                      env={**os.environ, **env})
                code = proc.returncode
                out.write(proc.stdout)
                err.write(proc.stderr)
                if target:
                    Path(target).write_text(proc.stdout)
    except Exception:
        code, _ = 1, err.write(traceback.format_exc())
    cpu = time.process_time() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - c0
    results.append({"code": code, "tail": (out.getvalue() + err.getvalue())[-1500:],
                    "wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(cpu, 2)})
    print(json.dumps(results[-1]), flush=True)
'''


def _sandbox(tmp_path: Path) -> Path:
    box = tmp_path / "sandbox"
    box.mkdir()
    for name in LINKED:
        if (ROOT / name).exists():
            (box / name).symlink_to(ROOT / name)
    return box


def _ids() -> list[str]:
    return [d.relative_to(ROOT).as_posix() for d in documents()]


def test_the_tables_are_well_formed():
    """Every pattern compiles; every skip has a reason; the setup keys name documents."""
    for pat, why in NOT_RUN:
        re.compile(pat)
        assert len(why) > 10
    for pat, _, why in SUBSTITUTIONS:
        re.compile(pat)
        assert len(why) > 10
    names = set(_ids())
    assert set(SETUP) <= names, sorted(set(SETUP) - names)


def test_commands_are_found_in_fenced_blocks(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("text\n```bash\natlas train a.toml \\\n  --steps 9   # note\n# a comment\n\n"
                   "pip install x\n```\n```toml\nnot = 'a command'\n```\n")
    assert commands(doc) == [(3, "atlas train a.toml --steps 9   # note"), (7, "pip install x")]
    assert strip_comment("atlas eval r --task '{use = \"a#b\"}'  # c") == \
        "atlas eval r --task '{use = \"a#b\"}'"


@pytest.mark.parametrize("doc", _ids())
def test_doc_commands_run(doc, tmp_path):
    path = ROOT / doc
    todo, skipped = plan(path)
    if not [c for c in todo if c["line"]]:
        # nothing of this document runs; every command it has is in NOT_RUN, with its reason
        assert all(reason for _, _, reason in skipped)
        return
    box = _sandbox(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "ATLAS_DEBUG"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(todo), cwd=box,
                          capture_output=True, text=True, timeout=PER_DOC_TIMEOUT, env=env)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    problems = []
    if len(results) != len(todo):
        problems.append(f"the driver stopped after {len(results)} of {len(todo)} commands "
                        f"(exit {proc.returncode}): {proc.stderr[-1500:]}")
    for item, res in zip(todo, results):
        if res["code"] != 0:
            where = f"{doc}:{item['line']}" if item["line"] else f"{doc} (SETUP)"
            ran = "" if item["cmd"] == item["doc"] else f"\n    run as: {item['cmd']}"
            problems.append(f"{where}: exit {res['code']}: {item['doc']}{ran}\n"
                            + textwrap.indent(res["tail"].strip(), "    | "))
    for item, res in zip(todo, results):  # shown with -s / on failure: where the time goes
        print(f"{res['cpu_s']:7.2f} s CPU {res['wall_s']:7.2f} s wall  {doc}:{item['line']}  "
              f"{item['cmd'][:100]}")
    assert not problems, ("documented commands that fail (fix the doc or the code; or add a "
                          "reviewed entry to NOT_RUN / SUBSTITUTIONS / SETUP in "
                          "tests/test_docs_commands.py):\n" + "\n".join(problems))
