"""Measured tuning: time the cost model's top-k tiles (and, with `lws`, local work sizes) on the
device, keep the fastest correct choice as a tuning record, and grade the model.

Per contraction kernel the candidates are the search's top-k tiles at the usual thread count; with
`lws`, the best few of those are tried again with every power-of-two thread count the kernel and
the device allow (a contraction's work-group size is its schedule's thread count, fixed in the
kernel by reqd_work_group_size, so each one is a regenerated kernel).  Elementwise kernels keep
their source and are launched with the local sizes of `worksize.elementwise_local_sizes`.

Row-fused kernels' candidates are the time model's top shapes (threads a row, rows a group,
vector width) and attention kernels' every form, first choice first, graded like tiles.

Every candidate first runs the whole program with the outputs poisoned and is compared with the
numpy reference; only a correct one is timed (`bench`: OpenCL profiling events, warm-up
launches, then the median of `repeat`, rotating among copies of the input buffers so that the
caches hold no more than a real run would find).  Candidates are timed together in interleaved
rounds, and the local-size phase times the tiles again with its own candidates, so that load
on the machine shifts every time in a report alike.  A `timer` callable may replace the
measurement (tests).

The report card per contraction: Spearman's rho between the model's rank and the measured rank of
the top-k tiles, and regret = time of the model's first choice / the best tile's time."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..codegen.contraction import KernelSource, contraction_source
from ..codegen.generate import generate, packed, schedule_for, split_k, with_local_size
from ..config import Config
from ..errors import Source, TileError
from ..plan.fuse import ContractionKernel, KernelPlan, fuse_attention, plan_kernels, use_halos
from ..plan.hw import HwModel
from ..plan.predict import bottleneck_of
from ..plan.rows import RowKernel
from ..plan.schedule import MOVED_BACK, ROLLED, UNPIPELINED
from ..plan.worksize import elementwise_local_sizes, thread_budgets
from ..runtime.device import Runtime
from ..runtime.device_model import hw_model_for
from ..runtime.registers import register_counter
from .bench import Bench, Candidate, Measurement, Progress, Runner, Timer
from .records import (
    DeviceKey,
    RecordStore,
    TuneRecord,
    default_path,
    kernel_digest,
    make_record,
)


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
         save: bool = True, seed: int = 0, quiet: bool = False,
         constants: Sequence[str] = ()) -> TuneReport:
    """Tune every kernel of a program on the config's device; append the records (unless
    `save` is false) to `records.default_path(config)`.  `budget` (seconds) stops measuring new
    candidates once spent; each kernel's first candidate is measured regardless.  `progress`
    is called with (done, total, label) per candidate; without one, a bar shows on a terminal
    once tuning has taken a couple of seconds, unless `quiet`.  `constants`: the inputs a
    graph binds once (its weights), planned as `compile(constants=...)` plans them."""
    if progress is None:
        from ..runtime.progress import Progress as Bar

        with Bar(0, "tuning", quiet=quiet) as bar:
            return tune(source, shapes, dtype=dtype, config=config, hw=hw, top_k=top_k,
                        lws=lws, lws_tiles=lws_tiles, budget=budget, repeat=repeat,
                        warmup=warmup, copies=copies, timer=timer, progress=bar, save=save,
                        seed=seed, constants=constants)
    start = time.monotonic()
    prep = Prepared(source, shapes, dtype, config, hw, top_k, copies=copies, seed=seed,
                    constants=constants)
    deadline = None if budget is None else start + budget
    run = Runner(prep.bench, timer, progress, deadline, warmup, repeat)
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
                 copies: int = 3, seed: int = 0, constants: Sequence[str] = ()):
        from ..lang.api import check_program

        config = config or Config()
        if top_k is not None:
            config = replace(config, top_k=top_k)
        self.config = config
        self.program = check_program(source, shapes, dtype)
        self.runtime = Runtime.get(config.device)
        self.model = hw_model_for(hw, config, self.runtime)
        # Planned as compile plans it (its kernels are the ones a record is looked up for).
        self.program, _ = split_k(self.program, self.model, config)
        self.program = packed(self.program, self.model, config, tuple(constants))
        self.plan = plan_kernels(self.program, rows=config.row_fusion,
                                 attention=fuse_attention(config, self.model),
                                 halos=use_halos(config, self.model))
        self.sources, self.searches = generate(self.plan, self.model, config,
                                               registers=register_counter(self.runtime, config))
        self.device = DeviceKey.from_info(self.runtime.info)
        self.copies, self.seed = copies, seed
        self._bench: Bench | None = None

    @property
    def bench(self) -> Bench:
        if self._bench is None:
            self._bench = Bench(self.runtime, self.plan, self.sources, self.config,
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
    run = Runner(prep.bench, timer, progress, deadline, warmup, repeat)
    run.total = prep.candidates(k)
    return _tune_one(run, prep, k, lws, lws_tiles)


def _tune_one(run: Runner, prep: Prepared, k, lws: bool, lws_tiles: int) -> KernelTuning:
    if isinstance(k, ContractionKernel):
        return _tune_contraction(run, k, prep.plan, prep.model, prep.config,
                                 prep.searches.get(k.name), lws, lws_tiles, prep.device)
    return _tune_elementwise(run, k, prep.plan, prep.model, prep.config, lws, prep.device)


# -- per kernel ----------------------------------------------------------------------------------

def variant(kernel: ContractionKernel, plan: KernelPlan, hw: HwModel, config: Config,
            tile: tuple[int, ...], threads: int | None, code: str = "") -> KernelSource:
    """The contraction's kernel for one tile, thread budget and code variant."""
    sched = schedule_for(kernel, hw, config, tile, threads, code)
    names = ", ".join(f"{n}={t}" for n, t in zip(kernel.flat.names, tile, strict=True))
    # As compile renders it (`codegen.generate`): the same hardware model's code forms.
    return contraction_source(kernel, sched, plan.program, [f"tuning candidate: {names}"], hw)


