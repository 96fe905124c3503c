"""Ahead-of-time compilation of the kernels for a GPU this machine does not have.

``triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", arch, 32),
options=...)`` runs Triton's whole pipeline (TTIR, TTGIR, LLVM, PTX, and ``ptxas`` to a cubin)
without a driver. Its metadata gives ``shared``: the bytes of shared memory Triton compares with
the device's limit before a launch (``OutOfResources`` above it). Running the ``ptxas`` Triton
ships on the PTX again with ``-v`` gives registers, stack frame and spill bytes per thread.

`kernel_configs()` lists the configurations the backends can dispatch (the launch options come
from the same functions the launchers call), `compile_config()` compiles one and `resources()`
measures it. Triton caches compiled kernels (``~/.triton/cache``) and the ptxas report is cached
beside them, so a second run costs seconds. Used by tests/cuda_backend/test_compile.py (the
boundary configurations for sm_90) and scripts/kernel_resources.py (the full matrix, any target).

Ahead-of-time compilation needs the kernels as ``triton.jit`` functions: under
``TRITON_INTERPRET=1`` (the test suite on a machine without a GPU) they are interpreter objects,
so `run_isolated` runs this module's command line in a subprocess without that variable:

    python -m atlas_plugins.cuda_backend.compile_check boundary --arch 90      # JSON rows
    python -m atlas_plugins.cuda_backend.compile_check full --arch 80
    python -m atlas_plugins.cuda_backend.compile_check ttir                      # IR per kernel
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass, field

# shared memory per block a kernel may use (the opt-in maximum) by compute capability
SHARED_LIMIT = {90: 232_448, 80: 166_912, 89: 101_376, 86: 101_376}
_TY = {"fp32": "*fp32", "bf16": "*bf16", "fp16": "*fp16"}


@dataclass(frozen=True)
class KernelConfig:
    """One compilable kernel configuration: the kernel's name, its pointer and int argument
    types, constexprs and launch options, plus a label for tables."""

    kernel: str  # "module:function" inside atlas_plugins.cuda_backend
    label: str
    dtype: str
    pointers_in: tuple[str, ...]  # pointer arguments in the input dtype (the rest are fp32)
    constexprs: dict = field(hash=False)
    num_warps: int = 4
    num_stages: int = 1

    def function(self):
        import importlib

        mod, fn = self.kernel.split(":")
        return getattr(importlib.import_module(f"atlas_plugins.cuda_backend.{mod}"), fn)

    def signature(self) -> dict[str, str]:
        fn = self.function()
        sig = {}
        for i, name in enumerate(fn.arg_names):
            if name in self.constexprs:
                sig[name] = "constexpr"
            elif i in fn.constexprs:
                raise ValueError(f"{self.kernel}: constexpr {name} has no value in the configuration")
            elif name in _INT_ARGS:
                sig[name] = "i32"
            else:
                sig[name] = _TY[self.dtype] if name in self.pointers_in else "*fp32"
        return sig

    def source(self):
        """Triton's ASTSource, with pointers 16-byte aligned as torch allocates them (the launch
        specialises the same way)."""
        from triton.compiler import ASTSource

        fn, sig = self.function(), self.signature()
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
                 if sig.get(n, "").startswith("*")}
        return ASTSource(fn, sig, dict(self.constexprs), attrs)


# integer (non-pointer) arguments of the kernels
_INT_ARGS = {"T", "NT", "DK", "DV", "C", "W", "D"}


def compile_config(cfg: KernelConfig, arch: int = 90):
    """Compile for ``cuda:arch`` (no GPU needed); returns Triton's CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget

    return triton.compile(cfg.source(), target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))


def shared_bytes(cfg: KernelConfig, arch: int = 90) -> int:
    """``metadata.shared`` without the slow half of the pipeline: Triton decides shared memory when
    it lowers to LLVM IR, so only the ttir -> ttgir -> llir stages run here (seconds, where the
    PTX and ptxas stages of a D = 128 kernel take minutes). Equals `compile_config`'s."""
    module, src, target, backend, options = _initial_ir(cfg, arch)
    stages: dict = {}
    backend.add_stages(stages, options, src.language)
    metadata = {"hash": "shared-only", "target": target, **options.__dict__}
    for ext in ("ttir", "ttgir", "llir"):
        module = stages[ext](module, metadata)
    return int(metadata["shared"])


