"""Cold builds spread over worker processes, where the driver keeps its own kernel cache.

PoCL turns a program into machine code in two steps, both on one core of the calling
process: the program build (front end and optimisation of the whole text), and at each
kernel's first launch, the work-group function for that launch's work-group size.  A model
of 30 distinct convolutions spends 10-20 s there.  PoCL keeps both results in its cache
directory, keyed by the program text, the build options, the device and the work-group size,
and a second process finds them there.  So, on PoCL's CPU devices, a large program is built
as a few parts (`split_parts`: the distinct kernels spread by text length over one part a
worker, the same parts for the same kernels and worker count), and `BuildWorkers` has one
process a core build those parts and launch each kernel once (one work-group over
zero-filled buffers); the compiling process then builds and launches from the cache.
Started before the panels are chosen, the workers first run tile searches ahead of the
compiling process (`search_ahead`).  Nothing a worker does is needed for correctness: what
fails or is not done there is done in process, as without workers."""

from __future__ import annotations

import hashlib
import json
import os
import selectors
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..codegen.kernel_text import KernelSource
from .share import SharedKernels

# A program is split (and built by workers) from this much text and this many distinct
# kernels on: below it a worker's start (0.2 s) and each part's own build cost (PoCL links
# its builtin library into every program: about 0.08 s) outweigh what is shared out.
SPLIT_MIN_CHARS = 256 * 1024
SPLIT_MIN_KERNELS = 4
# Each part costs a warm load its own read from the driver's cache (about 50 ms on PoCL):
# 8 parts made resnet50's warm load 1.15-1.55 s on 16 cores, 4 parts cost its cold build
# about 0.25 s more.  The workers past the parts take first launches only.
MAX_PARTS = 4
MAX_WORKERS = 8
JOB_TIMEOUT_S = 300.0  # a job that takes longer is the worker's fault: it is stopped
_GREETING = object()  # what a worker's answer to the texts message is for

_WORKER = Path(__file__).with_name("prebuild_worker.py")


@dataclass(frozen=True)
class Part:
    text: str  # a program: some distinct kernels, in launch order
    entries: tuple[str, ...]  # their entry points


def split_parts(shared: SharedKernels, sources: Sequence[KernelSource],
                count: int = MAX_PARTS) -> tuple[Part, ...]:
    """The program `shared` as `count` parts to build separately (`part_count`): one part
    below the thresholds or for a count under 2, else each distinct kernel to the part with
    the least text so far (longest first), which depends on the kernels and the count alone.
    Each part costs its own build and, warm, its own load from the driver's cache (40 ms a
    part on PoCL 3.0): resnet50 as 8 parts took 0.37 s to load warm, as 2 parts 0.14."""
    by_name = {s.name: s for s in sources}
    firsts = [by_name[e] for e in dict.fromkeys(shared.entries.values())]
    if count < 2 or len(firsts) < SPLIT_MIN_KERNELS or len(shared.text) < SPLIT_MIN_CHARS:
        return (Part(shared.text, tuple(s.name for s in firsts)),)
    count = min(count, MAX_PARTS, len(firsts))
    loads = [0] * count
    home: dict[str, int] = {}
    for s in sorted(firsts, key=lambda s: -len(s.text)):  # sorted() is stable: ties by order
        i = loads.index(min(loads))
        home[s.name] = i
        loads[i] += len(s.text)
    parts = []
    for i in range(count):
        members = [s for s in firsts if home[s.name] == i]
        parts.append(Part("\n".join(s.text for s in members), tuple(s.name for s in members)))
    return tuple(parts)


def part_count(runtime, requested: int | None) -> int:
    """How many parts a large program is built as: one a build worker (`worker_count`), so
    that each worker builds one part; 1 (the whole program) where no workers would build.
    The same device and `Config.build_workers` give the same parts, so that a later compile
    finds them in the driver's cache."""
    if not driver_caches_kernels(runtime):
        return 1
    return max(1, min(MAX_PARTS, worker_count(runtime, requested, MAX_WORKERS)))


