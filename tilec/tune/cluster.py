"""Tuning spread over a Dask cluster whose workers each own one device (`tilec tune
--cluster local|SCHEDULER_ADDRESS`).

Why Dask: it already places tasks on workers by resource, puts the tasks of a worker that
died back in the queue for another worker with that resource, and carries events from tasks
to the client; no socket code of our own.  It is an optional extra (`pip install
'tilec[cluster]'`) and this is the only module that imports it.

Devices.  A worker owns the device its environment names (TILEC_WORKER_DEVICE, a device
spec such as "NVIDIA#1"; without it, the driver's --device).  The plugin registered on every
worker (and on those that join later, or come back after a crash) opens that device and
declares the resource `tilec-device-<digest of platform, device and driver>`.  Every task
asks for the resource of the device kind it tunes for, so identical GPUs share the work and
a dead worker's task goes to another worker of the same kind.

The driver (`tune_on`) plans each program on a worker, then hands out the kernels, the
longest first and no more at a time than the kind has workers, so that a worker that frees
up takes the longest kernel left (the scheduler would otherwise assign every task at once).
Records are appended as results arrive (`jobs.Ledger`).  A kernel whose device failed runs
once more on another worker of its kind; a worker lost mid-run is reported with its
kernels."""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import itertools
import json
import logging
import os
import queue
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from ..errors import TileError
from .jobs import (
    KernelJob,
    KernelResult,
    Ledger,
    PlannedKernel,
    ProgramJob,
    ProgramPlan,
    Settings,
    Tally,
    Workbench,
)
from .records import DeviceKey

try:
    import dask
    import distributed
except ImportError:  # the optional extra: `require` says how to get it
    dask = distributed = None  # type: ignore[assignment]

PIN_VARIABLE = "TILEC_WORKER_DEVICE"
RESOURCE = "tilec-device-"
PROGRESS_TOPIC = "tilec-progress"
# A device kind with work left and no worker for this long fails that work rather than wait
# for ever (a local worker that crashed is back in seconds).
NO_WORKER_S = 120.0


def require() -> None:
    if distributed is None:
        raise TileError("tuning on a cluster needs Dask: pip install 'tilec[cluster]'")


def resource_for(device: DeviceKey) -> str:
    body = json.dumps(device.to_json(), sort_keys=True).encode()
    return RESOURCE + hashlib.sha256(body).hexdigest()[:12]


class DevicePlugin(distributed.WorkerPlugin if distributed is not None else object):  # type: ignore[misc]
    """Opens the worker's device and declares its kind as a resource."""

    name = "tilec-device"
    idempotent = False  # a driver with another --device replaces the last one's

    def __init__(self, device: str | None):
        self.device = device

    async def setup(self, worker) -> None:
        # A worker's device comes from its environment, which its Nanny (or the user
        # starting `dask worker`) sets: workers of one cluster share the driver's job.
        pin = os.environ.get(PIN_VARIABLE) or self.device
        bench = Workbench(pin)
        loop = asyncio.get_running_loop()
        try:  # opening a device takes a while: not on the worker's event loop
            key, label = await loop.run_in_executor(None, bench.device_key)
        except TileError as e:  # no such device here: this worker takes no tuning task
            worker.tilec, worker.tilec_about = None, {"pin": pin, "error": str(e)}
            return
        mine = resource_for(key)
        worker.tilec = bench
        worker.tilec_about = {"pin": pin, "device": key, "label": label, "resource": mine}
        stale = {r: 0 for r in worker.state.total_resources if r.startswith(RESOURCE)}
        await worker.set_resources(**{**stale, mine: 1})


def _about(dask_worker) -> dict | None:
    return getattr(dask_worker, "tilec_about", None)


def _bench(worker) -> Workbench:
    bench = getattr(worker, "tilec", None)
    if bench is None:  # only the plugin gives the resource these tasks ask for
        raise TileError(f"worker {worker.name} owns no device")
    return bench


def _plan_task(job: ProgramJob) -> ProgramPlan:
    return _bench(distributed.get_worker()).plan(job)


