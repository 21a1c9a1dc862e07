"""`compile`: Tile text -> an `Executable` that runs on an OpenCL device.

parse -> check -> fuse (flatten) -> tile search -> schedule -> codegen -> build.  The
Executable holds the buffers and launches the kernels in order; with `validate=True` every call
is compared with the numpy reference."""

from __future__ import annotations

import functools
import hashlib
import warnings
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

import numpy as np

from .codegen.contraction import KernelSource
from .codegen.generate import (
    _record_tile,
    generate,
    packed,
    panel_searches,
    split_k,
    tile_searches,
)
from .codegen.phases import GRID_SYNC, SYNC_INTS, fuse_phases
from .codegen.siblings import merge_siblings, settled
from .config import Config
from .errors import BuildError, Source, TileError, TileWarning
from .lang import ir
from .lang.api import check_program
from .lang.check import normalize_dtype
from .plan.chain import chain_kernels
from .plan.fuse import (
    ContractionKernel,
    KernelPlan,
    fuse_attention,
    is_plain_copy,
    plan_kernels,
    use_halos,
)
from .plan.hw import HwModel
from .runtime import compiled, search_ahead
from .runtime.device import Runtime, runs_groups_at_once
from .runtime.device_model import hw_model_for, measures_device, open_ahead
from .runtime.launch import (
    NP,
    POISON,
    BufferSpec,
    KernelInfo,
    Launcher,
    itemsize,
)
from .runtime.memory import plan_memory
from .runtime.prebuild import (
    BuildWorkers,
    Prebuild,
    early_workers,
    part_count,
    split_parts,
)
from .runtime.progress import Progress, step
from .runtime.registers import register_counter
from .runtime.share import SharedKernels, canonical, share_kernels
from .runtime.validate import Validation, compare
from .tune.records import TuneRecord