def driver_caches_kernels(runtime) -> bool:
    """Whether workers can build for this device: PoCL's CPU devices, with PoCL's kernel
    cache on (POCL_KERNEL_CACHE=0 turns it off, and a worker's builds would be lost)."""
    info = runtime.info
    return ("Portable Computing Language" in info.platform and info.kind == "cpu"
            and os.environ.get("POCL_KERNEL_CACHE", "1") != "0")


def worker_count(runtime, requested: int | None, jobs: int) -> int:
    """How many workers: `requested` (Config.build_workers), else one a compute unit of the
    device, at most MAX_WORKERS and never more than the jobs; under 2 none is worth it."""
    n = requested if requested is not None else min(MAX_WORKERS, runtime.compute_units)
    n = min(n, jobs)
    return n if n >= 2 else 0


def _device_indices(runtime) -> tuple[int, int] | None:
    cl = runtime.cl
    for p, platform in enumerate(cl.get_platforms()):
        try:
            devices = platform.get_devices()
        except cl.Error:
            continue
        for d, device in enumerate(devices):
            if device == runtime.device:
                return p, d
    return None


def marker_path(root: Path, runtime, part: Part, options: Sequence[str]) -> Path:
    """Where a part the workers built is noted: a later compile of the same part skips the
    workers (the driver's cache holds it)."""
    key = json.dumps([list(runtime.info.key), list(options), part.text])
    return root / "prebuilt" / hashlib.sha256(key.encode()).hexdigest()[:32]


