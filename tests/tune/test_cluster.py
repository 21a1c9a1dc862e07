"""Tuning spread over workers (`tune.jobs`, `tune.cluster`, `tilec tune --cluster`): the jobs
travel, the driver tunes each distinct kernel once and resumes from the records, a cluster's
records equal a single worker's choice for choice, and a worker killed mid-run is survived.

Clusters here are local, on the CPU device: one in this process (with an injected timer, so
that the choices are the timer's) and worker processes (real timing, or a timer they import
from this module)."""

from __future__ import annotations

import json
import os
import pickle
import signal
import time
import zlib
from dataclasses import replace
from pathlib import Path

import pytest

from tilec.cli.main import main
from tilec.config import Config
from tilec.errors import TileError
from tilec.lang.api import parse
from tilec.lang.source import default_shapes, read_source
from tilec.runtime.device import split_index
from tilec.tune import cluster
from tilec.tune.jobs import (
    KernelJob,
    KernelResult,
    Ledger,
    PlannedKernel,
    ProgramJob,
    ProgramPlan,
    Settings,
    Tally,
    run_here,
)
from tilec.tune.records import DeviceKey, RecordStore

from ..device import needs_device

distributed = pytest.importorskip("distributed")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KEY = DeviceKey("Plat", "OpenCL 3.0", "Dev", "1.2")
# The seed's full-size conv is minutes of reference work on a CPU: the same kernel, smaller.
SMALLER = {"seed_conv.tile": {"D": (1, 20, 20, 32), "K": (3, 3, 32, 32)}}


# The choices of runs in different processes are compared: a CPU each worker measured for
# itself (Config's default, on first use in a process without stored facts) would plan from
# another noisy measurement.  The queried model is the same in every process.
CALIBRATE = False


def example_jobs(config: Config, top_k: int = 3) -> list[ProgramJob]:
    jobs = []
    for path in sorted(EXAMPLES.glob("*.tile")):
        src = read_source(path)
        shapes = SMALLER.get(path.name, default_shapes(src))
        dtypes = {i.name: "float32" for i in parse(src).inputs}
        jobs.append(ProgramJob.make(path.name, src.text, shapes, dtypes, config, top_k=top_k))
    return jobs


def tuned_kernels(config: Config) -> int:
    """Kernels the example jobs tune on this device (a CPU packs the matmul's B in panels
    first: two kernels there)."""
    from tilec.tune.measure import Prepared

    n = 0
    for job in example_jobs(config):
        prep = Prepared(job.source, dict(job.shapes), dict(job.dtypes), config)
        n += len(prep.plan.kernels)
    return n


def fake_time(c) -> float:
    """A time per candidate that depends on nothing but the candidate (10% steps, past the
    noise floor), so that every run picks the same."""
    return 1e-3 * (1.0 + 0.1 * (zlib.crc32(c.label().encode()) % 7))


def slow_fake_time(c) -> float:
    time.sleep(0.2)  # long enough that a worker is still busy when the first result is in
    return fake_time(c)


def choices(ledger: Ledger) -> dict:
    return {(r.device, r.tuning.record.digest): (r.tuning.record.tile, r.tuning.record.local_size)
            for r in ledger.results if r.tuning is not None and r.tuning.record is not None}


# -- no device -----------------------------------------------------------------------------------

def test_jobs_travel_and_kinds_are_named_by_device():
    job = example_jobs(Config(records_path=Path("r.jsonl")))[0]
    kjob = KernelJob(job, "contract_C", Settings(repeat=3, timer=fake_time))
    assert pickle.loads(pickle.dumps(kjob)) == kjob
    assert pickle.loads(pickle.dumps(job)).key == job.key
    assert replace(job, seed=1).key != job.key
    assert cluster.resource_for(KEY) == cluster.resource_for(replace(KEY))
    assert cluster.resource_for(KEY) != cluster.resource_for(replace(KEY, driver="1.3"))
    assert cluster.resource_for(KEY).startswith(cluster.RESOURCE)
    assert split_index("NVIDIA#1") == ("NVIDIA", 1)
    assert split_index("NVIDIA") == ("NVIDIA", 0)
    assert split_index("odd#name") == ("odd#name", 0)


