"""Tuning as jobs that can travel to another process: a program and one of its kernels,
described by picklable data alone (Tile text, shapes, element types, the `Config`), the
entry points that run them (`Workbench`), and the driver's bookkeeping of the results
(`Ledger`).  `tune.cluster` hands the jobs to Dask workers that each own one device;
`tilec tune` runs them in this process when no cluster is asked for.  Nothing here imports
Dask, so both ways share one description of the work and one record of what came of it.

The unit of work is one kernel of one program: all of that kernel's candidates are validated
and timed together on one device, in the interleaved rounds of `measure`, so that a kernel's
times compare with each other however the kernels are spread.  A program is planned first
(which kernels, their digests, how many candidates), so that the driver can skip kernels that
already have a record (an interrupted run resumes) and tune a kernel that several programs
share once."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from ..config import Config
from ..errors import Source, TileError
from .measure import KernelTuning, Prepared, TuneReport, tune_kernel
from .records import DeviceKey, RecordStore, Shapes, kernel_digest, kernel_shapes

Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class ProgramJob:
    """A program to tune, as the driver read it (a .tile file, or a model lowered to Tile)."""

    name: str  # where it came from, for the report
    source: str
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    dtypes: tuple[tuple[str, str], ...]
    config: Config
    top_k: int = 8
    copies: int = 3
    seed: int = 0
    # A graph's weights (bound once): `compile` packs them in panels where the product's
    # tile gains, which changes the kernels a record must name.
    constants: tuple[str, ...] = ()

    @classmethod
    def make(cls, name: str, source: str, shapes: Mapping[str, Iterable[int]],
             dtypes: Mapping[str, str], config: Config, **kw) -> ProgramJob:
        return cls(name, source, tuple((n, tuple(int(d) for d in s)) for n, s in shapes.items()),
                   tuple(dtypes.items()), config, **kw)

    @property
    def key(self) -> str:
        """Identifies the job (a worker's cache of prepared programs is keyed by it)."""
        return hashlib.sha256(repr(self).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PlannedKernel:
    program: str  # the ProgramJob's key
    name: str
    kind: str
    digest: str
    shapes: Shapes
    candidates: int  # the first round's; local sizes add more as they are found
    work: float  # a guess at the time it takes (`_work`): the longest are handed out first


@dataclass(frozen=True)
class ProgramPlan:
    program: str
    device: DeviceKey | None
    hw: str
    kernels: tuple[PlannedKernel, ...]
    error: str = ""


@dataclass(frozen=True)
class Settings:
    """How candidates are measured: the same for every kernel of a run."""

    lws: bool = False
    lws_tiles: int = 2
    repeat: int = 5
    warmup: int = 2
    deadline: float | None = None  # wall clock (time.time()): workers' monotonic clocks differ
    timer: Callable | None = None  # replaces the measurement (tests); must pickle for a cluster


@dataclass(frozen=True)
class KernelJob:
    program: ProgramJob
    kernel: str
    settings: Settings = field(default_factory=Settings)


@dataclass(frozen=True)
class KernelResult:
    program: str
    kernel: str
    device: DeviceKey | None
    hw: str
    tuning: KernelTuning | None
    error: str = ""  # the device failed or the program could not be prepared
    worker: str = ""
    seconds: float = 0.0


def _message(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    return first if isinstance(e, TileError) else f"{type(e).__name__}: {first}"


class Workbench:
    """Where jobs run: one device (a device spec; None: the config's) and the programs
    prepared on it.  Plans are kept (they are small, and a program's kernels may come one at
    a time between others'); benches, which hold device buffers, only for the few programs
    used most recently, so that a program's next kernel starts at once."""

    KEEP_PLANS = 64
    KEEP_BENCHES = 2

    def __init__(self, device: str | None = None):
        self.device = device
        self._prepared: OrderedDict[tuple[str, str | None], Prepared] = OrderedDict()

    def device_key(self) -> tuple[DeviceKey, str]:
        """The device this bench owns and its label (opening it: `DeviceError` if absent)."""
        from ..runtime.device import Runtime

        runtime = Runtime.get(self.device)
        return DeviceKey.from_info(runtime.info), runtime.info.label

    def prepared(self, job: ProgramJob) -> Prepared:
        config = job.config if self.device is None else replace(job.config, device=self.device)
        key = (job.key, config.device)
        if key in self._prepared:
            self._prepared.move_to_end(key)
            return self._prepared[key]
        prep = Prepared(Source(job.source, job.name), dict(job.shapes), dict(job.dtypes),
                        config, None, job.top_k, copies=job.copies, seed=job.seed,
                        constants=job.constants)
        self._prepared[key] = prep
        while len(self._prepared) > self.KEEP_PLANS:
            self._prepared.popitem(last=False)[1].release()
        return prep

    def _release_old(self) -> None:
        for prep in list(self._prepared.values())[:-self.KEEP_BENCHES]:
            prep.release()

    def plan(self, job: ProgramJob) -> ProgramPlan:
        try:
            prep = self.prepared(job)
        except TileError as e:
            return ProgramPlan(job.key, None, "", (), _message(e))
        elements = sum(t.size for t in prep.program.tensors.values())
        kernels = []
        for k in prep.plan.kernels:
            n = prep.candidates(k)
            src = next(s for s in prep.sources if s.name == k.name)
            kernels.append(PlannedKernel(
                job.key, k.name, type(k).__name__, kernel_digest(k, prep.plan, prep.model,
                                                                  prep.config),
                kernel_shapes(k, prep.plan), n, _work(elements, src.flops, n)))
        return ProgramPlan(job.key, prep.device, prep.model.name, tuple(kernels))

    def tune(self, job: KernelJob, progress: Progress | None = None,
             worker: str = "") -> KernelResult:
        start = time.monotonic()
        s = job.settings
        device, hw = None, ""
        try:
            prep = self.prepared(job.program)
            self._release_old()
            device, hw = prep.device, prep.model.name
            deadline = None if s.deadline is None else start + (s.deadline - time.time())
            tuning = tune_kernel(prep, job.kernel, lws=s.lws, lws_tiles=s.lws_tiles,
                                 deadline=deadline, repeat=s.repeat, warmup=s.warmup,
                                 timer=s.timer, progress=progress)
        except Exception as e:  # noqa: BLE001 - a device that fails is reported, not fatal
            # Drop the program: its buffers may be what the device could not hold.
            self._prepared.pop((job.program.key, self.device or job.program.config.device),
                               None)
            return KernelResult(job.program.key, job.kernel, device, hw, None, _message(e),
                                worker, time.monotonic() - start)
        return KernelResult(job.program.key, job.kernel, device, hw, tuning, "", worker,
                            time.monotonic() - start)


def _work(elements: int, flops: int, candidates: int) -> float:
    """A kernel's tuning time, in a unit of about 0.2 us: the worker makes its program's random
    inputs and reference outputs first (numpy, ~0.2 us an element on its generic paths, 1e4
    flops an element where a product goes to BLAS), then builds, validates and times each
    candidate (~0.2 s).  On the H200 the reference was most of the time of the GPU suite's
    biggest kernels (a 2x2 max pool over 100M elements: 27 of 31 s), so a kernel handed out
    last by flops alone kept one worker busy long after the other."""
    return float(elements) + flops / 1e4 + candidates * 1e6


class Ledger:
    """The driver's side of a run: which kernels to tune (each distinct kernel once, none
    that already has a record unless `retune`), their records appended to the store as each
    arrives (so that an interrupted run loses nothing and resumes from the records; none
    with `save` false), and what happened along the way, for the report."""

    def __init__(self, store: RecordStore | None, retune: bool = False, save: bool = True):
        self.store = store if save else None
        self.start = time.monotonic()
        self.known = store.load() if store is not None and not retune else {}
        self.seen: set[tuple[DeviceKey, str, Shapes]] = set()
        self.skipped = 0  # a record exists: tuned by an earlier (perhaps interrupted) run
        self.duplicates = 0  # the same kernel in another program (or twice in one)
        self.results: list[KernelResult] = []
        self.hw: dict[DeviceKey, str] = {}
        self.failed: list[str] = []
        self.events: list[str] = []  # workers lost, kernels run again
        self.appended = 0

    def admit(self, plan: ProgramPlan, name: str = "") -> list[PlannedKernel]:
        """The plan's kernels that are to be tuned."""
        if plan.error or plan.device is None:
            self.failed.append(f"{name or plan.program}: {plan.error}")
            return []
        self.hw[plan.device] = plan.hw
        out = []
        for k in plan.kernels:
            key = (plan.device, k.digest, k.shapes)
            if key in self.seen:
                self.duplicates += 1
            elif key in self.known:
                self.seen.add(key)
                self.skipped += 1
            else:
                self.seen.add(key)
                out.append(k)
        return out

    def record(self, result: KernelResult, name: str = "") -> None:
        self.results.append(result)
        if result.tuning is None:
            self.failed.append(f"{name or result.program} {result.kernel}: {result.error}"
                               + (f" (on {result.worker})" if result.worker else ""))
            return
        rec = result.tuning.record
        if rec is not None and self.store is not None:
            self.store.append([rec])
            self.appended += 1

    def reports(self) -> list[TuneReport]:
        """One report per device, as `measure.describe` prints them."""
        path = self.store.path if self.store is not None else None
        by_device: dict[DeviceKey, list[KernelTuning]] = {}
        for r in self.results:
            if r.tuning is not None and r.device is not None:
                by_device.setdefault(r.device, []).append(r.tuning)
        seconds = time.monotonic() - self.start
        return [TuneReport(d, self.hw.get(d, ""), tuple(ts),
                           path if any(t.record for t in ts) else None, seconds)
                for d, ts in by_device.items()]

    def complete(self) -> bool:
        """Every kernel asked for has a record (new or found)."""
        return not self.failed and all(r.tuning is not None and r.tuning.best is not None
                                       for r in self.results)

    def summary(self) -> list[str]:
        tuned = [r for r in self.results if r.tuning is not None]
        by_worker: dict[str, tuple[int, float]] = {}  # kernels, seconds busy
        for r in tuned:
            n, busy = by_worker.get(r.worker or "here", (0, 0.0))
            by_worker[r.worker or "here"] = (n + 1, busy + r.seconds)
        workers = ", ".join(f"{w}: {n} in {busy:.1f} s" for w, (n, busy) in
                            sorted(by_worker.items()))
        lines = [f"tuned {len(tuned)} kernels in {time.monotonic() - self.start:.1f} s"
                 + (f" ({workers})" if workers else "")
                 + f"; {self.skipped} already had records (skipped), {self.duplicates} "
                   "repeated kernels tuned once"]
        lines += self.events
        lines += [f"failed: {f}" for f in self.failed]
        return lines


class Tally:
    """Candidates done / total over a whole run, per task and per worker, drawn on one bar.
    A task run again elsewhere (its worker died) adds what it had done to the total: that
    work is done twice."""

    def __init__(self, bar=None):
        self.bar = bar
        self.tasks: dict[str, tuple[str, int, int]] = {}  # key -> (worker, done, total)
        self.by_worker: dict[str, int] = {}
        self.done = 0
        self.total = 0

    def expect(self, key: str, total: int) -> None:
        self.tasks[key] = ("", 0, total)
        self.total += total
        self._draw()

    def update(self, key: str, worker: str, done: int, total: int) -> None:
        was_worker, was_done, was_total = self.tasks.get(key, ("", 0, 0))
        if was_worker and worker != was_worker:  # started again from nothing elsewhere
            self.total += was_done
            was_done = 0
        self.total += total - was_total
        step = max(0, done - was_done)
        self.done += step
        self.by_worker[worker] = self.by_worker.get(worker, 0) + step
        self.tasks[key] = (worker, max(done, was_done), total)
        self._draw()

    def finish(self, key: str) -> None:
        """A task that ended (or failed) with fewer candidates than announced."""
        worker, done, total = self.tasks.get(key, ("", 0, 0))
        self.total -= total - done
        self.tasks[key] = (worker, done, done)
        self._draw()

    def _draw(self) -> None:
        if self.bar is not None:
            label = " ".join(f"{w}:{n}" for w, n in sorted(self.by_worker.items()))
            self.bar(self.done, max(self.total, self.done), label)


def run_here(jobs: list[ProgramJob], settings: Settings, ledger: Ledger,
             bench: Workbench | None = None, bar=None) -> None:
    """Plan and tune the jobs one after another in this process (no cluster)."""
    bench = bench or Workbench()
    names = {j.key: j.name for j in jobs}
    byk = {j.key: j for j in jobs}
    tally = Tally(bar)
    todo = [k for j in jobs for k in ledger.admit(bench.plan(j), j.name)]
    for k in todo:
        tally.expect(f"{k.program}/{k.name}", k.candidates)
    for k in todo:
        key = f"{k.program}/{k.name}"

        def progress(done: int, total: int, label: str, key: str = key) -> None:
            tally.update(key, "here", done, total)

        result = bench.tune(KernelJob(byk[k.program], k.name, settings), progress)
        tally.finish(key)
        ledger.record(result, names[k.program])


__all__ = ["KernelJob", "KernelResult", "Ledger", "PlannedKernel", "ProgramJob", "ProgramPlan",
           "Settings", "Tally", "Workbench", "run_here"]