def _tune_task(job: KernelJob, key: str) -> KernelResult:
    worker = distributed.get_worker()
    name = str(worker.name)

    def progress(done: int, total: int, label: str) -> None:
        worker.log_event(PROGRESS_TOPIC, {"key": key, "worker": name, "done": done,
                                          "total": total})

    return _bench(worker).tune(job, progress, name)


# -- starting or reaching a cluster -------------------------------------------------------------

def local_pins(device: str | None, workers: int | None) -> list[tuple[str, str]]:
    """(worker name, device spec) of a local cluster: a worker per GPU that `device` matches
    (all GPUs without it, where there is one), or `workers` workers sharing the one CPU (or
    other) device it names; `workers` more than GPUs gives some GPUs two."""
    from ..runtime.device import all_devices, choose_device, describe, split_index

    devices = all_devices()
    chosen = choose_device(device)
    kind = describe(chosen).kind
    text, _ = split_index(device or "")
    if kind == "gpu" and "#" not in (device or ""):
        owned = [d for d in devices if describe(d).kind == "gpu"
                 and text.lower() in describe(d).label.lower()]
    else:
        owned = [chosen]
    if workers is not None and workers < 1:
        raise TileError("--workers must be at least 1")
    n = workers or len(owned)
    return [(f"{kind}{i}", _pin(owned[i % len(owned)], devices)) for i in range(n)]


def _pin(device, devices: list) -> str:
    """A spec that names this device and no other: its label, and its place among devices
    whose labels contain that label."""
    from ..runtime.device import describe

    label = describe(device).label
    same = [d for d in devices if label.lower() in describe(d).label.lower()]
    return f"{label}#{same.index(device)}"


def _local_cluster(pins: list[tuple[str, str]]):
    """A scheduler in this process and a worker process (under a Nanny, which restarts it if
    it dies) per pin; one thread each, since a worker times one kernel at a time."""
    specs = {name: {"cls": distributed.Nanny, "options": {
        "nthreads": 1, "memory_limit": 0, "silence_logs": logging.ERROR,
        "env": {PIN_VARIABLE: pin}}} for name, pin in pins}
    return distributed.SpecCluster(
        workers=specs, silence_logs=logging.ERROR, name="tilec-tune",
        scheduler={"cls": distributed.Scheduler,
                   "options": {"host": "127.0.0.1", "port": 0, "dashboard_address": None}})