# Tiles (the fastest measured that have one) whose code variant is timed too: on the H200's
# seed conv at N=32 the one the unpipelined loop helped (3.77 -> 3.30 ms) was the third fastest.
VARIANT_TILES = 3


def _variants_of(k: ContractionKernel, hw: HwModel, config: Config, c: Candidate,
                 threads: int) -> list[str]:
    """The code variants worth timing for a measured candidate (none: [])."""
    tile = tuple(t for _, t in c.tile)
    if schedule_for(k, hw, config, tile, threads).pipeline:
        return [UNPIPELINED]
    if hw.kind != "cpu":
        return []
    found = [ROLLED] if "#pragma unroll" in c.source.text else []
    if "with code of its own" in c.source.text:  # its edge tile (`codegen.edge`)
        found.append(MOVED_BACK)
    return found


def _tune_contraction(run: Runner, k: ContractionKernel, plan: KernelPlan, hw: HwModel,
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

    def cand(rank: int, tile: tuple[int, ...], score, threads: int, phase: str,
             code: str = "") -> Candidate:
        src = variant(k, plan, hw, config, tile, threads, code)
        # The prediction is for the model's thread count and form; others have none.
        pred = predicted.get(tuple(tile)) if threads == default_threads and not code else None
        return Candidate(k.name, "contraction", phase, tuple(zip(names, tile, strict=True)),
                         src.local_size, src.local_size, rank, score, src,
                         pred[0] if pred else None, pred[1] if pred else "", code)

    results = run.measure([cand(r, t, s, default_threads, "tile") for r, (t, s) in
                           enumerate(top)], first=True)
    tile_ok = [m for m in results if m.status == "ok"]
    if lws and tile_ok:
        kwg, items = run.bench.limits()
        seen = {(m.candidate.tile, m.candidate.local_size) for m in results}
        extra = []
        for m in sorted(tile_ok, key=lambda m: m.seconds)[:lws_tiles]:
            tile = tuple(t for _, t in m.candidate.tile)
            widest = schedule_for(k, hw, config, tile, 1 << 30).wg_threads
            # Nearest the model's thread count first: a budget runs out on the far ones.
            here = m.candidate.threads or default_threads
            for t in sorted(thread_budgets(widest, kwg, items),
                            key=lambda t: (abs(t.bit_length() - here.bit_length()), -t)):
                c = cand(m.candidate.rank, tile, m.candidate.score, t, "lws")
                if (c.tile, c.local_size) not in seen:
                    seen.add((c.tile, c.local_size))
                    extra.append(c)
        results = _measure_more(run, results, extra)
    # Code variants of the fastest tiles, where they apply: on GPUs the pipelined loop
    # unpipelined (the registers it holds can cost a compute unit work-groups), on CPUs the
    # unrolled reduction loops rolled (LLVM can spill the unrolled ones) and a partial last
    # tile moved back instead of run by code of its own.  The model does not see them; the
    # measurement decides.
    extra, varied = [], 0
    tile_ok = [m for m in results if m.status == "ok" and m.candidate.phase == "tile"]
    for m in sorted(tile_ok, key=lambda m: m.seconds):
        tile = tuple(t for _, t in m.candidate.tile)
        threads = m.candidate.threads or default_threads
        codes = _variants_of(k, hw, config, m.candidate, threads)
        if varied < VARIANT_TILES and codes:
            varied += 1
            extra += [cand(m.candidate.rank, tile, m.candidate.score, threads, "variant", code)
                      for code in codes]
    if extra:
        results = _measure_more(run, results, extra)
    ok = [m for m in results if m.status == "ok"]
    tile_ok = [m for m in ok if m.candidate.phase == "tile"]
    rho = spearman([m.candidate.rank for m in tile_ok], [m.seconds for m in tile_ok])
    first = results[0]
    regret = (first.seconds / min(m.seconds for m in tile_ok)  # type: ignore[operator]
              if first.status == "ok" and tile_ok else None)
    return _finish(k, plan, hw, config, device, results, first, rho, regret)


def _measure_more(run: Runner, results: list[Measurement],
                  extra: list[Candidate]) -> list[Measurement]:
    """`results` with `extra` candidates measured after them: those measured already are
    timed again in the same rounds as the extra ones (one set of rounds, one clock)."""
    ok = [m for m in results if m.status == "ok"]
    run.total += len(extra)
    timed = run.measure(extra, retime=ok)
    again = {id(m.candidate): t for m, t in zip(ok, timed[len(extra):], strict=True)}
    return [again.get(id(m.candidate), m) for m in results] + timed[:len(extra)]


def _tune_elementwise(run: Runner, k, plan: KernelPlan, hw: HwModel, config: Config,
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


def _tune_rows(run: Runner, k: RowKernel, plan: KernelPlan, hw: HwModel, config: Config,
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


def _graded(run: Runner, k, plan: KernelPlan, hw: HwModel, config: Config,
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


def _tune_attention(run: Runner, k, plan: KernelPlan, hw: HwModel, config: Config,
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
                             candidates=len(ok), pairs=pairs,  # type: ignore[arg-type]
                             variant=c.variant)
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


def _clearly_faster(best: Measurement, first: Measurement) -> bool:
    margin = max(NOISE_FLOOR, best.spread + first.spread)
    return best.seconds < first.seconds * (1.0 - margin)  # type: ignore[operator]


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
            status += f" ({c.variant})" if c.variant else ""
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
