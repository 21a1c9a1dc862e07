"""Cold builds in worker processes (`runtime.prebuild`): a large program is built in parts,
worker processes build them and make each kernel's first launch so that PoCL's cache holds
the code, and the compiling process gives the numpy reference's results whatever the
workers did (all of it, some of it, or nothing because they died)."""

from __future__ import annotations

import numpy as np
import pytest

import tilec.runtime.prebuild as prebuild
from tilec.codegen.kernel_text import KernelArg, KernelSource
from tilec.config import Config
from tilec.graph import ops
from tilec.graph.builder import Graph
from tilec.runtime.device import Runtime
from tilec.runtime.share import share_kernels

from ..device import needs_device
from ..graph_refs import close, conv_nchw, run

RNG = np.random.default_rng(5)


def rand(*shape):
    return RNG.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def _kernel(name: str, scale: float, pad: int = 0) -> KernelSource:
    text = (f"__kernel void {name}(__global const float* b_x, __global float* b_{name}) {{\n"
            f"    const int i = get_global_id(0);\n"
            f"    b_{name}[i] = {scale}f * b_x[i];{' ' * pad}\n}}\n")
    args = (KernelArg("x", "in", "float32", 64), KernelArg(name, "out", "float32", 64))
    return KernelSource(name, "elementwise", text, args, 64, None)


def test_parts_hold_each_distinct_kernel_once_and_depend_on_the_count_alone(monkeypatch):
    sources = [_kernel(f"k{i}", 1.0 + i, pad=40 * (i % 3)) for i in range(11)]
    shared = share_kernels(sources, {"x"} | {s.name for s in sources})
    monkeypatch.setattr(prebuild, "SPLIT_MIN_CHARS", 1)
    for count, want in ((prebuild.MAX_PARTS, prebuild.MAX_PARTS), (2, 2), (3, 3),
                        (100, prebuild.MAX_PARTS)):
        parts = prebuild.split_parts(shared, sources, count)
        assert len(parts) == want
        entries = [e for p in parts for e in p.entries]
        assert sorted(entries) == sorted(s.name for s in sources)
        for p in parts:  # each part's text is its kernels, in launch order
            assert p.text.count("__kernel") == len(p.entries)
            assert list(p.entries) == sorted(p.entries, key=lambda e: int(e[1:]))
        assert prebuild.split_parts(shared, sources, count) == parts
    # One part for a count under 2 (no workers) and below the thresholds: the whole text.
    for count in (0, 1):
        (one,) = prebuild.split_parts(shared, sources, count)
        assert one.text == shared.text
    monkeypatch.setattr(prebuild, "SPLIT_MIN_CHARS", 10**9)
    (one,) = prebuild.split_parts(shared, sources)
    assert one.text == shared.text


@needs_device
def test_one_part_a_worker_and_one_where_none_would_build(monkeypatch):
    rt = Runtime.get(None)
    if not prebuild.driver_caches_kernels(rt):
        assert prebuild.part_count(rt, None) == 1
        return
    assert prebuild.part_count(rt, 0) == 1
    assert prebuild.part_count(rt, 1) == 1
    assert prebuild.part_count(rt, 3) == 3
    assert prebuild.part_count(rt, 64) == prebuild.MAX_PARTS
    assert prebuild.part_count(rt, None) == max(1, prebuild.worker_count(rt, None,
                                                                         prebuild.MAX_PARTS))


def _chain() -> tuple[Graph, dict, np.ndarray]:
    """Convolutions of different widths and sizes: distinct kernels, each with relu."""
    g = Graph("chain")
    x = g.input("x", (1, 3, 12, 12))
    widths = [3, 8, 16, 8, 4]
    want = None
    xa = rand(1, 3, 12, 12)
    want = xa.astype(np.float64)
    y = x
    for cin, cout in zip(widths, widths[1:], strict=False):
        w, b = rand(cout, cin, 3, 3), rand(cout)
        y = ops.relu(ops.conv2d(y, g.constant(w), g.constant(b), padding="same"))
        want = np.maximum(conv_nchw(want, w, b, pads=(1, 1, 1, 1)), 0.0)
    g.output("y", y)
    return g, {"x": xa}, want


def _split_small_programs(monkeypatch):
    monkeypatch.setattr(prebuild, "SPLIT_MIN_CHARS", 1)
    monkeypatch.setattr(prebuild, "SPLIT_MIN_KERNELS", 2)


def _pocl_cpu() -> bool:
    return prebuild.driver_caches_kernels(Runtime.get(None))


@needs_device
def test_workers_build_the_parts_and_first_launches_and_results_match(tmp_path, monkeypatch):
    if not _pocl_cpu():
        pytest.skip("workers build for PoCL's CPU devices only")
    _split_small_programs(monkeypatch)
    g, arrays, want = _chain()
    # Phase launches off: the call's kernels stay several for the workers to launch.
    cfg = Config(cache_dir=tmp_path, build_workers=2, use_tuning_records=False,
                 phase_launches=False)
    exe, outs = run(g, arrays, config=cfg)
    inner = exe.executable
    assert len(inner._cl_programs) > 1
    parts = len(inner._cl_programs)
    launched = len({inner.entries[k.name] for k in inner.kernels if k.name not in inner.hoisted})
    assert inner.prebuilt == (parts, launched)
    close(outs["y"], want)
    # Noted: compiled again (a new process would be the same), the workers are not started.
    assert len(list((tmp_path / "prebuilt").iterdir())) == parts
    from tilec.runtime import compiled

    monkeypatch.setattr(compiled, "load", lambda *a, **k: None)  # not the in-memory result
    again, outs = run(g, arrays, config=cfg)
    assert again.executable.prebuilt == (0, 0)
    close(outs["y"], want)
    # `tilec cache clear` forgets the notes (the driver's cache may be gone as well).
    from tilec.cli.main import main

    monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path))
    assert main(["cache", "clear"]) == 0
    assert not list((tmp_path / "prebuilt").iterdir())