def ptxas_path(arch: int) -> str:
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(arch).path


_PTXAS = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<st>\d+) bytes spill stores, (?P<ld>\d+) bytes spill loads"
    r".*?Used (?P<reg>\d+) registers", re.S,
)


def ptxas_report(ptx: str, arch: int) -> dict:
    """Registers, stack frame and spill bytes per thread from ``ptxas -v`` on the PTX."""
    import tempfile

    gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run([ptxas_path(arch), "-v", "--regAllocOptLevel=2", f"--gpu-name={gpu}", src,
                              "-o", os.path.join(tmp, "k.o")], capture_output=True, text=True, check=True)
    rep = _parse(out.stderr)
    if rep is None:
        raise RuntimeError(f"unexpected ptxas output:\n{out.stderr}")
    return rep


def _parse(log: str) -> dict | None:
    m = _PTXAS.search(log)
    if m is None:
        return None
    return dict(registers=int(m["reg"]), stack=int(m["stack"]), spill_stores=int(m["st"]),
                spill_loads=int(m["ld"]))


def resources(cfg: KernelConfig, arch: int = 90) -> dict:
    """Compile ``cfg`` and measure it: shared memory (Triton's launch check), registers, stack
    and spills (ptxas). The ptxas report is cached beside Triton's cache entry."""
    import contextlib
    import io

    import triton

    log = io.StringIO()  # a fresh compile prints Triton's own ptxas -v log here
    with triton.knobs.nvidia.scope(), contextlib.redirect_stdout(log):
        triton.knobs.nvidia.dump_ptxas_log = True
        ck = compile_config(cfg, arch)
    cache = os.path.join(triton.knobs.cache.dir, "atlas_ptxas", f"{ck.hash}.json")
    if os.path.exists(cache):
        with open(cache) as f:
            rep = json.load(f)
    else:
        rep = _parse(log.getvalue()) or ptxas_report(ck.asm["ptx"], arch)
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        with open(cache, "w") as f:
            json.dump(rep, f)
    return dict(shared=int(ck.metadata.shared), num_warps=cfg.num_warps, num_stages=cfg.num_stages, **rep)


# -- the configurations the backends dispatch ------------------------------------------------------
DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def chunk_linear_config(direction: str, dtype: str, *, dk: int, dv: int, chunk: int, window: int,
                        momentum: bool, l2: bool = True, before: bool = False) -> KernelConfig:
    """The forward or backward kernel as `chunk_linear` launches it for these sizes."""
    import torch

    from .chunk_linear import Config

    cfg = Config.make(chunk, window, dk, dv, "l2" if l2 else "dot", "before" if before else "after",
                      momentum, getattr(torch, DTYPE_NAMES[dtype]))
    label = (f"{direction} {dtype} {'momentum' if momentum else 'gd'} c={window} C={chunk} "
             f"Dk={dk} Dv={dv}")
    return chunk_linear_kernel(cfg, direction, dtype, label)


def chunk_linear_kernel(cfg, direction: str, dtype: str, label: str = "") -> KernelConfig:
    """The kernel `chunk_linear` launches for a `chunk_linear.Config` (direction "fwd" / "bwd")."""
    launch = cfg.launch(backward=direction == "bwd")
    nw, ns = launch.pop("num_warps"), launch.pop("num_stages")
    if direction == "bwd":
        launch["BW"] = max(2, 1 << (cfg.window - 1).bit_length())
        kernel, inputs = "chunk_linear_bwd:chunk_linear_bwd_kernel", ("psi", "xk", "xv", "dy")
    else:
        kernel, inputs = "chunk_linear_fwd:chunk_linear_fwd_kernel", ("psi", "xk", "xv", "y")
    return KernelConfig(kernel, label or f"{direction} {dtype} {cfg}", dtype, inputs, launch, nw, ns)


def shared_fits(cfg, dtype: str, directions, arch: int, limit: int) -> tuple[bool, str]:
    """Whether the kernels of ``cfg`` fit ``limit`` bytes of shared memory per block on
    ``cuda:arch``: exactly the check Triton makes before a launch (``OutOfResources``)."""
    for direction in directions:
        need = shared_bytes(chunk_linear_kernel(cfg, direction, dtype), arch)
        if need > limit:
            what = "forward" if direction == "fwd" else "backward"
            return False, (f"the {what} kernel needs {need} B of shared memory per block at these "
                           f"sizes (tiles C={cfg.BC}, C+c-1={cfg.BM}, Dk={cfg.BK}, "
                           f"Dv block={cfg.BVB if direction == 'bwd' else cfg.BV}); "
                           f"the device allows {limit} B")
    return True, ""