class Executable(Launcher):
    """Compiled kernels for one program on one device; call it with the input arrays."""

    def __init__(self, program: ir.Program, plan: KernelPlan, sources: list[KernelSource],
                 runtime: Runtime, hw: HwModel, config: Config, *, validate: bool = False,
                 searches: dict | None = None, built=None,
                 tuned: Mapping[str, TuneRecord] | None = None,
                 shared: SharedKernels | None = None, workers: BuildWorkers | None = None):
        self.program = program
        self.plan = plan
        self.sources = sources
        self.hw = hw
        self.config = config
        self.searches = searches or {}
        self.tuned: dict[str, TuneRecord] = dict(tuned or {})  # kernels chosen by a record
        # Kernels that differ only in names are one function in the program (`share`): the
        # source is what is built, `entries` says which of its kernels each launch runs.
        shared = shared or share_kernels(sources, plan.program.tensors)
        self.shared = shared
        self.source = shared.text
        self.entries = shared.entries
        self.cost_log = "\n".join(s.cost for s in sources if s.cost)
        self.splits: tuple = ()  # the sums compile split (`plan.splitk.Split`)
        tensors = plan.program.tensors  # the program's, and those planning adds (`halo`)
        specs = {n: BufferSpec(tensors[n].shape, tensors[n].dtype,
                               tensors[n].size * itemsize(tensors[n].dtype))
                 for n in plan.buffers()}
        runtime.check_sizes({n: s.nbytes for n, s in specs.items()})
        if any(s.kind == "phases" for s in sources):
            specs[GRID_SYNC] = BufferSpec((SYNC_INTS,), "int32", SYNC_INTS * 4)
        # A large program on PoCL's CPU devices is built in parts, by worker processes where
        # that is cold (`prebuild`); the parts then come from PoCL's cache here.
        parts = split_parts(shared, sources, 1 if built is not None
                            else part_count(runtime, config.build_workers))
        if built is not None and workers is not None:
            workers.close()
        kernels = [KernelInfo(s.name, s.kind, s.global_size, s.local_size, s.tile, s.cost,
                              s.flops, tuple(a.tensor for a in s.args),
                              tuple(a.tensor for a in s.args if a.role == "out"))
                   for s in sources]
        sizes = {n: s.nbytes for n, s in specs.items() if n != GRID_SYNC}
        keep = set(program.inputs) | set(program.outputs) | {h.root for h in plan.halos}
        # A phase launch's kernels run in turn, as separate launches would: the pool's slots
        # are planned over them.
        steps = [m for s in sources for m in (s.members if s.kind == "phases" else (s,))]
        memory = plan_memory(steps, sizes, keep)
        self.specs, self.memory = dict(specs), memory  # (`_buffer_bytes`; `_setup` keeps them)
        self._prebuild = None if built is not None else Prebuild.start(
            runtime, parts, config.build_options, config.build_workers,
            _cache_root(config), started=workers)
        if self._prebuild is not None:
            # The workers generate the kernels' code from the parts they built while this
            # process reads the same parts from the driver's cache.
            self._launch_ahead(kernels)
        programs = (built,) if built is not None else tuple(
            runtime.build(p.text, config.build_options, config) for p in parts)
        home = {e: programs[i] for i, p in enumerate(parts) for e in p.entries}
        self._cl_programs = programs
        self.prebuilt = (0, 0)
        self.show_progress = False
        cl_kernels = {s.name: runtime.kernel(home[self.entries[s.name]], self.entries[s.name])
                      for s in sources}
        self._setup(runtime, program.inputs, program.outputs, specs, kernels, cl_kernels,
                    memory, validate,
                    replan=lambda more: plan_memory(steps, sizes, keep | more),
                    halos=plan.halos, host_io=config.host_io)

    def _inputs(self, arrays: Mapping[str, np.ndarray], *, partial: bool = False,
                views: bool = False) -> dict[str, np.ndarray]:
        out = super()._inputs(arrays, partial=partial, views=views)
        for name, value in self.program.fixed.items():
            if name in out and int(out[name]) != value:
                raise TileError(f"input {name} is {int(out[name])}, but the program was "
                                f"compiled with {name} = {value} (it is used as a size)")
        return out

    def whole_program(self):
        """The program of every kernel as one (a bundle's binary): the built one, or, where
        the kernels were built in parts, the whole source built now."""
        if len(self._cl_programs) == 1:
            return self._cl_programs[0]
        return self.runtime.build(self.source, self.config.build_options, self.config)

    def _first_launches(self, kernels: list[KernelInfo]) -> list[tuple]:
        """What the build workers need to launch `kernels` once (`Prebuild.launch`)."""
        texts = {s.name: len(s.text) for s in self.sources}
        return [(self.entries[k.name], k.local_size, k.global_size,
                 [self._buffer_bytes(a) for a in k.args], texts[self.entries[k.name]])
                for k in kernels]

    def _launch_ahead(self, kernels: list[KernelInfo]) -> None:
        """Right after the workers' builds: they start on the kernels' first launches while
        this process goes on (loading the parts, binding weights).  Plain copies are left
        out: a bound one is computed on the host (`_on_host`), never launched."""
        copies = {k.name for k in self.plan.kernels
                  if isinstance(k, ContractionKernel) and is_plain_copy(k)}
        self._prebuild.launch(self._first_launches([k for k in kernels
                                                    if k.name not in copies]),
                              background=True)

    def _prepare(self, kernels: list[KernelInfo]) -> None:
        """Before launches: the workers' first launches are awaited, and kernels they have not
        launched are given to them (the first run's launches, at most twice)."""
        if self._prebuild is None or not kernels:
            return
        pre = self._prebuild
        entries = {self.entries[k.name] for k in kernels}
        with Progress(len(entries | pre.asked), "generating kernel code", unit="kernel",
                      quiet=not self.show_progress) as bar:
            def tick() -> None:
                bar.step("", pre.answered - bar.done)

            pre.wait(tick)
            pre.launch(self._first_launches(kernels), tick=tick)
        if any(k.name not in self.hoisted for k in kernels):
            self._close_prebuild()  # a call's kernels (bind's come first): none later

    def _close_prebuild(self) -> None:
        if self._prebuild is not None:
            self._prebuild.close()
            # What the workers did, for tests and reports: parts built, first launches made.
            self.prebuilt = (len(self._prebuild.built), len(self._prebuild.done))
            self._prebuild = None

    def work_group_limit(self) -> int | None:
        """The smallest maximum work-group size the driver allows for a kernel whose fixed
        work-group size exceeds it, or None when every kernel can be launched as planned."""
        worst = None
        for s in self.sources:
            if s.local_size is None:
                continue
            most = self.runtime.max_work_group(self._kernels[s.name])
            if most < s.local_size:
                worst = most if worst is None else min(worst, most)
        return worst

    def _on_host(self, name: str, env: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """A plain copy into another layout (a filter relaid in panels at bind) is computed
        with numpy: PoCL would spend up to a second generating the copy's code at its only
        launch (a 512x512x3x3 filter's transpose: 1.1 s against 0.01-0.05 s here).  The
        launcher has checked that `env` holds its input."""
        k = next((k for k in self.plan.kernels
                  if isinstance(k, ContractionKernel) and k.name == name), None)
        if k is None or not is_plain_copy(k):
            return None
        from .lang.reference import evaluate_contraction, index_bounds
        from .lang.reference_copy import strided_copy

        tensors = self.program.tensors
        out = tensors[k.op.output]
        # The copy as a strided view of its input, which the launcher writes into the
        # output's buffer: one pass over the weights, no array in between.
        view = strided_copy(k.op, tensors, env, index_bounds(k.op, tensors))
        if view is not None and view.dtype == NP[out.dtype]:
            return {k.op.output: view}
        return {k.op.output: evaluate_contraction(k.op, tensors, env)}

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]

    def check(self, inputs: Mapping[str, np.ndarray],
              outs: Mapping[str, np.ndarray]) -> Validation:
        from .lang.reference import evaluate_program

        ref = evaluate_program(self.program, inputs)
        return compare(ref, outs, self.program, self.config)


