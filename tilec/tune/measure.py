"""Measured tuning: time the cost model's top-k tiles (and, with `lws`, local work sizes) on the
device, keep the fastest correct choice as a tuning record, and grade the model.

Per contraction kernel the candidates are the search's top-k tiles at the usual thread count; with
`lws`, the best few of those are tried again with every power-of-two thread count the kernel and
the device allow (a contraction's work-group size is its schedule's thread count, fixed in the
kernel by reqd_work_group_size, so each one is a regenerated kernel).  Elementwise kernels keep
their source and are launched with the local sizes of `worksize.elementwise_local_sizes`.

Every candidate first runs the whole program with the outputs poisoned and is compared with the
numpy reference; only a correct one is timed (OpenCL profiling events: warm-up launches, then the
median of `repeat`, rotating among copies of the input buffers so that the caches hold no more
than a real run would find).  Candidates are timed together in interleaved rounds, and the
local-size phase times the tiles again with its own candidates, so that load on the machine
shifts every time in a report alike.  A `timer` callable may replace the measurement (tests).

The report card per contraction: Spearman's rho between the model's rank and the measured rank of
the top-k tiles, and regret = time of the model's first choice / the best tile's time.

Long (over 500 lines) because candidates, the interleaved timing rounds and the report card
share the measurement state of one tuning session."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..codegen.contraction import KernelSource, contraction_source, plain_vector_access
from ..codegen.generate import generate, with_local_size
from ..config import Config
from ..errors import DeviceError, Source, TileError
from ..plan.fuse import ContractionKernel, KernelPlan, fuse_attention, plan_kernels
from ..plan.hw import HwModel
from ..plan.predict import bottleneck_of
from ..plan.rows import RowKernel
from ..plan.schedule import make_schedule
from ..plan.worksize import elementwise_local_sizes, thread_budgets
from ..runtime.device import Runtime, event_seconds, hw_model_for
from ..runtime.launch import NP, POISON, compare, itemsize
from .records import (
    DeviceKey,
    RecordStore,
    TuneRecord,
    default_path,
    kernel_digest,
    make_record,
)

Timer = Callable[["Candidate"], float]
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Candidate:
    kernel: str
    kind: str  # "contraction" or "elementwise"
    phase: str  # "tile" (the model's top-k) or "lws" (local work sizes)
    tile: tuple[tuple[str, int], ...]
    threads: int | None  # contraction: thread budget (= its work-group size)
    local_size: int | None  # the launch's local size; None: the driver's choice
    rank: int  # position in the model's top-k (0: its first choice); lws variants keep theirs
    score: float | None  # the model's predicted score
    source: KernelSource
    predicted: float | None = None  # the time model's seconds (`plan.predict`), where it has one
    bottleneck: str = ""  # the prediction's limiting resource

    def label(self) -> str:
        tile = " ".join(f"{n}={t}" for n, t in self.tile)
        return f"{tile} local={self.local_size or 'auto'}".strip()


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


@dataclass(frozen=True)
class KernelTuning:
    kernel: str
    kind: str
    digest: str
    results: tuple[Measurement, ...]
    best: Measurement | None
    first: Measurement | None  # the model's first choice as compile() would build it
    rho: float | None
    regret: float | None
    record: TuneRecord | None

    @property
    def gain(self) -> float | None:
        """What tuning bought over the model's first choice (tiles and local sizes)."""
        if self.best is None or self.first is None or self.first.status != "ok":
            return None
        return self.first.seconds / self.best.seconds  # type: ignore[operator]


