"""Measuring candidates on the device: a program's buffers, random inputs and reference outputs
(`Bench`), each candidate built, checked against the launch limits and validated against the
numpy reference with its outputs poisoned, then the correct ones timed together in interleaved
rounds (`Runner`).  `measure` decides what the candidates are and grades the model on them."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..codegen.contraction import KernelSource
from ..config import Config
from ..errors import DeviceError
from ..plan.fuse import KernelPlan
from ..runtime.device import Runtime, event_seconds
from ..runtime.launch import NP, POISON, itemsize, poisoned_halo
from ..runtime.validate import compare
from .check import stepwise, tensor_values

Timer = Callable[["Candidate"], float]
Progress = Callable[[int, int, str], None]
# Candidates this many times slower than the fastest on a first run are timed once only ...
SCOUT_FACTOR = 4.0
# ... and at least this much slower: a kernel of a microsecond costs nothing to time in full,
# while its first launches, each awaited, can take several times as long (the device's
# threads waking: 7.8 us against 0.4 us for a 8x16 product on the Zen 4 with PoCL 3.1, a time
# that then stood as the candidate's, made its regret 20 and fitted a launch correction of
# 2.6 for the device).
SCOUT_FLOOR_S = 50e-6


@dataclass(frozen=True)
class Candidate:
    kernel: str
    kind: str  # "contraction" or "elementwise"
    phase: str  # "tile" (the model's top-k), "lws" (local work sizes) or "variant" (code)
    tile: tuple[tuple[str, int], ...]
    threads: int | None  # contraction: thread budget (= its work-group size)
    local_size: int | None  # the launch's local size; None: the driver's choice
    rank: int  # position in the model's top-k (0: its first choice); lws variants keep theirs
    score: float | None  # the model's predicted score
    source: KernelSource
    predicted: float | None = None  # the time model's seconds (`plan.predict`), where it has one
    bottleneck: str = ""  # the prediction's limiting resource
    variant: str = ""  # a code variant of the tile (`plan.schedule.VARIANTS`)

    def label(self) -> str:
        tile = " ".join(f"{n}={t}" for n, t in self.tile)
        extra = f" {self.variant}" if self.variant else ""
        return f"{tile} local={self.local_size or 'auto'}{extra}".strip()


@dataclass(frozen=True)
class Measurement:
    candidate: Candidate
    status: str  # "ok", "failed" (wrong results), "error" (no build/launch), "skipped"
    seconds: float | None = None
    note: str = ""
    spread: float = 0.0  # relative spread of the timed runs: (q75 - q25) / median

    @property
    def gflops(self) -> float | None:
        flops = self.candidate.source.flops
        return flops / self.seconds * 1e-9 if self.seconds and flops else None


class Runner:
    """Validates candidates one by one, then times the correct ones in interleaved rounds, so
    that drift (clock changes, the driver's thread pool waking up) hits every candidate alike
    rather than whichever happens to run first."""

    def __init__(self, bench: Bench, timer: Timer | None, progress: Progress | None,
                 deadline: float | None, warmup: int, repeat: int):
        self.bench, self.timer, self.progress = bench, timer, progress
        self.deadline, self.warmup, self.repeat = deadline, max(0, warmup), max(1, repeat)
        self.done = 0
        self.total = 0

    def measure(self, cands: Sequence[Candidate], first: bool = False,
                retime: Sequence[Measurement] = ()) -> list[Measurement]:
        """Validate and time `cands`; the results come back in order, followed by new timings
        of `retime` (candidates already found correct), taken in the same rounds so that every
        time in a report compares with every other.  `first`: the first candidate is measured
        even past the budget (each kernel gets at least its model's choice measured)."""
        out: list[Measurement] = []
        passed: list[tuple[int, Candidate, object]] = []
        for i, c in enumerate(cands):
            if (self.deadline is not None and time.monotonic() > self.deadline
                    and not (first and i == 0)):
                out.append(Measurement(c, "skipped", note="over the time budget"))
            else:
                m, kernel = self._check(c)
                out.append(m)
                if m.status == "ok":
                    passed.append((i, c, kernel))
            self.done += 1
            if self.progress is not None:
                self.progress(self.done, max(self.total, self.done), f"{c.kernel} {c.label()}")
        for m in retime:
            out.append(m)
            passed.append((len(out) - 1, m.candidate, self.bench.kernel_for(m.candidate.source)))
        if self.timer is not None:
            secs = [(float(self.timer(c)), 0.0) for _, c, _ in passed]
        else:
            try:
                secs = self.bench.time([(c.source, k) for _, c, k in passed], self.warmup,
                                       self.repeat)
            except (DeviceError, self.bench.runtime.cl.Error) as e:
                note = (str(e).splitlines() or [""])[0]
                for i, c, _ in passed:
                    out[i] = Measurement(c, "error", note=note)
                return out
        for (i, c, _), (t, spread) in zip(passed, secs, strict=True):
            out[i] = Measurement(c, "ok", t, spread=spread)
        return out

    def _check(self, c: Candidate) -> tuple[Measurement, object]:
        """Build, check the launch limits and validate one candidate (status "ok": correct,
        not yet timed)."""
        b = self.bench
        try:
            kernel = b.kernel_for(c.source)
            problem = b.launchable(c.source, kernel)
            if problem:
                return Measurement(c, "error", note=problem), None
            wrong = b.validate(c.source, kernel)
            if wrong:
                return Measurement(c, "failed", note=wrong), None
            return Measurement(c, "ok"), kernel
        except (DeviceError, b.runtime.cl.Error) as e:
            return Measurement(c, "error", note=(str(e).splitlines() or [""])[0]), None


class Bench:
    """The program's buffers on the device, its random inputs (in `copies` sets of buffers) and
    the reference outputs, against which every candidate is run."""

    def __init__(self, runtime: Runtime, plan: KernelPlan, sources: list[KernelSource],
                 config: Config, *, copies: int, seed: int):
        from ..lang.reference import evaluate_program, random_array

        self.runtime, self.plan, self.config = runtime, plan, config
        self.program = p = plan.program
        self.sources = sources
        built = runtime.build("\n".join(s.text for s in sources), config.build_options, config)
        self.kernels = {s.name: runtime.kernel(built, s.name) for s in sources}
        self.sizes = {n: p.tensors[n].size * itemsize(p.tensors[n].dtype)
                      for n in plan.buffers()}
        runtime.check_sizes(self.sizes)
        rng = np.random.default_rng(seed)
        self.inputs = {}
        for n in p.inputs:
            t = p.tensors[n]
            a = random_array(rng, t.shape, t.dtype)
            # astype copies in C order, and keeps a 0-d input 0-d (`ascontiguousarray`
            # made it 1-d, which the reference then refused: a model's scalar constants).
            self.inputs[n] = a.astype(np.uint8 if t.dtype == "bool" else NP[t.dtype],
                                      order="C")
        # More copies than memory allows would only measure the allocator.
        in_bytes = max(1, sum(self.sizes[n] for n in p.inputs))
        copies = max(1, min(copies, runtime.global_mem // (4 * in_bytes)))
        self.copies = [{n: runtime.buffer(self.sizes[n]) for n in p.inputs}
                       for _ in range(copies)]
        for bufs in self.copies:
            for n, buf in bufs.items():
                runtime.upload(buf, self.inputs[n])
        self.temps = {n: runtime.buffer(self.sizes[n]) for n in plan.buffers()
                      if n not in p.inputs}
        # Bordered buffers (`plan.halo`): the border holds its value before any kernel runs.
        self.halos = {h.root: h for h in plan.halos}
        for n in self.halos:
            self._poison(n)
        self.reference = evaluate_program(p, self.inputs)
        self.tolerance = {n: tolerance(self.reference[n], config) for n in p.outputs
                          if p.tensors[n].dtype == "float32" and n not in p.inputs}
        self._built: dict[str, object] = {}
        # Where the compile's own kernels fail the check of the whole program (a deep network
        # with random weights: `check`), each candidate's writes are checked on their own
        # against the reference of its statements on the device's values of their inputs.
        self.writes = {k.name: tuple(k.writes) for k in plan.kernels}
        self.step: dict[str, np.ndarray] | None = None
        self.whole = self._check_whole(None, None)
        if self.whole:
            roots = self._roots(n for ws in self.writes.values() for n in ws)
            device = {n: tensor_values(plan, n, roots) for ws in self.writes.values()
                      for n in ws}
            self.step = stepwise(p, self.inputs, device)

    def _poison(self, name: str) -> None:
        """Poison `name`'s buffer; a halo's border keeps its value."""
        t = self.program.tensors[name]
        halo = self.halos.get(name)
        if halo is None:
            self.runtime.fill(self.temps[name], POISON[t.dtype], self.sizes[name])
            return
        self.runtime.upload(self.temps[name], poisoned_halo(halo, t.shape, t.dtype))

    def source(self, name: str) -> KernelSource:
        return next(s for s in self.sources if s.name == name)

    def limits(self, name: str | None = None) -> tuple[int, list[int]]:
        """(kernel maximum work-group size, device work-item sizes)."""
        dev = self.runtime.device
        kwg = int(dev.max_work_group_size)
        if name is not None:
            cl = self.runtime.cl
            kwg = int(self.kernels[name].get_work_group_info(
                cl.kernel_work_group_info.WORK_GROUP_SIZE, dev))
        return kwg, [int(x) for x in dev.max_work_item_sizes]

    def kernel_for(self, src: KernelSource):
        base = self.source(src.name)
        if src.text == base.text:
            return self.kernels[src.name]
        if src.text not in self._built:
            prg = self.runtime.build(src.text, self.config.build_options, self.config)
            self._built[src.text] = self.runtime.kernel(prg, src.name)
        return self._built[src.text]

    def launchable(self, src: KernelSource, kernel) -> str:
        if src.local_size is None:
            return ""
        kwg, items = self.limits()
        cl = self.runtime.cl
        kwg = min(kwg, int(kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE,
                                                      self.runtime.device)))
        if src.local_size > min(kwg, items[0]):
            return (f"needs {src.local_size} work-items per group; the kernel allows "
                    f"{min(kwg, items[0])}")
        return ""

    def _args(self, src: KernelSource, copy: int = 0) -> list:
        return [self.copies[copy][a.tensor] if a.tensor in self.program.inputs
                else self.temps[a.tensor] for a in src.args]

    def validate(self, candidate: KernelSource, kernel) -> str:
        """Run the program with the candidate, its outputs poisoned first: "" when every
        output matches the reference (or, where the compile's own program does not, the
        tensors the candidate writes match their stepwise reference: `check`), else where
        the worst one does not."""
        if self.step is None:
            return self._check_whole(candidate, kernel)
        self._run(candidate, kernel)
        names = self.writes[candidate.name]
        roots = self._roots(names)
        got = {n: tensor_values(self.plan, n, roots) for n in names}
        v = compare({n: self.step[n] for n in names}, got, self.program, self.config)
        return "" if v.ok else f"{v.worst} (checked on its own: {self.whole})"

    def _run(self, candidate: KernelSource | None, kernel) -> None:
        """The program once, every buffer but the inputs poisoned first, with `candidate` in
        place of its kernel (None: the compile's own kernels)."""
        rt = self.runtime
        for n in self.temps:
            self._poison(n)
        for s in self.sources:
            chosen, kern = (candidate, kernel) if candidate is not None and \
                s.name == candidate.name else (s, self.kernels[s.name])
            rt.launch(kern, chosen.global_size, chosen.local_size, self._args(chosen))
        rt.finish()

    def _roots(self, names) -> dict[str, np.ndarray]:
        """The contents of the buffers that hold `names` (each once)."""
        out: dict[str, np.ndarray] = {}
        for n in names:
            root = self.plan.root(n)
            if root not in out:
                out[root] = self._download(root)
        return out

    def _download(self, name: str) -> np.ndarray:
        """Buffer `name`'s contents as its tensor's array (bool tensors live as bytes)."""
        t = self.program.tensors[name]
        raw = self.runtime.download(self.temps[name], t.shape,
                                    np.uint8 if t.dtype == "bool" else NP[t.dtype])
        return raw.astype(np.bool_) if t.dtype == "bool" else raw

    def _check_whole(self, candidate: KernelSource | None, kernel) -> str:
        """The program run with `candidate` (None: the compile's own kernels), its outputs
        compared with the reference from the inputs: "" or where the worst one differs."""
        p = self.program
        self._run(candidate, kernel)
        outs = {n: self.inputs[n] if n in p.inputs else self._download(n) for n in p.outputs}
        # compare() makes a dozen float64 passes (seconds a candidate for a conv's 100M
        # outputs); one float32 pass against the tolerance settles the outputs that pass it.
        rest = [n for n in p.outputs if n not in self.tolerance or not np.all(
            np.abs(outs[n] - self.reference[n]) <= self.tolerance[n])]
        if not rest:
            return ""
        v = compare({n: self.reference[n] for n in rest}, {n: outs[n] for n in rest}, p,
                    self.config)
        return "" if v.ok else v.worst

    def time(self, runs: Sequence[tuple[KernelSource, object]], warmup: int,
             repeat: int) -> list[tuple[float, float]]:
        """Median event time of each (source, kernel) and the runs' relative spread, timed in
        interleaved rounds.  Launch n reads input copy n mod copies, so consecutive launches
        never share a copy, and each round starts one candidate later, so that no candidate
        always runs in the same place (the first of a round once always found its inputs out
        of cache).  A round's launches are queued together and awaited once, as a model's
        call runs its kernels back to back.  (Launches awaited one by one measured the same
        on PoCL's CPU devices: mobilenet_v2's 1x1 and depthwise layers, 20-130 us, on the
        2-core Zen 4 and the 16-core Xeon.)"""
        rt = self.runtime
        times: list[list[float]] = [[] for _ in runs]
        n = 0

        def one_round(order: Sequence[int]) -> list[float]:
            nonlocal n
            events = []
            for j in order:
                src, kernel = runs[j]
                events.append(rt.launch(kernel, src.global_size, src.local_size,
                                        self._args(src, n % len(self.copies))))
                n += 1
            return [event_seconds(ev) for ev in events]

        # Scouting rounds: candidates far slower than the fastest (a work-group of one
        # thread, say) keep their scouting time rather than costing `repeat` slow runs each.
        # Two rounds, the faster launch counting: the first launches after validation can
        # be cold (a 16-core Xeon's PoCL 5.0 ran the first two candidates of a 1024 x 1024
        # panel copy at 0.74 and 0.48 ms, then 0.09 ms like the rest).
        # The second round starts one candidate later: the first launch of a round can find
        # the driver's threads asleep (mobilenet_v2 on the 16-core Xeon: a 0.05 ms layer's
        # first tile scouted at 0.23-0.24 ms twice, as the first launch of both rounds, and
        # stood at that time; launched alone it ran in 0.055-0.065 ms).
        live = list(range(len(runs)))
        if len(runs) > 1 and repeat > 1:
            first = one_round(live)
            again = dict(zip(live[1:] + live[:1], one_round(live[1:] + live[:1]), strict=True))
            scout = [min(a, again[j]) for j, a in zip(live, first, strict=True)]
            fastest = min(scout)
            slow = {j for j in live if scout[j] > SCOUT_FACTOR * fastest
                    and scout[j] - fastest > SCOUT_FLOOR_S}
            for j in slow:
                times[j].append(scout[j])
            live = [j for j in live if j not in slow]
        for i in range(warmup + repeat):
            order = [live[(i + step) % len(live)] for step in range(len(live))]
            for j, t in zip(order, one_round(order), strict=True):
                if i >= warmup:
                    times[j].append(t)
        out = []
        for t in times:
            q25, med, q75 = (float(q) for q in np.percentile(t, [25, 50, 75]))
            out.append((med, (q75 - q25) / med if med > 0 else 0.0))
        return out


def tolerance(ref: np.ndarray, config: Config) -> np.ndarray:
    """`compare`'s tolerance for each element of a float32 output, a millionth tighter, so
    that an output within it in float32 arithmetic is within `compare`'s in float64 (which
    then says where one is not).  NaN where the reference is NaN: those go to `compare`."""
    r64 = np.asarray(ref, np.float64)
    scale = float(np.max(np.abs(r64[np.isfinite(r64)]), initial=1.0))
    tol = config.atol * max(1.0, scale) + config.rtol * np.abs(r64)
    return (tol * (1.0 - 1e-6)).astype(np.float32)
