"""`compile`: Tile text -> an `Executable` that runs on an OpenCL device.

parse -> check -> fuse (flatten) -> tile search -> schedule -> codegen -> build.  The
Executable holds the buffers and launches the kernels in order; with `validate=True` every call
is compared with the numpy reference."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from .codegen.contraction import KernelSource, contraction_source
from .codegen.elementwise import elementwise_source, init_source
from .config import Config
from .errors import Source, TileError
from .lang import ir
from .lang.api import check_program
from .lang.check import normalize_dtype
from .plan.fuse import ContractionKernel, KernelPlan, plan_kernels
from .plan.hw import HwModel
from .plan.schedule import make_schedule
from .runtime.device import Runtime
from .runtime.launch import NP, POISON, BufferSpec, KernelInfo, Launcher, Validation
from .runtime.memory import plan_memory
from .tune.records import TuneRecord, with_local_size


def _hw_for(hw: HwModel | str | None, config: Config, runtime: Runtime) -> HwModel:
    if isinstance(hw, HwModel):
        return hw
    name = hw or config.hw
    if name and name != "auto":
        return HwModel.load(name)
    return HwModel.from_device(runtime.device, max_vec=runtime.vector_limit)


def plan_tile(kernel: ContractionKernel, hw: HwModel, config: Config, dtype: str):
    """The tile for one contraction: forced by the config, or the search's first choice.
    Returns (tile, cost log lines, search result or None)."""
    from .plan.search import score_tile, search

    flat = kernel.flat
    forced = (config.tiles.get(kernel.name) or config.tiles.get(kernel.op.output)
              or config.tiles.get("*"))
    if forced is not None:
        unknown = set(forced) - set(flat.names)
        if unknown:
            raise TileError(f"--tile for {kernel.op.output}: unknown index "
                            f"{', '.join(sorted(unknown))} (indices: {', '.join(flat.names)})")
        tile = tuple(max(1, min(int(forced.get(n, r)), r))
                     for n, r in zip(flat.names, flat.ranges, strict=True))
        cost = score_tile(flat, hw, tile, post_ops=kernel.post_op_count, dtype=dtype)
        return tile, cost.log_text().splitlines(), None
    result = search(flat, hw, post_ops=kernel.post_op_count, dtype=dtype, top_k=config.top_k,
                    cache=search_cache_dir(config))
    return tuple(result.tile), result.cost.log_text().splitlines(), result


def search_cache_dir(config: Config):
    """Where searches are kept between processes (None: not kept)."""
    if not config.use_disk_cache:
        return None
    from .runtime.cache import default_cache_root

    return (config.cache_dir or default_cache_root()) / "search"


def generate(plan: KernelPlan, hw: HwModel, config: Config,
             tiles: Mapping[str, tuple[int, ...]] | None = None,
             tuned: Mapping[str, TuneRecord] | None = None
             ) -> tuple[list[KernelSource], dict[str, object]]:
    """Kernel sources in launch order, and the search result of each contraction.  `tuned`
    (kernel name -> tuning record) replaces the search's first choice; a tile forced by the
    config still wins over a record."""
    sources: list[KernelSource] = []
    searches: dict[str, object] = {}
    for k in plan.kernels:
        if isinstance(k, ContractionKernel):
            dtype = plan.program.tensors[k.op.output].dtype
            threads = config.threads
            if tiles and k.name in tiles:
                tile, lines, result = tiles[k.name], [], None
            elif (rec := _record_choice(k, hw, config, dtype, tuned)) is not None:
                tile, lines, threads = rec
                result = None
            else:
                tile, lines, result = plan_tile(k, hw, config, dtype)
            searches[k.name] = result
            sched = make_schedule(k.flat, tile, hw, vec=config.vector_width,
                                  staging=config.staging, threads=threads,
                                  split_reduction=config.split_reduction)
            if k.out_map == "injective":
                sources.append(init_source(k, plan.program))
            sources.append(contraction_source(k, sched, plan.program, lines))
        else:
            src = elementwise_source(k, plan.program)
            if tuned and k.name in tuned:
                src = with_local_size(src, tuned[k.name].local_size)
            sources.append(src)
    return sources, searches


def _record_choice(k: ContractionKernel, hw: HwModel, config: Config, dtype: str,
                   tuned: Mapping[str, TuneRecord] | None):
    """(tile, cost lines, threads) from a tuning record, or None to search as usual."""
    from .plan.search import score_tile

    found = _record_tile(k, config, tuned)
    if found is None:
        return None
    rec, tile = found
    cost = score_tile(k.flat, hw, tile, post_ops=k.post_op_count, dtype=dtype)
    note = (f"tuned: measured {rec.seconds * 1e3:.4g} ms on {rec.device.device}"
            + (f" (threads {rec.threads})" if rec.threads else ""))
    threads = config.threads if config.threads is not None else rec.threads
    return tile, [note] + cost.log_text().splitlines(), threads


def _record_tile(k: ContractionKernel, config: Config,
                 tuned: Mapping[str, TuneRecord] | None):
    rec = tuned.get(k.name) if tuned else None
    forced = (config.tiles.get(k.name) or config.tiles.get(k.op.output)
              or config.tiles.get("*"))
    if rec is None or forced is not None:
        return None
    tile = rec.tile_for(k.flat.names, k.flat.ranges)
    return None if tile is None else (rec, tile)


class Executable(Launcher):
    """Compiled kernels for one program on one device; call it with the input arrays."""

    def __init__(self, program: ir.Program, plan: KernelPlan, sources: list[KernelSource],
                 runtime: Runtime, hw: HwModel, config: Config, *, validate: bool = False,
                 searches: dict | None = None, built=None,
                 tuned: Mapping[str, TuneRecord] | None = None):
        self.program = program
        self.plan = plan
        self.sources = sources
        self.hw = hw
        self.config = config
        self.searches = searches or {}
        self.tuned: dict[str, TuneRecord] = dict(tuned or {})  # kernels chosen by a record
        self.source = "\n".join(s.text for s in sources)
        self.cost_log = "\n".join(s.cost for s in sources if s.cost)
        specs = {n: BufferSpec(program.tensors[n].shape, program.tensors[n].dtype,
                               program.tensors[n].size * _itemsize(program.tensors[n].dtype))
                 for n in plan.buffers()}
        runtime.check_sizes({n: s.nbytes for n, s in specs.items()})
        self._cl_program = built if built is not None else runtime.build(
            self.source, config.build_options, config)
        kernels = [KernelInfo(s.name, s.kind, s.global_size, s.local_size, s.tile, s.cost,
                              s.flops, tuple(a.tensor for a in s.args)) for s in sources]
        cl_kernels = {s.name: runtime.kernel(self._cl_program, s.name) for s in sources}
        memory = plan_memory(sources, {n: s.nbytes for n, s in specs.items()},
                             set(program.inputs) | set(program.outputs))
        self._setup(runtime, program.inputs, program.outputs, specs, kernels, cl_kernels,
                    memory, validate)

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

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]

    def check(self, inputs: Mapping[str, np.ndarray],
              outs: Mapping[str, np.ndarray]) -> Validation:
        from .lang.reference import evaluate_program

        ref = evaluate_program(self.program, inputs)
        return compare(ref, outs, self.program, self.config)


def compare(ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], program: ir.Program,
            config: Config) -> Validation:
    worst_abs, worst_rel, ok, worst = 0.0, 0.0, True, ""
    for name, r in ref.items():
        g = got[name]
        dt = program.tensors[name].dtype
        if dt in ("int32", "bool"):
            bad = np.asarray(r != g)
            if bad.any():
                ok = False
                worst = f"{name}: {int(bad.sum())} of {bad.size} elements differ"
            continue
        r64, g64 = np.asarray(r, np.float64), np.asarray(g, np.float64)
        scale = float(np.max(np.abs(r64[np.isfinite(r64)]), initial=1.0))
        rtol = config.rtol * (10 if dt == "float16" else 1)
        atol = config.atol * max(1.0, scale) * (10 if dt == "float16" else 1)
        err = np.abs(r64 - g64)
        same = (r64 == g64) | (np.isnan(r64) & np.isnan(g64))
        err = np.where(same, 0.0, err)
        bad = ~(err <= atol + rtol * np.abs(r64))
        if err.size:
            worst_abs = max(worst_abs, float(np.nanmax(np.where(np.isnan(err), np.inf, err))))
            rel = err / np.maximum(np.abs(r64), 1e-30)
            worst_rel = max(worst_rel, float(np.max(np.where(same, 0.0, rel))))
        if bad.any():
            ok = False
            idx = np.unravel_index(int(np.argmax(bad)), r64.shape) if r64.ndim else ()
            worst = (f"{name}{list(idx)}: expected {r64[idx]:.6g}, got {g64[idx]:.6g} "
                     f"({int(bad.sum())} of {bad.size} elements outside rtol={rtol:g}, "
                     f"atol={atol:g})")
    return Validation(worst_abs, worst_rel, ok, worst)


def _itemsize(dtype: str) -> int:
    return {"float32": 4, "float16": 2, "int32": 4, "bool": 1}[dtype]


def compile(source: str | Source, shapes: Mapping[str, Sequence[int]] | None = None, *,
            dtype: str | Mapping[str, str] = "float32", device: str | None = None,
            hw: HwModel | str | None = None, config: Config | None = None,
            validate: bool = False) -> Executable:
    """Compile a Tile program for inputs of the given shapes (default: the `// shapes:`
    comment) into kernels for one OpenCL device."""
    config = config or Config()
    if device is not None:
        config = replace(config, device=device)
    if isinstance(dtype, str):
        dtype = normalize_dtype(dtype)
    program = check_program(source, shapes, dtype)
    plan = plan_kernels(program)
    runtime = Runtime.get(config.device)
    model = _hw_for(hw, config, runtime)
    if config.threads is None and model.threads > runtime.max_wg:
        # A model written for a bigger device: plan no more threads than this one takes.
        config = replace(config, threads=_floor_pow2(runtime.max_wg))
    tuned = _lookup_records(plan, model, config, runtime)
    while True:
        sources, searches = generate(plan, model, config, tuned=tuned)
        exe = Executable(program, plan, sources, runtime, model, config, validate=validate,
                         searches=searches, tuned=tuned)
        limit = exe.work_group_limit()
        if limit is None:
            return exe
        # A kernel needs more registers a thread than a full work-group leaves it: the driver
        # caps its work-group size, so plan fewer threads and build again.  A forced split
        # reduction may ask for more threads than that budget: it becomes automatic (which
        # stays within the budget), so that this loop ends.
        split = None if config.split_reduction not in (None, False) else config.split_reduction
        config = replace(config, threads=_floor_pow2(limit), split_reduction=split)
        tuned = {}


def _floor_pow2(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def _lookup_records(plan: KernelPlan, model: HwModel, config: Config,
                    runtime: Runtime) -> dict[str, TuneRecord]:
    from .tune.records import DeviceKey, lookup

    found = lookup(plan, model, config, DeviceKey.from_info(runtime.info))
    # Only records that will be used: a forced tile wins, a stale tile is ignored.
    return {k.name: found[k.name] for k in plan.kernels if k.name in found and (
        not isinstance(k, ContractionKernel) or _record_tile(k, config, found) is not None)}


__all__ = ["NP", "POISON", "Executable", "KernelInfo", "Validation", "compare", "compile"]