def compile(source: str | Source, shapes: Mapping[str, Sequence[int]] | None = None, *,
            dtype: str | Mapping[str, str] = "float32", device: str | None = None,
            hw: HwModel | str | None = None, config: Config | None = None,
            validate: bool = False, values: Mapping[str, int] | None = None,
            reuse: bool = False, progress: Progress | None = None,
            constants: Collection[str] | None = None) -> Executable:
    """Compile a Tile program for inputs of the given shapes (default: the `// shapes:`
    comment) into kernels for one OpenCL device.  `values` fixes 0-d integer inputs that the
    program uses as sizes (a call with another value is refused).  `reuse` keeps the whole
    result (checked program, plan, kernel sources) in the cache directory, so that compiling
    the same program again skips parsing, planning and code generation (`compiled`); graph
    and model compiles use it.  `progress` is advanced through the stages.  `constants`
    (graph compiles): the inputs bound once, not given each call; independent kernels of
    the call then share launches where `Config.sibling_launches` allows."""
    config = config or Config()
    if device is not None:
        config = replace(config, device=device)
    if isinstance(dtype, str):
        dtype = normalize_dtype(dtype)
    open_ahead(config, hw)  # the device probe and calibration's builds, while this checks
    key = None
    reuse = reuse and config.use_disk_cache

    def key_for(model: HwModel, runtime: Runtime) -> str:
        return compiled.key(source, shapes, dtype, values, config, model, runtime,
                            _records_digest(config),
                            None if constants is None else sorted(constants))

    # Where the device is yet to be calibrated no stored compile can match (its key holds the
    # model the calibration makes): the check goes first, while the kernels warm up.
    if reuse and not measures_device(hw, config, runtime := Runtime.get(config.device)):
        model = corrected_model(hw_model_for(hw, config, runtime), load_records(config),
                                runtime)
        key = key_for(model, runtime)
        found = compiled.load(config, key)
        if found is not None:
            step(progress, "kernels from the cache", COMPILE_STEPS - 1)
            exe = Executable(found.program, found.plan, list(found.sources), runtime, model,
                             found.config_for(config), validate=validate,
                             searches=found.searches, tuned=found.tuned, shared=found.shared)
            if exe.work_group_limit() is None:
                step(progress, "built")
                exe.show_progress = progress is not None and progress.shown
                return exe
    program = check_program(source, shapes, dtype, values)
    step(progress, "checked the program")
    runtime = Runtime.get(config.device)
    records = load_records(config)  # read once: the correction and the kernels' records
    own = hw_model_for(hw, config, runtime)
    model = corrected_model(own, records, runtime)
    if reuse and key is None:
        key = key_for(model, runtime)
    # Which kernels there are (split sums, packed panels) is decided with the model as
    # measured, not as the tuning records correct it: `tilec tune` plans them so (its records
    # are not fitted to their own correction), and a record names the kernel it was made for.
    program, splits = split_k(program, own, config)
    # Build workers start now: they open the device, then search tiles ahead of this process
    # while it packs panels and generates the kernels (`search_ahead`).
    workers = early_workers(runtime, config.build_workers,
                            sum(isinstance(op, ir.Contraction) for op in program.ops))
    try:
        kept, flats = constants or (), {}  # flats: flattened once for both (`plan.pack`)
        program = _ahead(workers, panel_searches(program, own, config, kept, flats),
                         lambda settle: packed(program, own, config, kept, settle, flats))
        plan = plan_kernels(program, rows=config.row_fusion,
                            attention=fuse_attention(config, own),
                            halos=use_halos(config, own))
        step(progress, f"planned {len(plan.kernels)} kernels")
        if config.threads is None and model.threads > runtime.max_wg:
            # A model written for a bigger device: plan no more threads than this one takes.
            config = replace(config, threads=_floor_pow2(runtime.max_wg))
        tuned = _lookup_records(plan, model, config, runtime, records)
        phased = constants is not None and _phases(config, model, runtime)
        # Where the call's kernels become phase launches, small kernels run there (on the
        # first work-group, `codegen.phases`) without a chain's launch of their own.
        if config.chains and not phased:
            plan = chain_kernels(plan, model, loops=config.chain_loops)
    except BaseException:
        if workers is not None:
            workers.close()
        raise
    while True:
        sources, searches = _ahead(
            workers, tile_searches(plan, model, config, tuned),
            functools.partial(_generate, plan, model, config, tuned,
                              register_counter(runtime, config)))
        step(progress, f"generated {len(sources)} kernels")
        if constants is not None and _siblings(config, model):
            # A concatenation's operands are written in disjoint slices of its buffer
            # (`plan.placement`), so their producers may share a launch.
            sources = merge_siblings(sources, program.inputs, constants,
                                     {st.root for st in plan.storage.values()}
                                     - {h.root for h in plan.halos})
        apart = sources
        if phased:
            sources = fuse_phases(sources, settled(sources, program.inputs, constants),
                                  functools.partial(_digest, tensors=plan.program.tensors),
                                  model, runtime.compute_units)
        try:
            exe = Executable(program, plan, sources, runtime, model, config, validate=validate,
                             searches=searches, tuned=tuned, workers=workers)
        except BuildError as e:
            if sources is apart:
                raise
            # The driver refused a phase launch's text: each kernel runs as generated, in a
            # launch of its own, and the user is told why.
            warnings.warn(f"{e}; the kernels run as separate launches instead of phase "
                          "launches", TileWarning, stacklevel=2)
            sources = apart
            exe = Executable(program, plan, sources, runtime, model, config, validate=validate,
                             searches=searches, tuned=tuned)
        workers = None
        exe.splits = splits
        step(progress, f"built {len(set(exe.entries.values()))} distinct kernels")
        limit = exe.work_group_limit()
        if limit is not None:
            exe._close_prebuild()
        if limit is None:
            if key is not None:
                compiled.store(config, key, compiled.Compiled(
                    program, plan, tuple(sources), searches, tuned, config.threads,
                    config.split_reduction, exe.shared))
            # Where the compile showed a bar, the build workers' first launches show one too.
            exe.show_progress = progress is not None and progress.shown
            return exe
        # A kernel needs more registers a thread than a full work-group leaves it: the driver
        # caps its work-group size, so plan fewer threads and build again.  A forced split
        # reduction may ask for more threads than that budget: it becomes automatic (which
        # stays within the budget), so that this loop ends.
        split = None if config.split_reduction not in (None, False) else config.split_reduction
        config = replace(config, threads=_floor_pow2(limit), split_reduction=split)
        tuned = {}
        if progress is not None:
            progress.add(2)


