"""A warm ``atlas`` for tests and scripts that run the command many times: one process imports
torch and the CLI and trains once, then forks one child per command (a fresh interpreter costs
seconds per run, its first steps more).

    warm = WarmAtlas(workdir, spec)          # trains ``spec`` once into workdir/warm-up
    code, seconds, output = warm.run(["train", spec, "--out", run], cwd=workdir,
                                     env={"ATLAS_CHECKPOINT_KILL_AT": "files:1"}, kill_after=2.5)
    warm.close()

Each child writes its output to its own log file (the zygote's stdout is the protocol pipe),
starts its save count afresh (the checkpoint kill hook counts saves per process), and is stopped
by SIGALRM after 120 s if it hangs; ``kill_after`` SIGKILLs it after that many seconds if it is
still running (its exit code is then -9). Everything runs on one thread: no OpenMP pool exists
at the fork, and every run computes the same floating-point sums. POSIX only (``os.fork``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

# argv: a spec and a scratch directory; then one JSON job per line on stdin, one JSON answer
# {"code": exit code, "seconds": wall time} per line on stdout
_ZYGOTE = r"""
import contextlib, io, json, os, signal, sys, time, traceback
import torch
torch.set_num_threads(1)
import atlas_cli.main
from atlas_core.train import checkpoint
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        atlas_cli.main.run(["train", sys.argv[1], "--out", sys.argv[2], "--no-progress"])
    except SystemExit as exc:
        if exc.code:
            raise
print("ready", flush=True)
for line in sys.stdin:
    job = json.loads(line)
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.chdir(job["cwd"])
        os.environ.update(job["env"])
        signal.alarm(120)
        code = 0
        try:
            atlas_cli.main.run(job["args"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    deadline = None if job.get("kill_after") is None else t0 + job["kill_after"]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if deadline is not None and time.perf_counter() >= deadline:
            os.kill(pid, signal.SIGKILL)
            deadline = None
        time.sleep(0.0005)
    print(json.dumps({"code": os.waitstatus_to_exitcode(status),
                      "seconds": time.perf_counter() - t0}), flush=True)
"""


class WarmAtlas:
    """The zygote process and its protocol (module docstring)."""

    def __init__(self, workdir: Path, spec: Path, *, cwd: Path | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.workdir, self.count = Path(workdir), 0
        self._err = open(self.workdir / "zygote.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE, str(spec), str(self.workdir / "warm-up")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True,
            cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
        if self.proc.stdout.readline().strip() != "ready":
            self.close()
            raise RuntimeError((self.workdir / "zygote.log").read_text())

    def run(self, args: Sequence[Any], cwd: Path, env: Mapping[str, str] | None = None,
            kill_after: float | None = None) -> tuple[int, float, str]:
        """``atlas ARGS`` in a forked child: (exit code, seconds, its output)."""
        self.count += 1
        log = self.workdir / f"cmd{self.count}.log"
        job = {"args": [str(a) for a in args], "cwd": str(cwd), "env": dict(env or {}),
               "log": str(log), "kill_after": kill_after}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        # a child killed at once has not opened its log yet
        return answer["code"], answer["seconds"], log.read_text() if log.exists() else ""

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        finally:
            self._err.close()