@contextmanager
def _worker_threads(workers: int) -> Iterator[None]:
    """Numpy's threads a worker (its reference outputs): Dask's Nanny sets one, and sets it
    in this process's environment too before it spawns; here the host's cores are shared
    among the workers instead, and this process's environment is left as it was."""
    n = str(max(1, (os.cpu_count() or 1) // max(1, workers)))
    spawn = {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n}
    saved = dict(os.environ)
    try:
        with dask.config.set({"distributed.nanny.pre-spawn-environ": spawn}):
            yield
    finally:
        for k in set(os.environ) - set(saved):
            del os.environ[k]
        os.environ.update(saved)


@contextmanager
def connect(address: str, device: str | None = None,
            workers: int | None = None) -> Iterator[distributed.Client]:
    """A client of a new local cluster ("local") or of the scheduler at `address`."""
    require()
    if address == "local":
        pins = local_pins(device, workers)
        with _worker_threads(len(pins)), _local_cluster(pins) as cluster, \
                distributed.Client(cluster) as client:
            yield client
        return
    if workers is not None:
        raise TileError("--workers sizes a local cluster; an existing cluster's workers are "
                        "the ones started there with `dask worker`")
    try:
        client = distributed.Client(address, timeout=30)
    except (OSError, TimeoutError, ValueError) as e:
        raise TileError(f"cannot reach a Dask scheduler at {address}: {e}") from None
    with client:
        yield client


# -- the driver ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Task:
    kind: str  # the device kind's resource
    job: ProgramJob | KernelJob
    order: tuple = ()
    planned: PlannedKernel | None = None
    workers: tuple[str, ...] | None = None  # restricted to these (after a device failure)
    attempt: int = 0

    @property
    def tally_key(self) -> str:
        job = self.job
        if isinstance(job, KernelJob):
            return f"{self.kind}/{job.program.key}/{job.kernel}"
        return f"{self.kind}/{job.key}"


def tune_on(client, jobs: list[ProgramJob], settings: Settings, ledger: Ledger, *,
            device: str | None = None, bar=None,
            on_result: Callable[[KernelResult], None] | None = None) -> None:
    """Tune every kernel of `jobs` on the cluster's workers whose device matches `device`
    (every worker's without one), each device kind for itself; results go to `ledger`."""
    require()
    _Driver(client, jobs, settings, ledger, Tally(bar), on_result).run(device)


class _Driver:
    def __init__(self, client, jobs: list[ProgramJob], settings: Settings, ledger: Ledger,
                 tally: Tally, on_result):
        self.client, self.settings, self.ledger, self.tally = client, settings, ledger, tally
        self.on_result = on_result
        self.jobs = {j.key: j for j in jobs}
        self.events: queue.Queue = queue.Queue()
        self.run_id = uuid.uuid4().hex[:8]
        self.seq = itertools.count()
        self.waiting: dict[str, list] = {}
        self.running: dict = {}  # future -> _Task
        self.names: dict[str, str] = {}  # worker address -> name
        self.lost: dict[str, str] = {}  # dask key -> the worker it was lost with
        self.starved: dict[str, float] = {}
        self.labels: dict[str, str] = {}

    def run(self, device: str | None) -> None:
        kinds = self._register(device)
        for kind in kinds:
            self.waiting[kind] = []
            for job in self.jobs.values():
                self._push(_Task(kind, job, (0, next(self.seq))))
        topics = {PROGRESS_TOPIC: lambda ev: self.events.put(("progress", ev[1])),
                  "all": lambda ev: self.events.put(("cluster", ev[1]))}
        for topic, handler in topics.items():
            self.client.subscribe_topic(topic, handler)
        try:
            idle = True
            while self.running or any(self.waiting.values()):
                if idle:
                    self._top_up()
                try:
                    kind, msg = self.events.get(timeout=1.0)
                except queue.Empty:
                    idle = True
                    continue
                idle = kind != "progress"
                if kind == "done":
                    self._done(msg)
                elif kind == "progress":
                    self.tally.update(msg["key"], msg["worker"], msg["done"], msg["total"])
                elif msg.get("action") == "remove-worker" and not msg.get("expected"):
                    self._lost(msg)
        finally:
            for topic in topics:
                self.client.unsubscribe_topic(topic)
            if self.running:  # interrupted: nothing of this run stays queued on the cluster
                self.client.cancel(list(self.running))

    def _register(self, device: str | None) -> list[str]:
        from ..runtime.device import split_index

        statuses = self.client.register_plugin(DevicePlugin(device)) or {}
        for addr, status in sorted(statuses.items()):
            if isinstance(status, dict) and status.get("status", "OK") != "OK":
                self.ledger.events.append(f"worker {addr} could not open a device: "
                                          f"{status.get('exception', status)}")
        text = split_index(device or "")[0].lower()
        kinds = []
        for addr, about in sorted(self.client.run(_about).items()):
            if about is None:
                continue
            if "error" in about:
                self.ledger.events.append(f"worker {addr} has no device: {about['error']}")
            elif text in about["label"].lower() and about["resource"] not in kinds:
                kinds.append(about["resource"])
                self.labels[about["resource"]] = about["label"]
        if not kinds:
            raise TileError("no worker of the cluster owns a device"
                            + (f" matching {device!r}" if device else "")
                            + "".join(f"\n  {e}" for e in self.ledger.events))
        return kinds

    def _push(self, task: _Task) -> None:
        heapq.heappush(self.waiting[task.kind], (task.order, next(self.seq), task))

    def _workers(self) -> dict[str, list[str]]:
        """Device kind -> addresses of the workers that own one now."""
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        out: dict[str, list[str]] = {}
        for addr, w in info.items():
            self.names[addr] = str(w.get("name", addr))
            for r, amount in (w.get("resources") or {}).items():
                if r.startswith(RESOURCE) and amount > 0:
                    out.setdefault(r, []).append(addr)
        return out

    def _top_up(self) -> None:
        owners = self._workers()
        now = time.monotonic()
        for kind, heap in self.waiting.items():
            busy = sum(1 for t in self.running.values() if t.kind == kind)
            n = len(owners.get(kind, ()))
            if n == 0 and (heap or busy):
                since = self.starved.setdefault(kind, now)
                if now - since > NO_WORKER_S:
                    self._give_up(kind)
                continue
            self.starved.pop(kind, None)
            while heap and busy < n:
                self._submit(heapq.heappop(heap)[2])
                busy += 1

    def _submit(self, task: _Task) -> None:
        job = task.job
        key = f"tilec-{self.run_id}-{next(self.seq)}"
        opts = {"key": key, "resources": {task.kind: 1}, "pure": False}
        if task.workers:
            opts.update(workers=list(task.workers), allow_other_workers=False)
        if isinstance(job, KernelJob):
            fut = self.client.submit(_tune_task, job, task.tally_key, **opts)
        else:
            fut = self.client.submit(_plan_task, job, **opts)
        self.running[fut] = task
        fut.add_done_callback(lambda f: self.events.put(("done", f)))

    def _done(self, fut) -> None:
        task = self.running.pop(fut, None)
        if task is None:
            return
        job = task.job
        try:
            result = fut.result()
        except Exception as e:  # noqa: BLE001 - KilledWorker, cancelled: reported, not fatal
            note = (str(e).splitlines() or [type(e).__name__])[0]
            result = None
            if not isinstance(job, KernelJob):
                result = ProgramPlan(job.key, None, "", (), f"{type(e).__name__}: {note}")
            else:
                result = KernelResult(job.program.key, job.kernel, None, "", None,
                                      f"{type(e).__name__}: {note}")
        if isinstance(job, ProgramJob):
            for k in self.ledger.admit(result, job.name):
                kjob = KernelJob(job, k.name, self.settings)
                t = _Task(task.kind, kjob, (1, -k.work), planned=k)
                self.tally.expect(t.tally_key, k.candidates)
                self._push(t)
            return
        name = job.program.name
        if result.error and task.attempt == 0:
            others = [a for a in self._workers().get(task.kind, ())
                      if self.names.get(a) != result.worker]
            if others:
                self.ledger.events.append(f"{name} {job.kernel}: {result.error} (on "
                                          f"{result.worker or 'a worker'}); run again on "
                                          "another worker")
                self._push(replace(task, workers=tuple(others), attempt=1, order=(0,)))
                return
        if fut.key in self.lost and result.tuning is not None:
            lost = self.lost[fut.key]
            self.ledger.events.append(
                f"{name} {job.kernel}: re-run on {result.worker}"
                + (", restarted after it was lost" if lost == result.worker else
                   f" after {lost} was lost"))
        self.tally.finish(task.tally_key)
        self.ledger.record(result, name)
        if self.on_result is not None:
            self.on_result(result)

    def _lost(self, msg: dict) -> None:
        addr = msg.get("worker", "")
        who = self.names.get(addr, addr)
        ours = [(f, t) for f, t in self.running.items() if f.key in msg.get("processing-tasks",
                                                                             ())]
        for f, _ in ours:
            self.lost[f.key] = who
        what = ", ".join(f"{t.job.program.name} {t.job.kernel}" if isinstance(t.job, KernelJob)
                         else f"planning {t.job.name}" for _, t in ours)
        self.ledger.events.append(f"worker {who} ({addr}) was lost"
                                  + (f" while running {what}: re-queued on another worker of "
                                     "its device kind" if ours else ""))

    def _give_up(self, kind: str) -> None:
        label = self.labels.get(kind, kind)
        for f, t in list(self.running.items()):
            if t.kind == kind:
                f.cancel()
                self.running.pop(f)
                self._fail(t, f"no worker owns {label} any more")
        for _, _, t in self.waiting[kind]:
            self._fail(t, f"no worker owns {label} any more")
        self.waiting[kind] = []

    def _fail(self, task: _Task, why: str) -> None:
        job = task.job
        if isinstance(job, KernelJob):
            self.tally.finish(task.tally_key)
            self.ledger.record(KernelResult(job.program.key, job.kernel, None, "", None, why),
                               job.program.name)
        else:
            self.ledger.failed.append(f"{job.name}: {why}")


__all__ = ["PIN_VARIABLE", "DevicePlugin", "connect", "local_pins", "require", "resource_for",
           "tune_on"]