def mru_configs(dtype: str, d: int) -> list[KernelConfig]:
    """The six MRU scan kernels at state size d."""
    import torch

    from .mru_scan import KERNELS, launch_options

    tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    out = []
    for name, inputs in KERNELS.items():
        opts = launch_options(d, tdtype)
        nw, ns = opts.pop("num_warps"), opts.pop("num_stages")
        if name == "mru_fwd_states":
            opts["HAS_H0"] = True
        out.append(KernelConfig(f"mru_scan:{name}", f"{name} {dtype} d={d}", dtype, inputs, opts, nw, ns))
    return out


def boundary_configs() -> list[KernelConfig]:
    """The largest configuration per (direction, dtype, momentum, window) the backend dispatches,
    at Dv = 128: C = 64 without a window (64 rows) and C + c - 1 = 128 rows with one; Dk = 128
    forward; backward, the verifier's limits when gradients are needed (`backend_chunk`: Dk <= 64,
    rows x Dk <= 4096, momentum rows <= 64): Dk = 64 without a window, 32 with 128 rows (gd), and
    with momentum C = 32, c = 33 (64 rows) at Dk = 64."""
    from .limits import MAX_BACKWARD_HEAD_DIM, MAX_BACKWARD_TILE, MAX_HEAD_DIM

    out = []
    for direction in ("fwd", "bwd"):
        for dtype in ("fp32", "bf16"):
            for momentum in (False, True):
                for window in (1, 65):
                    chunk = 64
                    if direction == "bwd" and momentum and window > 1:
                        chunk, window = 32, 33
                    rows = chunk + window - 1
                    dk = MAX_HEAD_DIM if direction == "fwd" else min(MAX_BACKWARD_HEAD_DIM, MAX_BACKWARD_TILE // rows)
                    out.append(chunk_linear_config(direction, dtype, dk=dk, dv=MAX_HEAD_DIM, chunk=chunk,
                                                   window=window, momentum=momentum))
    return out


def kernel_configs(dims=(16, 32, 64, 128), chunks=(16, 32, 64), windows=(1, 16),
                   dtypes=("fp32", "bf16")) -> list[KernelConfig]:
    """The full matrix for the script: every direction x dtype x momentum x window x D x C the
    backend dispatches (the backward within the verifier's limits for calls with gradients), and
    the MRU kernels at d = 16, 32, 64."""
    from .limits import MAX_BACKWARD_HEAD_DIM, MAX_BACKWARD_TILE

    def pow2(n):
        return max(16, 1 << (n - 1).bit_length())

    out = []
    for direction in ("fwd", "bwd"):
        for dtype in dtypes:
            for momentum in (False, True):
                for window in windows:
                    for d in dims:
                        for chunk in chunks:
                            if direction == "bwd" and (pow2(d) > MAX_BACKWARD_HEAD_DIM
                                                       or pow2(chunk + window - 1) * pow2(d) > MAX_BACKWARD_TILE
                                                       or momentum and pow2(chunk + window - 1) > 64):
                                continue
                            out.append(chunk_linear_config(direction, dtype, dk=d, dv=d, chunk=chunk,
                                                           window=window, momentum=momentum))
    for dtype in dtypes:
        for d in (16, 32, 64):
            out += mru_configs(dtype, d)
    return out


_DTYPE_OF = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}
_FITS: dict = {}


def device_fits(cfg, dtype, backward: bool, device) -> tuple[bool, str]:
    """`shared_fits` for a CUDA device: its compute capability and the shared memory per block
    Triton checks at launch (once per configuration and device)."""
    import torch
    from triton.runtime.driver import driver

    index = torch.device(device).index or 0
    key = (cfg, str(dtype), backward, index)
    if key not in _FITS:
        major, minor = torch.cuda.get_device_capability(index)
        limit = driver.active.utils.get_device_properties(index)["max_shared_mem"]
        directions = ("fwd", "bwd") if backward else ("fwd",)
        _FITS[key] = shared_fits(cfg, _DTYPE_OF[str(dtype)], directions, 10 * major + minor, limit)
    return _FITS[key]