@dataclass(frozen=True)
class TuneReport:
    device: DeviceKey
    hw: str
    kernels: tuple[KernelTuning, ...]
    records_path: Path | None  # where the records were appended (None: not saved)
    seconds: float


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None when undefined."""
    if len(x) != len(y) or len(x) < 2:
        return None
    rx, ry = _ranks(x), _ranks(y)
    if np.std(rx) == 0 or np.std(ry) == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def _ranks(v: Sequence[float]) -> np.ndarray:
    a = np.asarray(v, np.float64)
    order = np.argsort(a, kind="stable")
    ranks = np.empty(len(a))
    ranks[order] = np.arange(len(a), dtype=np.float64)
    for val in np.unique(a):
        tied = a == val
        ranks[tied] = ranks[tied].mean()
    return ranks


def tune(source: str | Source, shapes: Mapping[str, Sequence[int]] | None = None, *,
         dtype: str | Mapping[str, str] = "float32", config: Config | None = None,
         hw: HwModel | str | None = None, top_k: int | None = None, lws: bool = False,
         lws_tiles: int = 2, budget: float | None = None, repeat: int = 5, warmup: int = 2,
         copies: int = 3, timer: Timer | None = None, progress: Progress | None = None,
         save: bool = True, seed: int = 0, quiet: bool = False) -> TuneReport:
    """Tune every kernel of a program on the config's device; append the records (unless
    `save` is false) to `records.default_path(config)`.  `budget` (seconds) stops measuring new
    candidates once spent; each kernel's first candidate is measured regardless.  `progress`
    is called with (done, total, label) per candidate; without one, a bar shows on a terminal
    once tuning has taken a couple of seconds, unless `quiet`."""
    if progress is None:
        from ..runtime.progress import Progress as Bar

        with Bar(0, "tuning", quiet=quiet) as bar:
            return tune(source, shapes, dtype=dtype, config=config, hw=hw, top_k=top_k,
                        lws=lws, lws_tiles=lws_tiles, budget=budget, repeat=repeat,
                        warmup=warmup, copies=copies, timer=timer, progress=bar, save=save,
                        seed=seed)
    start = time.monotonic()
    prep = Prepared(source, shapes, dtype, config, hw, top_k, copies=copies, seed=seed)
    deadline = None if budget is None else start + budget
    run = _Runner(prep.bench, timer, progress, deadline, warmup, repeat)
    run.total = sum(prep.candidates(k) for k in prep.plan.kernels)
    tunings = [_tune_one(run, prep, k, lws, lws_tiles) for k in prep.plan.kernels]
    path = None
    records = [t.record for t in tunings if t.record is not None]
    if save and records:
        path = default_path(prep.config)
        RecordStore(path).append(records)
    return TuneReport(prep.device, prep.model.name, tuple(tunings), path,
                      time.monotonic() - start)


class Prepared:
    """One program checked, planned and searched for the config's device: what each of its
    kernels' tuning starts from.  The bench (the program's buffers, inputs and reference
    outputs) is made on first use, so that planning alone, which a cluster asks a worker for
    before it hands out the kernels, costs no device memory and no reference run."""

    def __init__(self, source: str | Source, shapes: Mapping[str, Sequence[int]] | None,
                 dtype: str | Mapping[str, str] = "float32", config: Config | None = None,
                 hw: HwModel | str | None = None, top_k: int | None = None, *,
                 copies: int = 3, seed: int = 0):
        from ..lang.api import check_program

        config = config or Config()
        if top_k is not None:
            config = replace(config, top_k=top_k)
        self.config = config
        self.program = check_program(source, shapes, dtype)
        self.runtime = Runtime.get(config.device)
        self.model = hw_model_for(hw, config, self.runtime)
        self.plan = plan_kernels(self.program, rows=config.row_fusion,
                                 attention=fuse_attention(config, self.model))
        self.sources, self.searches = generate(self.plan, self.model, config)
        self.device = DeviceKey.from_info(self.runtime.info)
        self.copies, self.seed = copies, seed
        self._bench: _Bench | None = None

    @property
    def bench(self) -> _Bench:
        if self._bench is None:
            self._bench = _Bench(self.runtime, self.plan, self.sources, self.config,
                                 copies=self.copies, seed=self.seed)
        return self._bench

    def release(self) -> None:
        """Free the bench's device buffers (it is made again if needed)."""
        self._bench = None

    def kernel(self, name: str):
        found = [k for k in self.plan.kernels if k.name == name]
        if not found:
            raise TileError(f"the program has no kernel {name!r} (kernels: "
                            f"{', '.join(k.name for k in self.plan.kernels)})")
        return found[0]

    def candidates(self, kernel) -> int:
        """The kernel's first round of candidates (local sizes add more as they are found)."""
        search = self.searches.get(kernel.name)
        return len(search.top) if search else 1


def tune_kernel(prep: Prepared, name: str, *, lws: bool = False, lws_tiles: int = 2,
                deadline: float | None = None, repeat: int = 5, warmup: int = 2,
                timer: Timer | None = None, progress: Progress | None = None) -> KernelTuning:
    """Tune one kernel of a prepared program alone (its candidates timed together, as `tune`
    times them); `deadline` is a `time.monotonic()` past which only the first candidate is
    measured.  Nothing is saved: the caller keeps the record."""
    k = prep.kernel(name)
    run = _Runner(prep.bench, timer, progress, deadline, warmup, repeat)
    run.total = prep.candidates(k)
    return _tune_one(run, prep, k, lws, lws_tiles)


