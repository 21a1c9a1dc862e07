"""Kernel sources for a `KernelPlan`: each contraction's tile (forced by the config, taken
from a tuning record, or the tile search's first choice), its schedule and its OpenCL text, and
the elementwise kernels' text.  The one path from a plan to kernels, shared by `compile` and by
tuning (which times the candidates it generates here)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..config import Config
from ..errors import TileError
from ..lang import ir
from ..plan.attention import AttentionKernel
from ..plan.attention_time import Form
from ..plan.chain import ChainKernel
from ..plan.fuse import ContractionKernel, KernelPlan
from ..plan.hw import HwModel
from ..plan.row_shape import RowShape, candidates
from ..plan.rows import RowKernel
from ..plan.schedule import make_schedule
from .attention_tiled import attention_forms, attention_kernel
from .chain import chain_source
from .contraction import KernelSource, contraction_source
from .elementwise import elementwise_source, init_source
from .rows import row_source

# A tuning record as generate reads it (tilec.tune.records.TuneRecord): `tile_for(names,
# ranges)`, `seconds`, `threads`, `local_size`, `variant`, `device.device`.
TuneRecord = Any
# What the device's compiler gives kernels (`runtime.registers.RegisterCounts`): called with a
# kernel's name and the texts of its candidates, it returns a work-item's registers for each
# (None where not known).
Registers = Callable[[str, Sequence[str]], Sequence["int | None"]]


def plan_tile(kernel: ContractionKernel, hw: HwModel, config: Config, dtype: str):
    """The tile for one contraction: forced by the config, or the search's first choice.
    Returns (tile, cost log lines, search result or None)."""
    from ..plan.search import search, tile_log

    flat = kernel.flat
    forced = forced_tile(config, kernel.op.output)
    if forced is not None:
        unknown = set(forced) - set(flat.names)
        if unknown:
            raise TileError(f"--tile for {kernel.op.output}: unknown index "
                            f"{', '.join(sorted(unknown))} (indices: {', '.join(flat.names)})")
        tile = forced_sizes(forced, flat)
        _, lines = tile_log(flat, hw, tile, kernel.post_op_count, dtype, config.cost_model)
        return tile, lines, None
    result = search(**search_arguments(flat, hw, config, dtype, kernel.post_op_count))
    return tuple(result.tile), result.log_lines(0), result


def search_arguments(flat, hw: HwModel, config: Config, dtype: str, post_ops: int = 0
                     ) -> dict:
    """The keyword arguments of `plan.search.search` for a flat contraction's tile (a
    kernel's, with its post-ops; the panel choice's, without)."""
    return dict(flat=flat, hw=hw, post_ops=post_ops, dtype=dtype, top_k=config.top_k,
                model=config.cost_model, cache=search_cache_dir(config))


def tile_searches(plan: KernelPlan, hw: HwModel, config: Config,
                  tuned: Mapping[str, TuneRecord] | None = None) -> list[dict]:
    """The searches `generate` will run (`search_arguments`), in its order; none where
    searches are not kept in the cache (`search_cache_dir`): then only the process that runs
    one has its outcome."""
    if search_cache_dir(config) is None:
        return []
    return [search_arguments(k.flat, hw, config, plan.program.tensors[k.op.output].dtype,
                             k.post_op_count)
            for k in plan.kernels
            if isinstance(k, ContractionKernel) and forced_tile(config, k.op.output) is None
            and _record_tile(k, config, tuned) is None]


def schedule_for(kernel: ContractionKernel, hw: HwModel, config: Config,
                 tile: tuple[int, ...], threads: int | None, variant: str = ""):
    """The schedule of one contraction tile under the config's codegen options (what compile
    builds, and what `tilec tune` times)."""
    sched = make_schedule(kernel.flat, tile, hw, vec=config.vector_width,
                          staging=config.staging, threads=threads,
                          split_reduction=config.split_reduction,
                          gpu_forms=config.gpu_forms, variant=variant)
    return sched if config.edge_tiles else replace(sched, edges=False)


def _packs(hw: HwModel, config: Config) -> bool:
    # With every kernel's tile forced, a copy kernel's is too, so none is made.
    return config.pack_panels and hw.kind == "cpu" and "*" not in config.tiles


def _as_written(program: ir.Program, config: Config) -> set[str]:
    """Contractions whose forced tile names their indices as written: their operands may be
    relaid (the indices stay), not read in panels (which split one).  Without the relaid
    filter a forced convolution tile got no vector lanes: 8x slower than the same tile
    searched.  One that names the panels' indices (the cost log's `coi`, `coo`) is packed as
    the search packs it, and applies to the statement that reads the panels."""
    forced = set()
    for op in program.ops:
        given = forced_tile(config, op.output) if isinstance(op, ir.Contraction) else None
        if given is not None and not _unknown(given, op.indices):
            forced.add(op.output)
    return forced


def _forced_panel_tile(config: Config, flat) -> tuple[int, ...] | None:
    """The tile the config forces on `packed`'s question about `flat` (one naming its
    indices), or None: searched."""
    given = forced_tile(config, flat.output.name)
    if given is not None and set(given) <= set(flat.names):
        return forced_sizes(given, flat)
    return None


def panel_searches(program: ir.Program, hw: HwModel, config: Config,
                   constants: Collection[str] = (), memo: dict | None = None) -> list[dict]:
    """The searches `packed` may run, in its order (`plan.pack.searched_flats`); none where
    searches are not kept in the cache (`tile_searches`).  `memo` keeps the contractions
    flattened for `packed` (`plan.pack.Flats`)."""
    from ..plan.pack import searched_flats

    if not _packs(hw, config) or search_cache_dir(config) is None:
        return []
    return [search_arguments(flat, hw, config, flat.output.dtype)
            for flat in searched_flats(program, hw, constants, _as_written(program, config),
                                       memo)
            if _forced_panel_tile(config, flat) is None]


def packed(program: ir.Program, hw: HwModel, config: Config,
           constants: Collection[str] = (),
           before_search: Callable[[dict], None] | None = None,
           memo: dict | None = None) -> ir.Program:
    """`program` with its CPU matrix products' reused operands packed in panels
    (`plan.pack`), each panel as wide as the register tile the search gives the product as
    written; contractions whose tile the config forces stay as written.  `constants`: the
    inputs bound once (a model's weights).  `before_search(search arguments)` is called
    before each search (`generate`'s); `memo`: `panel_searches`'s."""
    from ..plan.attention import find as find_attention
    from ..plan.fuse import fuse_attention
    from ..plan.pack import pack_panels
    from ..plan.rows import find_groups
    from ..plan.search import search

    if not _packs(hw, config):
        return program
    forced = _as_written(program, config)

    def grouped() -> set[str]:
        """Statements that become one attention or row kernel: matched as written."""
        groups = dict(find_groups(program) if config.row_fusion else {})
        if fuse_attention(config, hw):
            groups.update(find_attention(program))
        return {op.output for start, (end, _) in groups.items()
                for op in program.ops[start:end]}

    def choose(flat):
        tile = _forced_panel_tile(config, flat)
        if tile is not None:
            return tile, None
        args = search_arguments(flat, hw, config, flat.output.dtype)
        if before_search is not None:
            before_search(args)
        r = search(**args)
        return r.tile, (r.predicted[0][0] if r.predicted else None)

    out = pack_panels(program, hw, choose, relay_only=forced, grouped=grouped,
                      constants=constants, memo=memo)
    _check_panel_tiles(config, program, out, forced)
    return out


def _check_panel_tiles(config: Config, before: ir.Program, after: ir.Program,
                       as_written: set[str]) -> None:
    """A forced tile that is not in the statement's own indices must be in those of the
    statement reading panels; else the error names both sets (a typo in `co` would otherwise
    be reported against `coi, coo` alone)."""
    now = {op.output: op for op in after.ops if isinstance(op, ir.Contraction)}
    for op in before.ops:
        given = forced_tile(config, op.output) if isinstance(op, ir.Contraction) else None
        if given is None or op.output in as_written:
            continue
        packed_op = now.get(op.output)
        if packed_op is None or packed_op is op or not _unknown(given, packed_op.indices):
            continue  # not read in panels: the tile is checked where it is applied
        bad = _unknown(given, (*op.indices, *packed_op.indices))
        what = f"unknown index {', '.join(bad)}" if bad else \
            f"{', '.join(given)} mixes the two sets of indices"
        raise TileError(f"--tile for {op.output}: {what} (indices as written: "
                        f"{', '.join(sorted(op.indices))}; reading panels: "
                        f"{', '.join(sorted(packed_op.indices))}; a tile names one set or "
                        "the other)")


def split_k(program: ir.Program, hw: HwModel, config: Config):
    """`program` with the GPU sums that gain from it as partial sums and their sum
    (`plan.splitk`), and the splits made; `Config.split_k` says where.  Contractions whose
    tile the config forces stay as written."""
    import os

    from ..plan.splitk import split_sums

    if config.split_k is False or "*" in config.tiles:
        return program, ()
    keep = frozenset(op.output for op in program.ops if isinstance(op, ir.Contraction)
                     and forced_tile(config, op.output) is not None)
    parts = None if config.split_k in (None, True) else int(config.split_k)
    workers = config.search_workers
    if workers is None:
        cores = os.cpu_count() or 1
        workers = min(8, cores) if cores >= 4 else 0
    return split_sums(program, hw, SplitSearch(hw, config), keep=keep, parts=parts,
                      workers=workers if parts is None else 0)


class SplitSearch:
    """The tile search as compile runs it, for `plan.splitk` (a class: worker processes
    receive it pickled)."""

    def __init__(self, hw: HwModel, config: Config):
        self.hw, self.config = hw, config

    def __call__(self, flat):
        from ..plan.search import search
        from ..plan.splitk import Choice

        r = search(flat, self.hw, dtype=flat.output.dtype, top_k=self.config.top_k,
                   model=self.config.cost_model, cache=search_cache_dir(self.config))
        return Choice(r.tile, r.predicted[0][0] if r.predicted else None, r.ranked_by_time)


def forced_tile(config: Config, output: str) -> Mapping[str, int] | None:
    """The tile the config forces on the contraction writing `output`: named by its kernel
    (`contract_<output>`, `ContractionKernel.name`), its output, or "*" for every one."""
    return (config.tiles.get(f"contract_{output}") or config.tiles.get(output)
            or config.tiles.get("*"))


def _unknown(forced: Mapping[str, int], indices) -> list[str]:
    """The names of a forced tile that are neither among a statement's `indices` nor flat
    indices merged from them (`d0_d1`)."""
    idx = set(indices)
    return sorted(n for n in forced
                  if n not in idx and not all(part in idx for part in n.split("_")))


def forced_sizes(forced: Mapping[str, int], flat) -> tuple[int, ...]:
    """A forced tile over the flat indices: an index it leaves out takes its whole range."""
    return tuple(max(1, min(int(forced.get(n, r)), r))
                 for n, r in zip(flat.names, flat.ranges, strict=True))


def search_cache_dir(config: Config):
    """Where searches are kept between processes (None: not kept)."""
    if not config.use_disk_cache:
        return None
    from ..memo import default_cache_root

    return (config.cache_dir or default_cache_root()) / "search"


def generate(plan: KernelPlan, hw: HwModel, config: Config,
             tiles: Mapping[str, tuple[int, ...]] | None = None,
             tuned: Mapping[str, TuneRecord] | None = None,
             registers: Registers | None = None,
             before_search: Callable[[dict], None] | None = None
             ) -> tuple[list[KernelSource], dict[str, object]]:
    """Kernel sources in launch order, and the search result of each contraction.  `tuned`
    (kernel name -> tuning record) replaces the search's first choice; a tile forced by the
    config still wins over a record.  `registers` (where the device's compiler says) counts
    the registers of a long GPU kernel's top tiles, which are then ranked again
    (`counted_plan`).  `before_search(search arguments)` is called before a contraction's
    tile search (searches run ahead elsewhere: `runtime.search_ahead`)."""
    sources: list[KernelSource] = []
    searches: dict[str, object] = {}
    for k in plan.kernels:
        if isinstance(k, ContractionKernel):
            dtype = plan.program.tensors[k.op.output].dtype
            threads, code = config.threads, ""
            if tiles and k.name in tiles:
                tile, lines, result = tiles[k.name], [], None
            elif (rec := _record_choice(k, hw, config, dtype, tuned)) is not None:
                tile, lines, threads, code = rec
                result = None
            else:
                if before_search is not None:
                    before_search(search_arguments(k.flat, hw, config, dtype,
                                                   k.post_op_count))
                tile, lines, result = plan_tile(k, hw, config, dtype)
                if registers is not None and result is not None:
                    result = counted_plan(k, result, plan, hw, config, registers)
                    tile, lines = tuple(result.tile), result.log_lines(0)
            searches[k.name] = result
            sched = schedule_for(k, hw, config, tile, threads, code)
            if k.out_map == "injective":
                sources.append(init_source(k, plan.program))
            sources.append(contraction_source(k, sched, plan.program, lines, hw))
        elif isinstance(k, ChainKernel):
            sources.append(chain_source(k, plan, hw))
        elif isinstance(k, RowKernel):
            sources.append(row_source(k, plan.program, hw, config.threads,
                                      _record_shape(k, plan, hw, config, tuned)))
        elif isinstance(k, AttentionKernel):
            sources.append(attention_kernel(k, plan.program, hw, config.threads,
                                            _record_form(k, hw, config, tuned)))
        else:
            src = elementwise_source(k, plan.program)
            if tuned and k.name in tuned:
                src = with_local_size(src, tuned[k.name].local_size)
            sources.append(src)
    return sources, searches


def counted_plan(kernel: ContractionKernel, result, plan: KernelPlan, hw: HwModel,
                 config: Config, registers: Registers):
    """The search's outcome ranked again with the registers the compiler gives the kernels of
    its top tiles (`plan.registers`; the search widened to `QUERY_TILES` for it), or as it is
    where that is not worth a build or the compiler said nothing."""
    from ..plan.registers import QUERY_TILES, counted_enough, reranked, worth_counting
    from ..plan.search import search

    if not worth_counting(result):
        return result
    wide = search(kernel.flat, hw, post_ops=kernel.post_op_count, dtype=result.dtype,
                  top_k=max(config.top_k, QUERY_TILES), model=config.cost_model,
                  cache=search_cache_dir(config))
    if not worth_counting(wide):
        return result

    def text(tile) -> str:
        sched = schedule_for(kernel, hw, config, tuple(tile), config.threads)
        return contraction_source(kernel, sched, plan.program, [], hw).text

    # In the search's order, 1, 2, 4, ... tiles at a time, until the counted ones settle the
    # choice (`counted_enough`): a build costs 0.2-0.4 s a kernel on the H200.
    counts: list[int | None] = [None] * len(wide.top)
    done, step = 0, 1
    while True:
        batch = range(done, min(done + step, len(wide.top)))
        got = list(registers(kernel.name, [text(wide.top[i][0]) for i in batch]))
        for i, n in zip(batch, got, strict=True):
            counts[i] = n
        done, step = batch.stop, 2 * step
        if counted_enough(wide, counts, done):
            break
    if not any(counts):
        return result
    return reranked(wide, counts, keep=config.top_k)


def _record_shape(k: RowKernel, plan: KernelPlan, hw: HwModel, config: Config,
                  tuned: Mapping[str, TuneRecord] | None) -> RowShape | None:
    """A row kernel's measured shape from a tuning record, when it is still one of the
    model's candidates (a record from another version must not make an invalid kernel)."""
    rec = tuned.get(k.name) if tuned else None
    if rec is None:
        return None
    want = dict(rec.tile)
    for s in candidates(k, plan.program, hw, config.threads):
        if want == {"threads": s.threads, "rows": s.rows, "vec": s.vec}:
            return replace(s, note=f"tuned: measured {rec.seconds * 1e3:.4g} ms on "
                           f"{rec.device.device}")
    return None


def _record_form(k: AttentionKernel, hw: HwModel, config: Config,
                 tuned: Mapping[str, TuneRecord] | None) -> Form | None:
    """An attention kernel's measured form from a tuning record, when it is still one the
    kernel can take (a forced row count, Config.threads, wins)."""
    rec = tuned.get(k.name) if tuned else None
    if rec is None or config.threads is not None:
        return None
    want = dict(rec.tile)
    for f in attention_forms(k, hw):
        if want == {"tiled": int(f.form == "tiled"), "rows": f.rows}:
            return f
    return None


def _record_choice(k: ContractionKernel, hw: HwModel, config: Config, dtype: str,
                   tuned: Mapping[str, TuneRecord] | None):
    """(tile, cost lines, threads, code variant) from a tuning record, or None to search as
    usual."""
    from ..plan.search import tile_log

    found = _record_tile(k, config, tuned)
    if found is None:
        return None
    rec, tile = found
    _, lines = tile_log(k.flat, hw, tile, k.post_op_count, dtype, config.cost_model)
    code = rec.variant
    note = (f"tuned: measured {rec.seconds * 1e3:.4g} ms on {rec.device.device}"
            + (f" (threads {rec.threads})" if rec.threads else "")
            + (f", {code}" if code else ""))
    threads = config.threads if config.threads is not None else rec.threads
    return tile, [note] + lines, threads, code


def _record_tile(k: ContractionKernel, config: Config,
                 tuned: Mapping[str, TuneRecord] | None):
    rec = tuned.get(k.name) if tuned else None
    if rec is None or forced_tile(config, k.op.output) is not None:
        return None
    tile = rec.tile_for(k.flat.names, k.flat.ranges)
    return None if tile is None else (rec, tile)


def with_local_size(source: KernelSource, local: int | None) -> KernelSource:
    """An elementwise or init kernel launched with an explicit local size.  OpenCL 1.x wants
    the global size to be a multiple of it; those kernels return early past their element
    count, so rounding the global size up is safe."""
    if source.kind in ("contraction", "row"):
        raise TileError(f"a {source.kind} kernel's local size is its schedule's thread count")
    count = source.global_size if source.local_size is None else _count(source)
    if local is None:
        return replace(source, global_size=count, local_size=None)
    return replace(source, global_size=-(-count // local) * local, local_size=local)


def _count(source: KernelSource) -> int:
    # Elements of the kernel's output: what its launch must cover.
    outs = [a.elems for a in source.args if a.role == "out"]
    return max(outs) if outs else source.global_size