def ttir(cfg: KernelConfig, arch: int = 90) -> str:
    """The kernel's Triton IR as first generated from the source (no passes, no ptxas: cheap),
    the place where an offset's integer width is decided."""
    return str(_initial_ir(cfg, arch)[0])


def _initial_ir(cfg: KernelConfig, arch: int):
    """The kernel's Triton IR as generated from its source for ``sm_<arch>``, with the source,
    target, backend and options that made it: ``(module, src, target, backend, options)``."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    src = cfg.source()
    options = backend.parse_options(dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(target, options, backend.get_codegen_implementation(options),
                         backend.get_module_map(), context)
    return module, src, target, backend, options


def config_key(cfg: KernelConfig, arch: int) -> str:
    """What a measurement depends on: the kernel's source and its jit dependencies (Triton's own
    source hash), the signature, constexprs, launch options, target and Triton version."""
    import hashlib

    import triton
    from triton.compiler import ASTSource

    src = ASTSource(cfg.function(), cfg.signature(), dict(cfg.constexprs))
    text = f"{src.hash()}|{cfg.num_warps}|{cfg.num_stages}|{arch}|{triton.__version__}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def row(cfg: KernelConfig, arch: int, known: dict | None = None, shared_only: bool = False) -> dict:
    """One table row: the configuration and its measured resources. ``known`` maps `config_key`
    to rows measured before (a results file): a row whose key is there is not compiled again.
    ``shared_only``: measure shared memory alone (`shared_bytes`, no PTX, no ptxas)."""
    key = config_key(cfg, arch)
    if known and key in known:
        return dict(known[key], label=cfg.label, recorded=True)
    measured = (dict(shared=shared_bytes(cfg, arch), num_warps=cfg.num_warps, num_stages=cfg.num_stages)
                if shared_only else resources(cfg, arch))
    return dict(label=cfg.label, key=key, kernel=cfg.kernel.split(":")[1], dtype=cfg.dtype, arch=arch,
                limit=SHARED_LIMIT.get(arch), **{k: v for k, v in cfg.constexprs.items()
                                                  if k in ("BC", "BM", "BK", "BV", "BD")},
                **measured)


def load_rows(path: str) -> dict:
    """A results file (a JSON list of rows) as {key: row}; empty if it does not exist."""
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        return {r["key"]: r for r in json.load(f)}


def offset_kernels() -> list[KernelConfig]:
    """One small configuration of every kernel (the IR's integer widths do not depend on tiles)."""
    out = []
    for momentum in (False, True):
        for direction in ("fwd", "bwd"):
            out.append(chunk_linear_config(direction, "fp32", dk=16, dv=16, chunk=16, window=4,
                                           momentum=momentum))
    return out + mru_configs("fp32", 16)


def run_isolated(what: str, arch: int = 90, known: str | None = None, shared_only: bool = False,
                 timeout: float = 7200) -> list[dict]:
    """This module's command line in a subprocess without TRITON_INTERPRET; its JSON rows
    (``known``: a results file whose rows are reused where the configuration's key matches)."""
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "atlas_plugins.cuda_backend.compile_check", what, "--arch", str(arch)]
    cmd += (["--known", known] if known else []) + (["--shared-only"] if shared_only else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"compile_check {what} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout)


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="Compile the cuda kernels ahead of time; JSON rows on stdout.")
    ap.add_argument("what", choices=["boundary", "full", "ttir"])
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 (H100), 80 (A100)")
    ap.add_argument("--known", default=None, help="a results file: rows whose key matches are reused")
    ap.add_argument("--shared-only", action="store_true", help="measure only shared memory (faster)")
    args = ap.parse_args(argv)
    if args.what == "ttir":
        rows = [dict(label=c.label, pointers=[n for n, t in c.signature().items() if t.startswith("*")],
                     ttir=ttir(c, args.arch)) for c in offset_kernels()]
    else:
        cfgs = boundary_configs() if args.what == "boundary" else kernel_configs()
        known = load_rows(args.known)
        rows = [row(c, args.arch, known, args.shared_only) for c in cfgs]
    json.dump(rows, __import__("sys").stdout)


if __name__ == "__main__":
    main()