def _tune_one(run: _Runner, prep: Prepared, k, lws: bool, lws_tiles: int) -> KernelTuning:
    if isinstance(k, ContractionKernel):
        return _tune_contraction(run, k, prep.plan, prep.model, prep.config,
                                 prep.searches.get(k.name), lws, lws_tiles, prep.device)
    return _tune_elementwise(run, k, prep.plan, prep.model, prep.config, lws, prep.device)


# -- per kernel ----------------------------------------------------------------------------------

def variant(kernel: ContractionKernel, plan: KernelPlan, hw: HwModel, config: Config,
            tile: tuple[int, ...], threads: int | None) -> KernelSource:
    """The contraction's kernel for one tile and thread budget."""
    sched = make_schedule(kernel.flat, tile, hw, vec=config.vector_width,
                          staging=config.staging, threads=threads,
                          split_reduction=config.split_reduction,
                          gpu_forms=config.gpu_forms)
    names = ", ".join(f"{n}={t}" for n, t in zip(kernel.flat.names, tile, strict=True))
    # As compile renders it (`codegen.generate`): the model's mul-add form and vector access.
    return contraction_source(kernel, sched, plan.program, [f"tuning candidate: {names}"],
                              hw.muladd, plain_vector_access(hw))


def _tune_contraction(run: _Runner, k: ContractionKernel, plan: KernelPlan, hw: HwModel,
                      config: Config, search, lws: bool, lws_tiles: int,
                      device: DeviceKey) -> KernelTuning:
    names = k.flat.names
    predicted = {}
    if search is not None:
        top = [(tile, cost.score) for tile, cost in search.top]
        predicted = {tile: (secs, bottleneck_of(line))
                     for (tile, _), (secs, line) in zip(search.top, search.predicted,
                                                        strict=False)}
    else:  # a tile forced by the config: only its local sizes are left to tune
        current = run.bench.source(k.name)
        top = [(tuple(current.tile[n] for n in names), None)]
    default_threads = config.threads if config.threads is not None else hw.threads

    def cand(rank: int, tile: tuple[int, ...], score, threads: int, phase: str) -> Candidate:
        src = variant(k, plan, hw, config, tile, threads)
        # The prediction is for the model's thread count; other budgets have none.
        pred = predicted.get(tuple(tile)) if threads == default_threads else None
        return Candidate(k.name, "contraction", phase, tuple(zip(names, tile, strict=True)),
                         src.local_size, src.local_size, rank, score, src,
                         pred[0] if pred else None, pred[1] if pred else "")

    results = run.measure([cand(r, t, s, default_threads, "tile") for r, (t, s) in
                           enumerate(top)], first=True)
    tile_ok = [m for m in results if m.status == "ok"]
    if lws and tile_ok:
        kwg, items = run.bench.limits()
        seen = {(m.candidate.tile, m.candidate.local_size) for m in results}
        extra = []
        for m in sorted(tile_ok, key=lambda m: m.seconds)[:lws_tiles]:
            tile = tuple(t for _, t in m.candidate.tile)
            widest = make_schedule(k.flat, tile, hw, vec=config.vector_width,
                                   staging=config.staging, threads=1 << 30,
                                   split_reduction=config.split_reduction,
                          gpu_forms=config.gpu_forms).wg_threads
            # Nearest the model's thread count first: a budget runs out on the far ones.
            here = m.candidate.threads or default_threads
            for t in sorted(thread_budgets(widest, kwg, items),
                            key=lambda t: (abs(t.bit_length() - here.bit_length()), -t)):
                c = cand(m.candidate.rank, tile, m.candidate.score, t, "lws")
                if (c.tile, c.local_size) not in seen:
                    seen.add((c.tile, c.local_size))
                    extra.append(c)
        run.total += len(extra)
        # The tiles are timed again with the local sizes: one set of rounds, one clock.
        timed = run.measure(extra, retime=tile_ok)
        again = {id(m.candidate): t for m, t in zip(tile_ok, timed[len(extra):], strict=True)}
        results = [again.get(id(m.candidate), m) for m in results] + timed[:len(extra)]
    ok = [m for m in results if m.status == "ok"]
    tile_ok = [m for m in ok if m.candidate.phase == "tile"]
    rho = spearman([m.candidate.rank for m in tile_ok], [m.seconds for m in tile_ok])
    first = results[0]
    regret = (first.seconds / min(m.seconds for m in tile_ok)  # type: ignore[operator]
              if first.status == "ok" and tile_ok else None)
    return _finish(k, plan, hw, config, device, results, first, rho, regret)


