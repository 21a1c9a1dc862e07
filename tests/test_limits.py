"""Limits: buffers the device cannot hold, tensors past 32-bit offsets, identifiers that OpenCL
reserves, an interrupted tune, and four processes compiling and tuning at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import tilec
from tilec.codegen.generate import generate
from tilec.config import Config
from tilec.errors import DeviceError, TileCheckError, TileError
from tilec.lang.reference import random_array
from tilec.plan.fuse import plan_kernels
from tilec.plan.hw import HwModel
from tilec.runtime.cache import ProgramCache
from tilec.runtime.device import Runtime
from tilec.tune.records import RecordStore

from .device import needs_device

device = needs_device
ROOT = Path(__file__).resolve().parent.parent
INT_MAX = 2**31 - 1


# -- sizes ---------------------------------------------------------------------------------------

@pytest.fixture
def no_allocation(monkeypatch):
    """Fail the test if anything is built or allocated on the device."""
    def refuse(*args, **kwargs):
        raise AssertionError("the device was used before the size check")

    for name in ("buffer", "build", "build_source", "build_binary", "upload", "fill"):
        monkeypatch.setattr(Runtime, name, refuse)


def _itemsize_count(nbytes: int, itemsize: int) -> int:
    return nbytes // itemsize + 1024


@device
def test_a_tensor_larger_than_one_allocation_is_refused_before_allocation(no_allocation):
    rt = Runtime.get(None)
    # The contraction's output is the large one: intermediate and output buffers count too.
    n = _itemsize_count(rt.max_alloc, 4)
    m = 1024
    src = "function (A[M], B[N]) -> (O) { O[i, j : M, N] = +(A[i] * B[j]); }"
    shapes = {"A": (m,), "B": (-(-n // m),)}
    with pytest.raises(TileError) as e:
        tilec.compile(src, shapes, config=Config(hw="pocl-cpu", tiles={"*": {"i": 1, "j": 1}}))
    if n <= INT_MAX:
        assert isinstance(e.value, DeviceError)
        assert "tensor O needs" in str(e.value) and "more than one allocation" in str(e.value)
    else:  # a device whose allocations pass 2**31 elements: the offset limit comes first
        assert "32-bit" in str(e.value)


@device
def test_buffers_larger_than_the_device_memory_are_refused_before_allocation(no_allocation):
    rt = Runtime.get(None)
    # Each tensor fits one allocation (and 32-bit offsets); together they exceed the memory.
    per = min(rt.max_alloc, rt.global_mem, INT_MAX * 4) // 4 - 1024
    count = rt.global_mem // (per * 4) + 1
    names = [f"A{k}" for k in range(count)]
    src = f"function ({', '.join(f'{n}[N]' for n in names)}) -> (S) {{ S = {' + '.join(names)}; }}"
    with pytest.raises(DeviceError, match="the program's buffers need .* bytes, more than"):
        tilec.compile(src, {n: (per,) for n in names})


@pytest.mark.parametrize("src, shapes, dtype", [
    ("function (A[N]) -> (B) { B = A > 0; }", {"A": (2**32,)}, "bool"),
    ("function (A[N]) -> (B) { B = A * 2; }", {"A": (2**31,)}, "float16"),
    ("function (A[M], B[N]) -> (O) { O[i, j : M, N] = +(A[i] * B[j]); }",
     {"A": (2**16,), "B": (2**15 + 1,)}, "float32"),
    ("function (A[M]) -> (O) { O[2 * i : 2 * M] = =(A[i]); }", {"A": (2**30 + 1,)}, "float32"),
])
def test_tensors_past_32_bit_offsets_are_a_tile_error(src, shapes, dtype):
    """These fit the allocations of some devices; their kernels' `int` offsets would wrap.
    (A size past int32 in the text is the checker's error; a product of sizes, codegen's.)"""
    with pytest.raises(TileCheckError, match="32-bit integers"):
        plan = plan_kernels(tilec.check_program(src, shapes, dtype))
        generate(plan, HwModel.load("pocl-cpu"), Config())


def test_largest_tensor_within_32_bit_offsets_still_generates():
    plan = plan_kernels(tilec.check_program("function (A[N]) -> (B) { B = A * 2; }",
                                            {"A": (INT_MAX,)}))
    sources, _ = generate(plan, HwModel.load("pocl-cpu"), Config())
    assert f"if (gid >= {INT_MAX}) return;" in sources[0].text


# -- names ---------------------------------------------------------------------------------------

WORDS = ["float", "kernel", "int", "exp", "local", "half", "global", "constant", "private",
         "void", "restrict", "if", "for", "return", "sizeof", "double", "bool", "max", "fma",
         "select", "clamp", "barrier", "INFINITY", "NAN", "get_local_id", "o", "v", "oe", "gid",
         "grp", "rest", "a_0", "x0", "s_0", "b_A"]

# Each word in turn is an input tensor ({t}), a size symbol ({s}), and both an index and the
# name of a contraction's output ({w}) whose post-op is fused into its kernel.
NAMES_PROGRAM = """function ({t}[{s}, K], B[K, N], C[N]) -> ({w}, R) {{
  {w}[{w}, n : {s} - 1, N] = +({t}[{w} + 1, k] * B[k, n]);
  R = relu({w} + C) * {w};
}}"""


@device
@pytest.mark.parametrize("k", range(len(WORDS)), ids=WORDS)
def test_opencl_words_as_tile_names_compile_and_run(k):
    w, s, t = (WORDS[(k + d) % len(WORDS)] for d in range(3))
    src = NAMES_PROGRAM.format(w=w, s=s, t=t)
    # Inputs read through the cache (pocl-cpu) or staged in local memory (nvidia-h100).
    hw = ("pocl-cpu", "nvidia-h100")[k % 2]
    exe = tilec.compile(src, {t: (6, 9), "B": (9, 7), "C": (7,)}, config=Config(hw=hw))
    rng = np.random.default_rng(k)
    arrays = {n: random_array(rng, exe.program.tensors[n].shape, "float32")
              for n in exe.program.inputs}
    outs = exe.run(arrays, poison=True)
    v = exe.check(exe._inputs(arrays), outs)
    assert v.ok, (hw, v.worst)


# -- processes -----------------------------------------------------------------------------------

def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def assert_consistent(root: Path, *, temporaries_allowed: bool = False) -> int:
    """Every cache entry decodes and every tuning-record line parses; returns the record lines."""
    cache = ProgramCache(root)
    for entry in cache.entries():
        assert entry.fields is not None, entry.path
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert cache.load(entry.path, entry.fields) is not None, entry.path
    if not temporaries_allowed:
        # A writer interrupted between its temporary file and the rename leaves the temporary,
        # which eviction removes once stale; a finished run leaves none.
        leftovers = [p.name for p in cache.directory.glob("*") if p.suffix != ".bin"]
        assert not leftovers, leftovers
    path = root / "tuning.jsonl"
    if not path.exists():
        return 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RecordStore(path).load()
    lines = [ln for ln in path.read_bytes().split(b"\n") if ln.strip()]
    assert path.read_bytes().endswith(b"\n")
    return len(lines)


WORKER = """
import sys, time
from pathlib import Path
import numpy as np
from tilec.lang.reference import random_array
from tilec.compiler import compile as tile_compile
from tilec.config import Config
from tilec.tune.measure import tune
from tests.kernel_cases import CASES