class BuildWorkers:
    """Worker processes over one device, each answering one request at a time; a request
    goes to whichever is free.  `close` (or the end of this process) stops them."""

    def __init__(self, runtime, count: int):
        """Start `count` workers on the device of `runtime`; each opens the device while this
        process goes on, and waits for `give_texts`."""
        where = _device_indices(runtime)
        if where is None:
            raise OSError("the device is not among pyopencl's devices")
        self._procs: list[subprocess.Popen] = []
        self._texts: Path | None = None
        # This tilec, for the search requests (`search_ahead`), wherever it was imported from.
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(_WORKER.parents[2])] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        # Where the device has a core beyond the workers and this process, each worker
        # loads the driver's compiler on it before the first build asks for it.
        warm = ["warm"] if runtime.compute_units > count + 1 else []
        for _ in range(count):
            self._procs.append(subprocess.Popen(
                [sys.executable, str(_WORKER), str(where[0]), str(where[1]), *warm],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True, bufsize=1, env=env))
        self._alive = list(self._procs)
        # Workers owing the answer to a message sent outside `serve` (the texts message).
        self._owed: set[subprocess.Popen] = set()
        self._next_id = 0

    def give_texts(self, parts: Sequence[Part], options: Sequence[str]) -> None:
        """The programs the workers' requests name by index.  Through a file: a megabyte
        written into each worker's pipe would wait for that worker to start reading, and the
        workers' starts would follow one another."""
        fd, name = tempfile.mkstemp(prefix="tilec-parts-", suffix=".json")
        self._texts = Path(name)
        with os.fdopen(fd, "w") as f:
            json.dump({"texts": [p.text for p in parts], "options": list(options)}, f)
        hello = json.dumps({"op": "texts", "file": name}) + "\n"
        for proc in self._alive:
            if self._send(proc, hello):
                self._owed.add(proc)

    def _send(self, proc: subprocess.Popen, line: str) -> bool:
        try:
            proc.stdin.write(line)
            proc.stdin.flush()
            return True
        except (OSError, ValueError):
            return False

    def run(self, jobs: Sequence[dict], on_done=None) -> list[bool]:
        """Run `jobs` (requests without ids), each on the first free worker; whether each
        succeeded.  A worker that dies or overruns JOB_TIMEOUT_S is stopped, its job failed;
        the others go on."""
        ok = [False] * len(jobs)
        queue = list(range(len(jobs)))

        def take() -> tuple[int, dict] | None:
            return (queue[0], jobs[queue.pop(0)]) if queue else None

        def done(j: int, good: bool) -> None:
            ok[j] = good
            if on_done is not None:
                on_done(j, good)

        self.serve(take, done)
        return ok

    def serve(self, take, on_done) -> None:
        """Run the jobs `take()` hands out, (tag, request without id), or None once there
        are none left, each on the first free worker, until none is left or in flight;
        `on_done(tag, succeeded)` after each, a failed or lost one too.  A worker that dies
        or overruns JOB_TIMEOUT_S is stopped; the others go on."""
        # A worker sent the texts message answers it first.
        live = [p for p in self._alive if p.poll() is None]
        pending: dict[subprocess.Popen, tuple[object, float]] = {
            p: (_GREETING, time.monotonic()) for p in live if p in self._owed}
        idle = [p for p in live if p not in self._owed]
        self._owed.clear()
        sel = selectors.DefaultSelector()
        for p in pending:
            sel.register(p.stdout, selectors.EVENT_READ, p)

        def finish(tag: object, good: bool) -> None:
            if tag is not _GREETING:
                on_done(tag, good)

        try:
            more = True
            while True:
                while more and idle:
                    got = take()
                    if got is None:
                        more = False
                        break
                    tag, job = got
                    p = idle.pop()
                    self._next_id += 1
                    if self._send(p, json.dumps({**job, "id": self._next_id}) + "\n"):
                        pending[p] = (tag, time.monotonic())
                        sel.register(p.stdout, selectors.EVENT_READ, p)
                    else:
                        self._drop(p)
                        finish(tag, False)
                if not pending:
                    if more and not idle:  # every worker gone: the rest fail here
                        while (got := take()) is not None:
                            finish(got[0], False)
                    break
                for key, _ in sel.select(timeout=1.0):
                    p = key.data
                    line = p.stdout.readline()
                    tag, _ = pending.pop(p)
                    sel.unregister(p.stdout)
                    if not line:
                        self._drop(p)
                        finish(tag, False)
                        continue
                    try:
                        answer = json.loads(line)
                    except ValueError:
                        answer = {}
                    finish(tag, bool(answer.get("ok")))
                    idle.append(p)
                now = time.monotonic()
                for p, (tag, since) in list(pending.items()):
                    if now - since > JOB_TIMEOUT_S:
                        pending.pop(p)
                        sel.unregister(p.stdout)
                        self._drop(p)
                        finish(tag, False)
        finally:
            sel.close()

    def _drop(self, proc: subprocess.Popen) -> None:
        if proc in self._alive:
            self._alive.remove(proc)
        proc.kill()
        proc.wait()

    def close(self, wait: bool = False) -> None:
        """Stop the workers: each exits at the end of its input.  Their exits (PoCL's own
        teardown: 0.17 s for two on the Zen 4, after the first launches the compile waits for)
        are awaited in a thread unless `wait`, or where no thread can start: while the
        interpreter exits, a thread's start waits forever (Python 3.11), and a process whose
        executable still held workers never ended."""
        procs, self._procs, self._alive = list(self._procs), [], []
        for p in procs:
            try:
                p.stdin.close()
            except OSError:
                pass

        def reap() -> None:
            for p in procs:
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

        if procs and (wait or sys.is_finalizing()):
            reap()
        elif procs:
            try:
                threading.Thread(target=reap, name="tilec-workers-exit", daemon=True).start()
            except RuntimeError:  # interpreter shutdown (Python 3.12 and later say so)
                reap()
        if self._texts is not None:
            self._texts.unlink(missing_ok=True)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def early_workers(runtime, requested: int | None, kernels: int) -> BuildWorkers | None:
    """Workers started before code generation, for a program of about `kernels` kernels
    (its contractions) that will likely be built in parts (one in SPLIT_MIN_KERNELS of a
    plan's kernels is distinct and long enough, as in the models measured): they open the
    device and search tiles ahead (`search_ahead`) while this process packs panels and
    generates code.  None where none would be used."""
    if kernels < 4 * SPLIT_MIN_KERNELS or not driver_caches_kernels(runtime):
        return None
    count = worker_count(runtime, requested, MAX_WORKERS)
    if count == 0:
        return None
    try:
        return BuildWorkers(runtime, count)
    except OSError:
        return None