def _tune_elementwise(run: _Runner, k, plan: KernelPlan, hw: HwModel, config: Config,
                      lws: bool, device: DeviceKey) -> KernelTuning:
    base = run.bench.source(k.name)
    sizes: list[int | None] = [None]
    if lws:
        kwg, items = run.bench.limits(k.name)
        sizes = elementwise_local_sizes(base.global_size, kwg, items,
                                        run.bench.runtime.device.max_compute_units)
        run.total += len(sizes) - 1
    if base.kind == "attention":
        return _tune_attention(run, k, plan, hw, config, device, base)
    if base.kind == "row":
        return _tune_rows(run, k, plan, hw, config, device)
    results = run.measure([Candidate(k.name, "elementwise", "lws", (), None, s, 0, None,
                                     with_local_size(base, s)) for s in sizes], first=True)
    return _finish(k, plan, hw, config, device, results, results[0], None, None)


def _tune_rows(run: _Runner, k: RowKernel, plan: KernelPlan, hw: HwModel, config: Config,
               device: DeviceKey) -> KernelTuning:
    """The time model's top-k shapes of a row kernel (threads a row, rows a work-group, vector
    width), its first choice first; graded like a contraction's tiles.  Without a prediction
    (no peak or bandwidth known) the planned shape alone."""
    from ..codegen.rows import row_source
    from ..plan.row_shape import choose

    first, ranked = choose(k, plan.program, hw, config.threads)
    shapes = ranked[:config.top_k] if ranked else [first]
    cands = []
    for rank, s in enumerate(shapes):
        src = row_source(k, plan.program, hw, shape=s)
        pred = None if s.predicted_s != s.predicted_s else s.predicted_s  # NaN: none
        cands.append(Candidate(k.name, "row", "shape", row_tile(s), s.threads, src.local_size,
                               rank, None, src, pred, s.bottleneck))
    return _graded(run, k, plan, hw, config, device, cands)


def _graded(run: _Runner, k, plan: KernelPlan, hw: HwModel, config: Config,
            device: DeviceKey, cands: list[Candidate]) -> KernelTuning:
    """Measure candidates given in the model's order (its first choice first) and grade the
    model on them as on a contraction's tiles: rho over the correct ones, regret of the first."""
    run.total += len(cands) - 1
    results = run.measure(cands, first=True)
    ok = [m for m in results if m.status == "ok"]
    rho = spearman([m.candidate.rank for m in ok], [m.seconds for m in ok]) \
        if len(ok) > 1 else None
    regret = (results[0].seconds / min(m.seconds for m in ok)  # type: ignore[operator]
              if results[0].status == "ok" and ok else None)
    return _finish(k, plan, hw, config, device, results, results[0], rho, regret)


def row_tile(shape) -> tuple[tuple[str, int], ...]:
    """A row shape as a record's tile (`codegen.generate` builds that shape again)."""
    return (("threads", shape.threads), ("rows", shape.rows), ("vec", shape.vec))


def _tune_attention(run: _Runner, k, plan: KernelPlan, hw: HwModel, config: Config,
                    device: DeviceKey, base: KernelSource) -> KernelTuning:
    """Every form the kernel can take (tiled; one work-item a query row at 16 to 128 rows a
    work-group), the time model's first choice first where it predicts, graded like tiles.  A
    record keeps the form and rows as its tile; `codegen.generate` builds that form again."""
    from ..codegen.attention_tiled import attention_forms, attention_kernel
    from ..plan.attention_time import choose

    forms = attention_forms(k, hw)
    first, ranked = choose(k, hw, forms)
    ranked = ranked or [first] + [f for f in forms if f != first]
    limit = run.bench.runtime.max_wg
    cands = []
    for f in ranked:
        if f.threads > limit:
            continue
        src = attention_kernel(k, plan.program, hw, form=f)
        pred = None if f.predicted_s != f.predicted_s else f.predicted_s  # NaN: none
        cands.append(Candidate(k.name, "attention", "form", attention_tile(f), f.rows,
                               src.local_size, len(cands), None, src, pred, f.bottleneck))
    return _graded(run, k, plan, hw, config, device, cands)