@needs_device
def test_dead_workers_leave_the_build_to_the_compiling_process(tmp_path, monkeypatch):
    if not _pocl_cpu():
        pytest.skip("workers build for PoCL's CPU devices only")
    _split_small_programs(monkeypatch)
    script = tmp_path / "dies.py"
    script.write_text("import sys\nsys.stdin.readline()\nsys.exit(3)\n")
    monkeypatch.setattr(prebuild, "_WORKER", script)
    g, arrays, want = _chain()
    exe, outs = run(g, arrays, config=Config(cache_dir=tmp_path, build_workers=2))
    assert exe.executable.prebuilt == (0, 0)
    assert not (tmp_path / "prebuilt").exists()
    close(outs["y"], want)


@needs_device
def test_a_failed_job_is_reported_and_the_worker_goes_on(tmp_path):
    rt = Runtime.get(None)
    good = "__kernel void k(__global float* a) { a[get_global_id(0)] = 1.0f; }\n"
    parts = [prebuild.Part(good, ("k",)), prebuild.Part("__kernel void k( {", ("k",))]
    workers = prebuild.BuildWorkers(rt, 1)
    workers.give_texts(parts, ["-cl-mad-enable"])
    seen = []
    try:
        ok = workers.run([{"op": "build", "part": 1}, {"op": "build", "part": 0},
                          {"op": "launch", "part": 0, "entry": "nope", "global": [4],
                           "local": None, "args": [16]},
                          {"op": "launch", "part": 0, "entry": "k", "global": [4],
                           "local": None, "args": [16]}],
                         on_done=lambda j, good: seen.append((j, good)))
    finally:
        workers.close()
    assert ok == [False, True, False, True]
    assert sorted(seen) == list(enumerate(ok))  # what a progress bar counts


@needs_device
def test_a_worker_warming_up_in_a_thread_builds_and_launches(tmp_path):
    """Where a core is free for it, a worker builds a tiny program in a thread while it
    answers the first requests; its builds and launches wait for that thread."""
    from types import SimpleNamespace

    rt = Runtime.get(None)
    roomy = SimpleNamespace(cl=rt.cl, device=rt.device, compute_units=64)
    good = "__kernel void k(__global float* a) { a[get_global_id(0)] = 2.0f; }\n"
    workers = prebuild.BuildWorkers(roomy, 1)
    try:
        workers.give_texts([prebuild.Part(good, ("k",))], ["-cl-mad-enable"])
        ok = workers.run([{"op": "build", "part": 0},
                          {"op": "launch", "part": 0, "entry": "k", "global": [4],
                           "local": None, "args": [16]}])
    finally:
        workers.close()
    assert ok == [True, True]


@needs_device
def test_closed_workers_exit_without_the_compile_waiting():
    """`close` ends the workers' input and returns; their exits (the driver's teardown) are
    awaited in a thread, or here with `wait`."""
    import time

    rt = Runtime.get(None)
    for wait in (False, True):
        workers = prebuild.BuildWorkers(rt, 2)
        procs = list(workers._procs)
        workers.close(wait=wait)
        if wait:
            assert all(p.poll() is not None for p in procs)
        deadline = time.monotonic() + 30
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(p.returncode == 0 for p in procs)


def test_workers_only_where_they_help():
    class Fake:
        compute_units = 16

    assert prebuild.worker_count(Fake(), None, 30) == prebuild.MAX_WORKERS
    assert prebuild.worker_count(Fake(), None, 3) == 3
    assert prebuild.worker_count(Fake(), 1, 30) == 0
    assert prebuild.worker_count(Fake(), 0, 30) == 0
    Fake.compute_units = 1
    assert prebuild.worker_count(Fake(), None, 30) == 0


@needs_device
@pytest.mark.parametrize("ending", ["raise SystemExit(0)", "raise ValueError('late')"])
def test_a_process_holding_workers_exits(tmp_path, ending):
    """Workers still held when the interpreter exits (an executable kept in a global, a
    script that failed after its compile) are stopped there, without a thread: a thread
    started while Python exits waits forever, and so did the process."""
    import subprocess
    import sys

    if not _pocl_cpu():
        pytest.skip("workers build for PoCL's CPU devices only")
    script = tmp_path / "held.py"
    script.write_text("import tilec.runtime.prebuild as prebuild\n"
                      "from tilec.runtime.device import Runtime\n"
                      "held = prebuild.BuildWorkers(Runtime.get(None), 2)\n"
                      f"{ending}\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == (0 if "SystemExit" in ending else 1), done.stderr