def _generate(plan, model, config, tuned, registers, settle):
    return generate(plan, model, config, tuned=tuned, registers=registers,
                    before_search=settle)


def _ahead(workers: BuildWorkers | None, jobs: list[dict], run):
    """`run(settle)`, with the searches `jobs` run ahead by `workers` from the last one back
    (`search_ahead`; `settle` is None without them).  The workers are done with them when
    this returns, and stopped where `run` raises."""
    ahead = search_ahead.start(workers, jobs)
    try:
        out = run(ahead.settle if ahead is not None else None)
    except BaseException:
        if ahead is not None:
            ahead.close()
        if workers is not None:
            workers.close()
        raise
    if ahead is not None:
        ahead.close()
    return out


def _siblings(config: Config, model: HwModel) -> bool:
    """Whether independent kernels may share launches (`Config.sibling_launches`)."""
    if config.sibling_launches is not None:
        return config.sibling_launches
    return model.kind == "cpu"


def _digest(source: KernelSource, tensors) -> str:
    """A kernel's text as `runtime.share` compares it: same digest, same function."""
    return hashlib.sha256(canonical(source, tensors).encode()).hexdigest()


def _phases(config: Config, model: HwModel, runtime: Runtime) -> bool:
    """Whether runs of kernels may be one launch each (`Config.phase_launches`): on PoCL's
    CPU driver, whose pool runs a launch's work-groups at once (`codegen.phases`)."""
    return config.phase_launches and model.kind == "cpu" and runs_groups_at_once(runtime)