class Prebuild:
    """The workers of one executable's cold build: `start` builds the parts there, `launch`
    has them generate the code of kernels about to run for the first time; `close` when done.
    Parts whose kernels all came through are noted (`marker_path`) for later compiles."""

    def __init__(self, workers: BuildWorkers, parts: Sequence[Part], runtime,
                 options: Sequence[str], root: Path | None, built: set[int]):
        self.workers, self.parts, self.runtime = workers, tuple(parts), runtime
        self.options, self.root, self.built = tuple(options), root, built
        self.failed: set[int] = set(range(len(parts))) - built  # parts not to note
        self.done: set[str] = set()  # entries whose first launch the workers made
        self.asked: set[str] = set()  # entries whose first launch they were given
        self.answered = 0  # first launches answered so far (a progress bar's count)
        self.launched = False
        self._thread: threading.Thread | None = None

    @classmethod
    def start(cls, runtime, parts: Sequence[Part], options: Sequence[str],
              requested: int | None, root: Path | None,
              started: BuildWorkers | None = None) -> Prebuild | None:
        """Workers that have built `parts`, or None where they would not help: one part, a
        driver without its own cache, one core, or every part noted built before.  `started`:
        workers the compile started early (`early_workers`), used or stopped here."""
        todo = [i for i, p in enumerate(parts)
                if root is None or not marker_path(root, runtime, p, options).exists()]
        count = worker_count(runtime, requested, MAX_WORKERS)  # the first launches' too
        if len(parts) < 2 or not driver_caches_kernels(runtime) or not todo or count == 0:
            if started is not None:
                started.close()
            return None
        try:
            workers = started if started is not None else BuildWorkers(runtime, count)
        except OSError:
            return None
        workers.give_texts(parts, options)
        ok = workers.run([{"op": "build", "part": i} for i in todo])
        built = {i for i, good in zip(todo, ok, strict=True) if good}
        if not built:  # nothing for them to launch from
            workers.close()
            return None
        return cls(workers, parts, runtime, options, root, built)

    def launch(self, kernels: Sequence[tuple[str, int | None, int, Sequence[int], int]],
               background: bool = False, tick=None) -> None:
        """First launches of (entry, local size, global size, argument bytes, text length) in
        the workers, each entry once, the longest texts first (the last to finish is then a
        short one); `tick()` after each answer.  `background`: return at once, the workers'
        answers read by a thread (`wait` joins it)."""
        self.wait()
        home = {e: i for i, p in enumerate(self.parts) for e in p.entries}
        jobs, entries = [], []
        for entry, local, glob, args, _ in sorted(kernels, key=lambda k: -k[4]):
            if entry in self.done or entry in entries or home[entry] not in self.built:
                continue
            entries.append(entry)
            # One work-group where its size is fixed (the cache is keyed by that size);
            # else the whole launch, whose size the driver picks as the real launch will.
            jobs.append({"op": "launch", "part": home[entry], "entry": entry,
                         "global": [glob if local is None else local],
                         "local": None if local is None else [local],
                         "args": [int(n) for n in args]})
        if len(jobs) < 2:  # one kernel builds as fast here as there
            return
        self.launched = True
        self.asked.update(entries)

        def answered(*_) -> None:
            self.answered += 1
            if tick is not None:
                tick()

        def run() -> None:
            for entry, good in zip(entries, self.workers.run(jobs, answered), strict=True):
                if good:
                    self.done.add(entry)
                else:
                    self.failed.add(home[entry])

        if background:
            self._thread = threading.Thread(target=run, name="tilec-prebuild", daemon=True)
            self._thread.start()
        else:
            run()

    def wait(self, tick=None) -> None:
        """Until the background launches are answered; `tick()` every quarter second."""
        while self._thread is not None:
            self._thread.join(timeout=0.25)
            if not self._thread.is_alive():
                self._thread = None
            if tick is not None:
                tick()

    def close(self) -> None:
        self.wait()
        self.workers.close()
        if self.root is None or not self.launched:
            return
        for i in sorted(self.built - self.failed):
            path = marker_path(self.root, self.runtime, self.parts[i], self.options)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            except OSError:
                pass


__all__ = ["BuildWorkers", "Part", "Prebuild", "driver_caches_kernels", "early_workers",
           "marker_path", "part_count", "split_parts", "worker_count"]