def planned(program: str, digest: str) -> PlannedKernel:
    return PlannedKernel(program, f"k_{digest}", "ContractionKernel", digest, (("A", (2,)),),
                         3, 1.0)


def test_ledger_tunes_each_kernel_once_and_resumes_from_the_records(tmp_path):
    from tilec.tune.records import TuneRecord

    store = RecordStore(tmp_path / "r.jsonl")
    store.append([TuneRecord(KEY, "k_done", "done", (("A", (2,)),), (), None, None, 1e-3)])
    ledger = Ledger(store)
    plan = ProgramPlan("p1", KEY, "hw", (planned("p1", "a"), planned("p1", "done"),
                                          planned("p1", "a")))
    other = ProgramPlan("p2", KEY, "hw", (planned("p2", "a"), planned("p2", "b")))
    assert [k.digest for k in ledger.admit(plan)] == ["a"]
    assert [k.digest for k in ledger.admit(other)] == ["b"]
    assert ledger.skipped == 1 and ledger.duplicates == 2
    assert [k.digest for k in Ledger(store, retune=True).admit(plan)] == ["a", "done"]
    failed = Ledger(store)
    failed.admit(ProgramPlan("p3", None, "", (), "no device"), "x.tile")
    failed.record(KernelResult("p1", "k_a", KEY, "hw", None, "out of memory", "gpu1"))
    assert not failed.complete()
    assert failed.failed == ["x.tile: no device", "p1 k_a: out of memory (on gpu1)"]


def test_tally_counts_work_done_twice_when_a_task_moves():
    seen = []
    tally = Tally(lambda done, total, label: seen.append((done, total, label)))
    tally.expect("a", 3)
    tally.expect("b", 2)
    tally.update("a", "w0", 2, 3)
    tally.update("b", "w1", 1, 2)
    tally.update("a", "w1", 1, 3)  # w0 died after two candidates: a starts again on w1
    assert (tally.done, tally.total) == (4, 7)
    tally.update("a", "w1", 3, 3)
    tally.update("b", "w1", 2, 2)
    assert (tally.done, tally.total) == (7, 7)
    assert tally.by_worker == {"w0": 2, "w1": 5}
    assert seen[-1] == (7, 7, "w0:2 w1:5")


def test_a_missing_dask_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(cluster, "distributed", None)
    with pytest.raises(TileError, match=r"pip install 'tilec\[cluster\]'"):
        with cluster.connect("local"):
            pass


def test_cli_refuses_workers_without_a_local_cluster(tmp_path, capsys):
    assert main(["tune", str(EXAMPLES / "matmul.tile"), "--workers", "2"]) == 1
    assert "--cluster local" in capsys.readouterr().err


# -- on the CPU device -----------------------------------------------------------------------------

@needs_device
def test_local_workers_share_a_cpu_device_and_each_gpu_gets_one():
    from tilec.runtime.device import choose_device, describe

    pins = cluster.local_pins(None, 2)
    chosen = choose_device()
    if describe(chosen).kind == "gpu":
        assert len({p for _, p in pins}) == min(2, len(pins))
    else:
        assert [n for n, _ in pins] == ["cpu0", "cpu1"] and pins[0][1] == pins[1][1]
    assert all(choose_device(p) == chosen for _, p in pins[:1])
    with pytest.raises(TileError, match="at least 1"):
        cluster.local_pins(None, 0)