# Steps `compile` reports to a progress bar (check, plan, generate, build).
COMPILE_STEPS = 4


def _cache_root(config: Config):
    """Where a compile may note what it left in the driver's cache (None: it keeps nothing)."""
    from . import memo

    if not config.use_disk_cache:
        return None
    return config.cache_dir or memo.default_cache_root()


def _records_digest(config: Config) -> str:
    """What the tuning records a compile may use are (their file's digest)."""
    if not config.use_tuning_records:
        return "no records"
    from . import memo
    from .tune.records import default_path

    try:
        return memo.digest(default_path(config).read_bytes())
    except OSError:
        return "no records file"


def _floor_pow2(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def load_records(config: Config) -> dict:
    """The tuning records file's records (none when the config ignores them)."""
    if not config.use_tuning_records:
        return {}
    from .tune.records import RecordStore, default_path

    return RecordStore(default_path(config)).load()


def corrected_model(model: HwModel, records: dict, runtime: Runtime) -> HwModel:
    """The model with the time model's correction fitted from this device's tuning records
    (`tune.correction`), where there are records with predicted and measured tiles."""
    from .tune import correction
    from .tune.records import DeviceKey

    return correction.apply(model, correction.fit(records.values(),
                                                  DeviceKey.from_info(runtime.info)))


def _lookup_records(plan: KernelPlan, model: HwModel, config: Config, runtime: Runtime,
                    records: dict) -> dict[str, TuneRecord]:
    from .tune.records import DeviceKey, lookup

    found = lookup(plan, model, config, DeviceKey.from_info(runtime.info), found=records)
    # Only records that will be used: a forced tile wins, a stale tile is ignored.
    return {k.name: found[k.name] for k in plan.kernels if k.name in found and (
        not isinstance(k, ContractionKernel) or _record_tile(k, config, found) is not None)}


__all__ = ["NP", "POISON", "Executable", "KernelInfo", "Validation", "compare", "compile",
           "corrected_model", "load_records"]