def attention_tile(form) -> tuple[tuple[str, int], ...]:
    """An attention form as a record's tile (`codegen.generate` builds that form again)."""
    return (("tiled", int(form.form == "tiled")), ("rows", form.rows))


def _finish(k, plan: KernelPlan, hw: HwModel, config: Config, device: DeviceKey,
            results: list[Measurement], first: Measurement, rho: float | None,
            regret: float | None) -> KernelTuning:
    ok = [m for m in results if m.status == "ok"]
    # Ties go to the earlier candidate: the model's order, then fewer threads.
    best = min(ok, key=lambda m: m.seconds) if ok else None  # type: ignore[arg-type,return-value]
    if best is not None and first.status == "ok" and best is not first and not _clearly_faster(
            best, first):
        best = first  # a difference inside the timing noise is no reason to leave the model
    record = None
    if best is not None:
        c = best.candidate
        pairs = tuple((m.candidate.predicted, m.seconds, m.candidate.bottleneck) for m in ok
                      if m.candidate.predicted is not None and m.seconds)
        record = make_record(device, k, plan, hw, config, tile=dict(c.tile),
                             threads=c.threads, local_size=c.local_size,
                             seconds=best.seconds, rho=rho, regret=regret,  # type: ignore
                             candidates=len(ok), pairs=pairs)  # type: ignore[arg-type]
    kind = ("contraction" if isinstance(k, ContractionKernel) else
            "rows" if isinstance(k, RowKernel) else
            "attention" if hasattr(k, "statements") else "elementwise")
    return KernelTuning(k.name, kind, kernel_digest(k, plan, hw, config), tuple(results),
                        best, first, rho, regret, record)


# A candidate replaces the model's first choice only when it is faster by more than this
# fraction and by more than the two candidates' spreads together: microsecond kernels jitter
# by several percent from launch to launch, and a record made from noise would pin a tile
# that is no better on the next run.
NOISE_FLOOR = 0.03
# Candidates this many times slower than the fastest on a first run are timed once only.
SCOUT_FACTOR = 4.0


def _clearly_faster(best: Measurement, first: Measurement) -> bool:
    margin = max(NOISE_FLOOR, best.spread + first.spread)
    return best.seconds < first.seconds * (1.0 - margin)  # type: ignore[operator]


# -- measurement ---------------------------------------------------------------------------------