root, go, ready = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
config = Config(cache_dir=root, disk_cache_all_drivers=True)

def checked(name):
    exe = tile_compile(*CASES[name], config=config)
    rng = np.random.default_rng(0)
    arrays = {n: random_array(rng, exe.program.tensors[n].shape, exe.program.tensors[n].dtype)
              for n in exe.program.inputs}
    outs = exe.run(arrays, poison=True)
    v = exe.check(exe._inputs(arrays), outs)
    assert v.ok, (name, v.worst)
    return exe

ready.touch()
while not go.exists():
    time.sleep(0.005)
for name in ("matmul_odd", "softmax", "conv_same_relu"):
    checked(name)
report = tune(*CASES["matmul_odd"], config=config, top_k=3, repeat=1, warmup=0)
assert report.records_path is not None
exe = checked("matmul_odd")
assert exe.tuned, "the tuning record was not used"
print("ok", len(report.kernels))
"""


@device
def test_four_processes_compiling_and_tuning_the_same_programs(tmp_path):
    root, go = tmp_path / "cache", tmp_path / "go"
    procs, ready = [], []
    for k in range(4):
        ready.append(tmp_path / f"ready{k}")
        procs.append(subprocess.Popen(
            [sys.executable, "-c", WORKER, str(root), str(go), str(ready[-1])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT))
    deadline = time.monotonic() + 120
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()  # all four start together
    kernels = 0
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert "Warning" not in err, err  # CacheWarning, unreadable records
        assert out.startswith("ok"), out
        kernels = int(out.split()[1])
    assert assert_consistent(root) == 4 * kernels  # one record per kernel per process
    assert len(ProgramCache(root).entries()) >= 4


INTERRUPTED = """
import sys
from pathlib import Path
import numpy as np
from tilec.lang.reference import random_array
from tilec.compiler import compile as tile_compile
from tilec.config import Config
from tilec.tune.measure import tune
from tests.kernel_cases import CASES

def progress(done, total, label):
    print("progress", done, total, flush=True)

config = Config(cache_dir=Path(sys.argv[1]), disk_cache_all_drivers=True)
if sys.argv[2] == "long":  # long enough to be interrupted anywhere
    for name in ("conv_same_relu", "matmul_odd"):
        tune(*CASES[name], config=config, lws=True, progress=progress, repeat=2, warmup=1)
else:  # afterwards: the cache and the records still serve a tune and a compile
    tune(*CASES["matmul_odd"], config=config, top_k=2, repeat=1, warmup=0)
    for name in ("conv_same_relu", "matmul_odd"):
        exe = tile_compile(*CASES[name], config=config)
        rng = np.random.default_rng(0)
        arrays = {n: random_array(rng, exe.program.tensors[n].shape, "float32")
                  for n in exe.program.inputs}
        v = exe.check(arrays, exe.run(arrays, poison=True))
        assert v.ok, (name, v.worst)
print("finished", flush=True)
"""


@device
def test_an_interrupted_tune_leaves_cache_and_records_consistent(tmp_path):
    root = tmp_path / "cache"
    interrupted = 0
    # Ctrl-C at different points: after the first, second, ... measurement, a little later.
    for k, delay in enumerate([0.0, 0.05, 0.2, 0.5]):
        p = subprocess.Popen([sys.executable, "-c", INTERRUPTED, str(root), "long"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=_env(), cwd=ROOT)
        seen = 0
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("progress"):
                seen += 1
                if seen > k:
                    time.sleep(delay)
                    p.send_signal(signal.SIGINT)
                    break
        out, err = p.communicate(timeout=300)
        if p.returncode != 0:
            interrupted += 1
            # The interrupt is what ends it (a build it cuts short may fail on the way out).
            assert err.strip().splitlines()[-1] == "KeyboardInterrupt", err
        assert_consistent(root, temporaries_allowed=True)
    assert interrupted >= 2
    p = subprocess.run([sys.executable, "-c", INTERRUPTED, str(root), "short"],
                       capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "Warning" not in p.stderr, p.stderr
    assert "finished" in p.stdout
    assert assert_consistent(root, temporaries_allowed=True) >= 1
