"""oclgrind jobs made of tests: the graph-builder, pass and memory-pool tests and ONNX's cases
(node cases, pytorch-converted / -operator models, the small CNN) build their programs from
graphs and models and check each against a reference of their own (numpy, ONNX's expected
outputs).  A job runs a batch of them with pytest inside tests/grind.py's child process, where
oclgrind is the only OpenCL device, so every kernel they launch runs under it.

- "races": the tests as written (they poison what the kernels write).
- "uninit": poisoning is turned off (oclgrind counts a clEnqueueFillBuffer as uninitialised).

Every `Launcher.run` is recorded (kernel launches, distinct kernel texts).  No device buffer is
released before the child ends: oclgrind 21.10's uninitialised-value plugin (MemCheckUninitialized)
has no hook for a released buffer, so a later buffer that gets the released one's slot keeps the
old buffer's shadow and size, and what a kernel writes past the old size reads back as
uninitialised: a false report, reproduced by tests/grind.py's `STALE_SHADOW` (one process runs
many programs here, so slots are reused; a kernel-case job runs one program).

Tests that run no kernel (without a device mark) and the `slow` tallies are left out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from .grind import ROOT, Job

GRAPH_TESTS = ("tests/graph/test_graph.py", "tests/graph/test_passes.py",
               "tests/runtime/test_memory.py")
ONNX_TESTS = ("tests/onnx/test_onnx.py",)
# Kernel tests beyond kernel_cases: split reductions (barriers and a local tree) and staging.
KERNEL_TESTS = ("tests/codegen/test_split_reduction.py", "tests/codegen/test_staging.py")
# Tests per job: a child imports test_onnx in ~4 s.
PER_JOB = {"graph": 6, "onnx": 24, "kernel-tests": 30}
# Tests that take minutes under oclgrind run in a job of their own with this time limit (s).
# test_operator_conv: a 20x16x50x40 input by 13x16x3x3 weights, 68 million multiply-adds,
# 126 to 209 s in the races pass, 761 s in the uninit pass (-cl-opt-disable) on 2 busy cores.
HEAVY = {"test_operator_conv": 1800}


def batch_jobs(kind: str, files: tuple[str, ...], per_job: int | None = None) -> list[Job]:
    """Jobs of at most `per_job` tests that run kernels: a test function's parameters stay
    together where they fit, small functions share a job, a `HEAVY` test has one to itself.
    ONNX cases refused on purpose (`onnx_cases.UNSUPPORTED`) run no kernel and are left out."""
    from .onnx_cases import UNSUPPORTED

    per_job = per_job or PER_JOB.get(kind, 8)
    groups: dict[str, list[str]] = {}
    heavy: list[Job] = []
    for nodeid in collect(files):
        func, _, param = nodeid.partition("[")
        test = param.rstrip("]") or func.rpartition("::")[2]
        if test in HEAVY:
            heavy.append(Job(f"{kind}/{test}", "", {}, tests=(nodeid,), timeout=HEAVY[test]))
        elif test not in UNSUPPORTED:
            groups.setdefault(func, []).append(nodeid)
    chunks: list[tuple[str, list[str]]] = []
    for func, ids in groups.items():
        name = func.rsplit("/", 1)[-1].replace(".py::", "::")
        parts = [ids[i:i + per_job] for i in range(0, len(ids), per_job)]
        if len(parts) == 1 and chunks and "#" not in chunks[-1][0] \
                and len(chunks[-1][1]) + len(ids) <= per_job:
            last, before = chunks[-1]
            chunks[-1] = (last if last.endswith("+") else last + "+", before + ids)
            continue
        for k, part in enumerate(parts):
            chunks.append((name + (f"#{k}" if len(parts) > 1 else ""), part))
    return heavy + [Job(f"{kind}/{name}", "", {}, tests=tuple(ids)) for name, ids in chunks]


def collect(files: tuple[str, ...]) -> list[str]:
    """Node ids of the tests in `files` that run kernels, collected in a child process on the
    ordinary device (collecting imports the test modules)."""
    p = subprocess.run([sys.executable, "-m", "tests.grind_pytest", "collect", *files],
                       capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    for line in p.stdout.splitlines():
        if line.startswith("@@result "):
            return json.loads(line[len("@@result "):])
    raise RuntimeError(f"collecting {files} failed: {p.stdout[-2000:]}{p.stderr[-2000:]}")


class _Collect:
    """pytest plugin: the tests marked to skip without a device, less the slow ones."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            device = any("device" in str(m.kwargs.get("reason", ""))
                         for m in item.iter_markers("skipif"))
            if device and item.get_closest_marker("slow") is None:
                self.items.append(item.nodeid)


class _Tally:
    """pytest plugin: what each test of a job came to."""

    def __init__(self) -> None:
        self.counts = {"passed": 0, "failed": 0, "skipped": 0}
        self.problems: list[str] = []

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed:
            self.counts["failed"] += 1
            self.problems.append(f"{report.nodeid} ({report.when}): "
                                 f"{report.longreprtext[-1500:]}")
        elif report.skipped:
            self.counts["skipped"] += 1
            self.problems.append(f"{report.nodeid} skipped: {report.longrepr}")
        elif report.when == "call":
            self.counts["passed"] += 1

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.counts["failed"] += 1
            self.problems.append(f"collecting {report.nodeid}: {report.longreprtext[-1500:]}")


def run_tests(mode: str) -> None:
    """Child side (tests/grind.py's worker "tests:MODE"): run the job's tests; the result as
    JSON on stdout, oclgrind's reports on stderr."""
    import hashlib
    import warnings

    import pytest

    from tilec.runtime.device import Runtime
    from tilec.runtime.launch import Launcher

    warnings.simplefilter("ignore")
    job = json.loads(sys.stdin.read())
    kernels: list[str] = []
    sources: set[str] = set()
    original_run, allocate = Launcher.run, Runtime.buffer
    kept: list[Any] = []

    def run(self, arrays, *, poison: bool = False, repeat: int = 1):
        outs = original_run(self, arrays, poison=poison and mode == "races", repeat=repeat)
        kernels.extend(k.name for _ in range(max(1, repeat)) for k in self.kernels)
        sources.update(hashlib.sha256(s.text.encode()).hexdigest()[:16]
                       for s in getattr(self, "sources", ()))
        return outs

    def buffer(self, nbytes: int):
        kept.append(allocate(self, nbytes))  # never released: see the module's docstring
        return kept[-1]

    Launcher.run = run  # type: ignore[method-assign]
    Runtime.buffer = buffer  # type: ignore[method-assign]
    tally = _Tally()
    # A temporary directory of its own: many sessions would rotate other runs' numbered
    # directories out of pytest's default base.
    with tempfile.TemporaryDirectory(prefix="grind-") as tmp:
        rc = pytest.main([*job["tests"], "-q", "-s", "-p", "no:cacheprovider",
                          f"--basetemp={tmp}/t"], plugins=[tally])
    error = "\n".join(tally.problems) if tally.counts["failed"] else ""
    if not error and (rc != 0 or not tally.counts["passed"]):
        error = f"pytest exit code {int(rc)}, {tally.counts}: " + "\n".join(tally.problems)
    print("@@result " + json.dumps({"kernels": kernels, "sources": sorted(sources),
                                    "valid": not error, "error": error,
                                    "tests": tally.counts}), flush=True)


if __name__ == "__main__" and sys.argv[1:2] == ["collect"]:
    import pytest

    found = _Collect()
    pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[2:]],
                plugins=[found])
    print("@@result " + json.dumps(found.items), flush=True)