class _Runner:
    """Validates candidates one by one, then times the correct ones in interleaved rounds, so
    that drift (clock changes, the driver's thread pool waking up) hits every candidate alike
    rather than whichever happens to run first."""

    def __init__(self, bench: _Bench, timer: Timer | None, progress: Progress | None,
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


class _Bench:
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
            self.inputs[n] = np.ascontiguousarray(a.astype(np.uint8) if t.dtype == "bool"
                                                  else a.astype(NP[t.dtype]))
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
        self.reference = evaluate_program(p, self.inputs)
        self.tolerance = {n: _tolerance(self.reference[n], config) for n in p.outputs
                          if p.tensors[n].dtype == "float32" and n not in p.inputs}
        self._built: dict[str, object] = {}

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
        output matches the reference, else where the worst one does not."""
        rt, p = self.runtime, self.program
        for n, buf in self.temps.items():
            rt.fill(buf, POISON[p.tensors[n].dtype], self.sizes[n])
        for s in self.sources:
            chosen, kern = (candidate, kernel) if s.name == candidate.name else \
                (s, self.kernels[s.name])
            rt.launch(kern, chosen.global_size, chosen.local_size, self._args(chosen))
        rt.finish()
        outs = {}
        for n in p.outputs:
            t = p.tensors[n]
            if n in p.inputs:
                outs[n] = self.inputs[n]
                continue
            raw = rt.download(self.temps[n], t.shape,
                              np.uint8 if t.dtype == "bool" else NP[t.dtype])
            outs[n] = raw.astype(np.bool_) if t.dtype == "bool" else raw
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
        interleaved rounds.  Launch n
        reads input copy n mod copies, so consecutive launches never share a copy, and each
        round starts one candidate later, so that no candidate always runs in the same place
        (the first of a round once always found its inputs out of cache)."""
        rt = self.runtime
        times: list[list[float]] = [[] for _ in runs]
        n = 0

        def launch(j: int) -> float:
            nonlocal n
            src, kernel = runs[j]
            ev = rt.launch(kernel, src.global_size, src.local_size,
                           self._args(src, n % len(self.copies)))
            n += 1
            return event_seconds(ev)

        # A scouting round: candidates far slower than the fastest (a work-group of one
        # thread, say) keep that one time rather than costing `repeat` slow runs each.
        live = list(range(len(runs)))
        if len(runs) > 1 and repeat > 1:
            scout = [launch(j) for j in live]
            fastest = min(scout)
            slow = {j for j in live if scout[j] > SCOUT_FACTOR * fastest}
            for j in slow:
                times[j].append(scout[j])
            live = [j for j in live if j not in slow]
        for i in range(warmup + repeat):
            for step in range(len(live)):
                j = live[(i + step) % len(live)]
                t = launch(j)
                if i >= warmup:
                    times[j].append(t)
        out = []
        for t in times:
            q25, med, q75 = (float(q) for q in np.percentile(t, [25, 50, 75]))
            out.append((med, (q75 - q25) / med if med > 0 else 0.0))
        return out


def _tolerance(ref: np.ndarray, config: Config) -> np.ndarray:
    """`compare`'s tolerance for each element of a float32 output, a millionth tighter, so
    that an output within it in float32 arithmetic is within `compare`'s in float64 (which
    then says where one is not).  NaN where the reference is NaN: those go to `compare`."""
    r64 = np.asarray(ref, np.float64)
    scale = float(np.max(np.abs(r64[np.isfinite(r64)]), initial=1.0))
    tol = config.atol * max(1.0, scale) + config.rtol * np.abs(r64)
    return (tol * (1.0 - 1e-6)).astype(np.float32)


def describe(report: TuneReport) -> str:
    """The candidates table and the report card, as `tilec tune` prints them."""
    lines = [f"device: {report.device.label()}; hardware model: {report.hw}"]
    for t in report.kernels:
        lines.append("")
        lines.append(f"{t.kernel} ({t.kind}, {len(t.results)} candidates)")
        lines.append(f"  {'rank':>4}  {'tile':<34} {'local':>6} {'score':>8} {'pred ms':>9} "
                     f"{'time ms':>10} {'spread':>6} {'GFLOP/s':>9}  status")
        for m in t.results:
            c = m.candidate
            tile = " ".join(f"{n}={v}" for n, v in c.tile) or "-"
            mark = "*" if m is t.best else " "
            score = "" if c.score is None else f"{c.score:.4g}"
            secs = "" if m.seconds is None else f"{m.seconds * 1e3:.4f}"
            rate = "" if m.gflops is None else f"{m.gflops:.2f}"
            spread = "" if m.seconds is None else f"{m.spread * 100:.1f}%"
            status = m.status + (f": {m.note}" if m.note and m.status != "ok" else "")
            pred = "" if c.predicted is None else f"{c.predicted * 1e3:.4f}"
            lines.append(f"{mark} {c.rank + 1:>4}  {tile:<34} {c.local_size or 'auto':>6} "
                         f"{score:>8} {pred:>9} {secs:>10} {spread:>6} {rate:>9}  {status}")
        if t.kind in ("contraction", "rows", "attention"):
            what = {"contraction": "tiles", "rows": "shapes", "attention": "forms"}[t.kind]
            rho = "n/a" if t.rho is None else f"{t.rho:+.3f}"
            regret = "n/a" if t.regret is None else f"{t.regret:.3f}"
            lines.append(f"  rho {rho} (model rank vs measured rank of the top {what})")
            lines.append(f"  regret {regret} (model's first choice / best {what[:-1]})")
        if (t.first is not None and t.best is t.first and t.regret is not None
                and t.regret > 1.0):
            lines.append(f"  kept the model's first choice: the fastest was within the timing "
                         f"noise (a {NOISE_FLOOR:.0%} floor, or the candidates' spreads)")
        if t.gain is not None:
            lines.append(f"  chosen: {t.best.candidate.label()}: "  # type: ignore[union-attr]
                         f"{t.gain:.3f}x the model's first choice")
        elif t.best is not None:
            lines.append(f"  chosen: {t.best.candidate.label()} (the model's first choice "
                         "was not measured)")
        else:
            lines.append("  no candidate passed validation; nothing recorded")
    return "\n".join(lines)


__all__ = ["Candidate", "KernelTuning", "Measurement", "Prepared", "TuneReport", "describe",
           "spearman", "tune", "tune_kernel", "variant"]