@needs_device
def test_a_cluster_in_process_records_what_one_worker_records(tmp_path):
    """Two workers in this process, the timer injected: the records equal, choice for
    choice, those of the same jobs run one after another here; a second run resumes."""
    config = Config(records_path=tmp_path / "one.jsonl", calibrate=CALIBRATE)
    settings = Settings(repeat=2, warmup=1, timer=fake_time)
    one = Ledger(RecordStore(config.records_path))
    run_here(example_jobs(config), settings, one)
    assert one.complete() and len(one.results) == tuned_kernels(config)

    two = Ledger(RecordStore(tmp_path / "two.jsonl"))
    seen = []
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as lc, distributed.Client(lc) as c:
        cluster.tune_on(c, example_jobs(config), settings, two,
                        bar=lambda done, total, label: seen.append((done, total, label)))
        assert two.complete()
        assert choices(two) == choices(one)
        assert RecordStore(tmp_path / "two.jsonl").load().keys() == \
            RecordStore(config.records_path).load().keys()
        assert seen[-1][0] == seen[-1][1] > 0  # one display: every candidate counted
        assert len({r.worker for r in two.results}) == 2  # both workers took kernels

        again = Ledger(RecordStore(tmp_path / "two.jsonl"))
        cluster.tune_on(c, example_jobs(config), settings, again)
        assert again.results == [] and again.skipped == len(one.results)

        # Interrupted after the first kernel: that record is kept, and the next run resumes.
        def interrupt(result: KernelResult) -> None:
            raise KeyboardInterrupt

        cut = Ledger(RecordStore(tmp_path / "cut.jsonl"))
        with pytest.raises(KeyboardInterrupt):
            cluster.tune_on(c, example_jobs(config), settings, cut, on_result=interrupt)
        assert len(RecordStore(tmp_path / "cut.jsonl").load()) == 1
        resumed = Ledger(RecordStore(tmp_path / "cut.jsonl"))
        cluster.tune_on(c, example_jobs(config), settings, resumed)
        assert resumed.skipped == 1 and len(resumed.results) == len(one.results) - 1
        assert {**choices(cut), **choices(resumed)} == choices(one)


