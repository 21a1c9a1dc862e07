"""Tile searches run ahead in the build workers (`runtime.search_ahead`): the compiling
process withdraws a search no worker has taken, waits for one a worker runs, and finds a
worker's outcome in the search cache, the same as its own; a compile that used them gives the
numpy reference's results, and so does one whose workers died."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import tilec.runtime.prebuild as prebuild
import tilec.runtime.search_ahead as search_ahead
from tilec.config import Config
from tilec.graph import ops
from tilec.graph.builder import Graph
from tilec.plan.hw import HwModel
from tilec.plan.search import search
from tilec.runtime.device import Runtime

from ..device import needs_device
from ..flats import matmul_flat
from ..graph_refs import close, conv_nchw, run

CPU = HwModel.load("pocl-cpu")
RNG = np.random.default_rng(11)


class _Workers:
    """BuildWorkers' `serve` on one thread: each job waits for its release."""

    def __init__(self):
        self.release: dict[int, threading.Event] = {}
        self.taken: list[int] = []

    def serve(self, take, on_done):
        while (got := take()) is not None:
            i, job = got
            assert job["op"] == "search" and job["index"] == i
            self.taken.append(i)
            self.release.setdefault(i, threading.Event()).wait(5)
            on_done(i, True)


def _jobs(tmp_path, count: int) -> list[dict]:
    return [dict(flat=matmul_flat(16 * (i + 1), 32, 48), hw=CPU, top_k=4,
                 cache=tmp_path / "search") for i in range(count)]


def test_settle_withdraws_waits_and_close_joins(tmp_path):
    workers = _Workers()
    for i in range(4):
        workers.release[i] = threading.Event()
    jobs = _jobs(tmp_path, 4)
    # The same search twice (another tensor's name, another cache folder) is one job.
    ahead = search_ahead.SearchAhead(workers, jobs + [dict(jobs[1], cache=tmp_path)])
    assert len(ahead._state) == 4
    # The workers start from the end: k3 is taken (and held) before anything settles.
    for _ in range(100):
        if workers.taken:
            break
        threading.Event().wait(0.01)
    assert workers.taken == [3]
    ahead.settle(jobs[0])  # not taken: withdrawn, done by the caller
    ahead.settle(_jobs(tmp_path, 5)[4])  # not a search ahead: nothing to wait for
    waited = threading.Thread(target=ahead.settle, args=(jobs[3],))
    waited.start()
    waited.join(0.2)
    assert waited.is_alive()  # running in a worker: awaited
    workers.release[3].set()
    waited.join(5)
    assert not waited.is_alive()
    for e in workers.release.values():
        e.set()
    ahead.close()
    assert 0 not in workers.taken and ahead.ahead == len(workers.taken)
    assert not ahead._file.exists()


def test_no_search_ahead_without_workers_or_with_one_search():
    assert search_ahead.start(None, [{}, {}]) is None
    assert search_ahead.start(_Workers(), [{}]) is None


def _pocl_cpu() -> bool:
    return prebuild.driver_caches_kernels(Runtime.get(None))


@needs_device
def test_a_workers_outcome_is_the_one_found_here(tmp_path):
    if not _pocl_cpu():
        pytest.skip("workers run on PoCL's CPU devices only")
    flats = [matmul_flat(48, 64, 80), matmul_flat(96, 32, 64), matmul_flat(40, 72, 24)]
    jobs = [dict(flat=f, hw=CPU, top_k=4, cache=tmp_path / "search") for f in flats]
    workers = prebuild.BuildWorkers(Runtime.get(None), 2)
    try:
        ahead = search_ahead.SearchAhead(workers, jobs)
        for _ in range(500):  # two workers take two jobs at once, the third after one
            if "queued" not in ahead._state:
                break
            threading.Event().wait(0.01)
        ahead.close()
    finally:
        workers.close()
    assert ahead.ahead >= 1
    cached = 0
    for flat in flats:
        here = search(flat, CPU, top_k=4)  # no cache: searched in this process
        found = search(flat, CPU, top_k=4, cache=tmp_path / "search")
        if found.cached:
            cached += 1
            assert [t for t, _ in found.top] == [t for t, _ in here.top]
    assert cached == ahead.ahead  # each answer a worker gave is in the cache


def _convs() -> tuple[Graph, dict, np.ndarray]:
    g = Graph("convs")
    x = g.input("x", (1, 3, 10, 10))
    xa = RNG.uniform(-1, 1, (1, 3, 10, 10)).astype(np.float32)
    want = xa.astype(np.float64)
    y = x
    widths = [3, 8, 16, 12, 8, 4]
    for cin, cout in zip(widths, widths[1:], strict=False):
        w = RNG.uniform(-1, 1, (cout, cin, 3, 3)).astype(np.float32)
        b = RNG.uniform(-1, 1, cout).astype(np.float32)
        y = ops.relu(ops.conv2d(y, g.constant(w), g.constant(b), padding="same"))
        want = np.maximum(conv_nchw(want, w, b, pads=(1, 1, 1, 1)), 0.0)
    g.output("y", y)
    return g, {"x": xa}, want


@needs_device
def test_a_compile_with_searches_ahead_matches_numpy(tmp_path, monkeypatch):
    if not _pocl_cpu():
        pytest.skip("workers run on PoCL's CPU devices only")
    monkeypatch.setattr(prebuild, "SPLIT_MIN_KERNELS", 1)
    made = []
    real = search_ahead.SearchAhead

    def spy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(search_ahead, "SearchAhead", spy)
    g, arrays, want = _convs()
    _, outs = run(g, arrays, config=Config(cache_dir=tmp_path, build_workers=2,
                                           use_tuning_records=False))
    close(outs["y"], want)
    assert made and len(made[0]._state) >= 2


@needs_device
def test_dead_workers_leave_the_searches_here(tmp_path, monkeypatch):
    if not _pocl_cpu():
        pytest.skip("workers run on PoCL's CPU devices only")
    monkeypatch.setattr(prebuild, "SPLIT_MIN_KERNELS", 1)
    script = tmp_path / "dies.py"
    script.write_text("import sys\nsys.stdin.readline()\nsys.exit(3)\n")
    monkeypatch.setattr(prebuild, "_WORKER", script)
    g, arrays, want = _convs()
    _, outs = run(g, arrays, config=Config(cache_dir=tmp_path, build_workers=2,
                                           use_tuning_records=False))
    close(outs["y"], want)