@needs_device
def test_two_worker_processes_choose_as_one(tmp_path, monkeypatch):
    """Worker processes (the Nanny's), one and two of them, the timer injected so that the
    outcome does not hang on this machine's load: the same choice for every kernel, each
    worker took kernels, and the Nanny's thread setting is undone afterwards."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the workers' cache root
    threads = os.environ.get("OMP_NUM_THREADS")
    ledgers = []
    for workers in (1, 2):
        config = Config(records_path=tmp_path / f"w{workers}.jsonl", calibrate=CALIBRATE)
        ledger = Ledger(RecordStore(config.records_path))
        with cluster.connect("local", None, workers) as client:
            cluster.tune_on(client, example_jobs(config),
                            Settings(repeat=3, warmup=1, timer=fake_time), ledger)
        assert ledger.complete(), ledger.summary()
        assert len({r.worker for r in ledger.results}) == workers
        assert os.environ.get("OMP_NUM_THREADS") == threads  # the Nanny's setting undone
        ledgers.append(ledger)
    one, two = (choices(x) for x in ledgers)
    assert len(one) == tuned_kernels(config)
    assert one == two


def _kill_one_busy_worker(tmp_path: Path, attempt: int) -> tuple[Config, Ledger, list[str]]:
    """Tune the examples on two workers, SIGKILLing one that is busy when the first result
    comes in; (config, ledger, [the killed worker's address])."""
    config = Config(records_path=tmp_path / f"r{attempt}.jsonl", calibrate=CALIBRATE)
    settings = Settings(repeat=2, warmup=1, timer=slow_fake_time)
    ledger = Ledger(RecordStore(config.records_path))
    killed: list[str] = []
    with cluster.connect("local", None, 2) as client:
        def kill_a_busy_worker(result: KernelResult) -> None:
            busy = [a for a, keys in client.processing().items() if keys]
            if not killed and busy:
                pid = client.run(os.getpid, workers=busy[:1])[busy[0]]
                os.kill(pid, signal.SIGKILL)
                killed.append(busy[0])

        cluster.tune_on(client, example_jobs(config), settings, ledger,
                        on_result=kill_a_busy_worker)
    return config, ledger, killed


@needs_device
def test_a_worker_killed_mid_run_is_survived(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    # The victim's task can finish between the scheduler saying it is busy and the kill (the
    # round trip for its pid): then it was lost idle, which tests nothing.  Try again.
    for attempt in range(3):
        config, ledger, killed = _kill_one_busy_worker(tmp_path, attempt)
        assert killed, "no worker was busy when a result came in"
        assert ledger.complete(), ledger.summary()
        if any(f"({killed[0]}) was lost while running" in e for e in ledger.events):
            break
    assert any(f"({killed[0]}) was lost while running" in e for e in ledger.events)
    assert any("re-run on" in e for e in ledger.events)
    settings = Settings(repeat=2, warmup=1, timer=fake_time)
    # Nothing lost, nothing changed: every kernel has its record, the timer's choice.
    alone = Ledger(RecordStore(tmp_path / "alone.jsonl"))
    run_here(example_jobs(config), settings, alone)
    assert choices(ledger) == choices(alone)
    assert RecordStore(config.records_path).load().keys() == \
        RecordStore(tmp_path / "alone.jsonl").load().keys()


@needs_device
def test_cli_tunes_files_and_graphs_on_a_local_cluster_and_resumes(tmp_path, capsys,
                                                                    monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    mm = tmp_path / "mm.tile"
    mm.write_text((EXAMPLES / "matmul.tile").read_text().replace("1024", "64"))
    twin = tmp_path / "twin.tile"  # the same kernel again: tuned once
    twin.write_text(mm.read_text())
    script = tmp_path / "g.py"
    script.write_text(
        "import numpy as np\nimport tilec\nfrom tilec import ops\n\n"
        "def graph():\n    g = tilec.Graph('mlp')\n    x = g.input('x', (8, 32))\n"
        "    w = g.constant(np.ones((32, 16), np.float32))\n"
        "    g.output('y', ops.relu(ops.matmul(x, w)))\n    return g\n")
    records = tmp_path / "r.jsonl"
    args = ["tune", str(mm), str(twin), str(script), "--top-k", "2", "--repeat", "2",
            "--warmup", "1", "--records", str(records), "--quiet"]
    assert main([*args, "--cluster", "local", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "tuned 2 kernels" in out and "1 repeated kernels tuned once" in out
    assert "2 records appended" in out
    kernels = {json.loads(line)["kernel"] for line in records.read_text().splitlines()}
    assert len(kernels) == 2 and "contract_C" in kernels
    # Resumed (here, without a cluster): both kernels have records.
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "tuned 0 kernels" in out and "2 already had records (skipped)" in out
    assert "no records written" in out
    # The graph's kernel is the one `compile` builds: it finds the record.
    from tilec.cli.graph import load_graph
    from tilec.graph.builder import GraphExecutable

    g = load_graph(str(script), {}, {}).optimized()
    exe = GraphExecutable.build(g, config=Config(records_path=records))
    assert exe.executable is not None and exe.executable.tuned


@needs_device
def test_cli_tunes_an_onnx_model_in_process_and_its_compile_uses_the_records(tmp_path, capsys):
    onnx = pytest.importorskip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    import tilec.onnx.importer as tonnx

    w = numpy_helper.from_array(np.arange(16 * 8, dtype=np.float32).reshape(16, 8) / 64, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [w])
    path = tmp_path / "mlp.onnx"
    onnx.save(helper.make_model(graph), str(path))
    records = tmp_path / "r.jsonl"
    assert main(["tune", str(path), str(EXAMPLES / "softmax.tile"), "--top-k", "2",
                 "--repeat", "2", "--records", str(records), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "tuned 2 kernels" in out and "(here: 2 in" in out and "2 records appended" in out
    exe = tonnx.load(str(path), config=Config(records_path=records), quiet=True)
    assert exe.last is not None and exe.last.executable.tuned
