"""The score of one tile of one contraction on one hardware model.

GPU models (`kind = "gpu"`) get PlaidML's cost model exactly (DESIGN.md, plaidml-notes.md; the
golden test reproduces seed 001's log number for number).  With es the element size and
me = mem_width / es:

    to  = prod ranges * (post_ops + 2)        wg = prod_out ceil(range/tile)
    il  = prod_all ceil(range/tile) / wg      op = min(threads, prod tile)
    rp  = doublings of prod_out tile to reach op (leftover threads reduce; they cost threads*es
          of local memory)                    tu = max(op, output threads)
    or  = threads * prod_out ceil(tile/threads on the index) * es   (accumulator registers)
    mw  = prod_out (output stride 1 ? ceil(tile/me) : tile) * mem_width
    mr  = sum_inputs loads * mem_width        (loads: `layout.read_plan`, after merging)
    sm  = sum_inputs padded local buffer * es (0 when staging is "global"; tilec leaves out
          an input a split kernel reads once a point, which it reads through the cache)
    bytes = wg * (il*mr + mw); flops_per_byte = to / bytes
    score = min(fpb, goal)/goal * min(wg, goal_groups)/goal_groups * tu/threads
    sm > max_mem: "over memory"; or > max_regs: "over regs"; both score -1.

CPU models (`kind = "cpu"`) plan one work-item per tile: the output tile is a register tile of
explicit float vectors (v lanes along the index u that the code generator vectorises: the
output's unit-stride index, or else a reduction index every input reads contiguously, when each
accumulator is a vector summed across lanes at the end; v = the largest power of two up to
vec_size dividing u's tile and range), and the reduction indices are walked in chunks of their
tile.  Nothing is staged (sm = 0, never over
memory); inputs come through LRU caches.  The same `to wg il or mr mw op rp tu` are reported,
and the score is the product of six ratios, each in (0, 1]:

* compute_ratio: the register microkernel.  With a_i = ceil(tile_i/threads_i) accumulators
  along output index i, the accumulators take acc = prod_{i!=u} a_i * ceil(a_u/v) vector registers
  (a u tile that is not a multiple of v wastes lanes).  Per reduction step each input loads
  prod over the output indices it depends on of a_i operands (vectors along u where its u stride
  is 1, single elements otherwise).  A step costs max(acc/2, loads/2, 4) cycles (2 FMA pipes,
  2 load ports, FMA latency 4: fewer than 8 accumulators leave the pipes idle), a chunk adds 8
  cycles of loop overhead and a tile 32 (address set-up, stores).  The ratio is the ideal
  points/(2v) cycles over the modelled total, so ragged edges (tile not dividing range) count.
* "over regs" when acc + sum loads + 1 > registers (the generated code loads every operand of
  a reduction step before its FMAs, so all of them are live at once), or or > max_regs.
* cache_ratio = min(1, L1 budget / mr), L1 budget = max_mem (else l1_bytes): a reduction chunk's
  inputs (mr bytes of cache lines) should stay in L1 while the microkernel walks it (MegEngine's
  Kr = L1/(mr+nr), seed 004).  Together with the chunk overhead this picks the largest chunk
  that fits L1.
* roof_ratio = min(fpb, goal)/goal with fpb = to / DRAM bytes, and l2_ratio = min(l2 fpb,
  2*2*v/mem_width)/(2*2*v/mem_width) with l2 fpb = 2*points / L2 bytes (L2 delivers a line a
  cycle; the core does 2*2*v flops a cycle).  Bytes: work-groups run in order with the
  lowest-stride output index that has several groups varying fastest (`Layout.group_order`).
  An input with no stride on it is the same panel for consecutive groups: its re-reads hit L1 if
  the panel (il * loads * mem_width bytes) fits the L1 budget, else L2 if it fits half of L2,
  else DRAM.  Fresh panels come from L2 when the whole input fits half of L2 (then DRAM reads
  it once), else from DRAM.  Outputs are written once (mw per group to L2, their size to DRAM).
* occ_ratio and thread_ratio as on GPUs (goal_groups = groups that keep every core busy).

For a matmul on pocl-cpu (AVX2: 16 registers, v=8) this picks 4x16 register tiles (6x16 when
6 divides M) with a K chunk near 256 that keeps A and B chunks in L1.

Long (over 500 lines) because it holds the two cost models side by side (PlaidML's for GPUs,
the cache model for CPUs) with their shared byte counts; the golden test pins the first."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from .flat import FlatContraction
from .layout import layout, merge_stats, output_order, read_plan, thread_split
from .schedule import moves_back, vector_candidates
from .sweep import largest_panel, sweep_many, sweep_reuse

if TYPE_CHECKING:
    from .hw import HwModel

VERSION = 1
STATUS_TEXT = ("ok", "over memory", "over regs")
FMA_PORTS = 2
LOAD_PORTS = 2
FMA_LATENCY = 4
CHUNK_CYCLES = 8
# Each operand load also costs issue slots and address arithmetic (and, under a padding
# constraint, a select) that the port counts above leave out; it separates register tiles that
# the ports alone rate equal (a conv's co=4 x 4 pixels beats co=2 x 8 pixels by 2-3x on PoCL).
LOAD_ISSUE = 0.25
# An input's register-tile loads that are not one contiguous run (a conv tile two rows high
# reads two separate runs of the image) cost extra: measured on PoCL, a 1x4 spatial tile ran
# 1.8x faster than a 2x2 one with the same loads and FMAs.
STREAM_CYCLES = 1.0
TILE_CYCLES = 32

_GPU_STATS = ("to", "wg", "il", "sm", "or", "mr", "mw", "op", "rp", "tu")
_CPU_STATS = ("vregs", "l2_bytes", "dram_bytes", "sweep")
_RATIOS = ("compute_ratio", "cache_ratio", "l2_ratio")


@dataclass(frozen=True)
class Cost:
    """Every statistic of one tile; `score` is -1 unless `status` is "ok"."""

    names: tuple[str, ...]
    tile: tuple[int, ...]
    hw: str
    kind: str
    status: str
    to: int
    wg: int
    il: int
    sm: int
    or_: int
    mr: int
    mw: int
    op: int
    rp: int
    tu: int
    flops_per_byte: float = 0.0
    occupancy: float = 0.0
    roof_ratio: float = 0.0
    occ_ratio: float = 0.0
    thread_ratio: float = 0.0
    score: float = -1.0
    # CPU model only (0 / 1 on GPUs)
    vregs: int = 0
    l2_bytes: int = 0
    dram_bytes: int = 0
    compute_ratio: float = 1.0
    cache_ratio: float = 1.0
    l2_ratio: float = 1.0
    sweep: int = 1  # register tiles a work-item runs in turn (`sweep.sweep_many`)

    @property
    def regs(self) -> int:
        return self.or_

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def log_text(self) -> str:
        """The seed's cost-log lines (C++ iostream number format), plus a CPU line on CPUs."""
        lines = [f"Computing cost for tile size: [{', '.join(str(t) for t in self.tile)}]",
                 "  Compute score: " + " ".join(f"{k}={self.stat(k)}" for k in _GPU_STATS)]
        if self.kind == "cpu":
            lines.append(f"  cpu: vregs={self.vregs} l2_bytes={self.l2_bytes} "
                         f"dram_bytes={self.dram_bytes} compute_ratio={self.compute_ratio:g} "
                         f"cache_ratio={self.cache_ratio:g} l2_ratio={self.l2_ratio:g}"
                         + (f" sweep={self.sweep}" if self.sweep > 1 else ""))
        if not self.ok:
            lines.append(f"  {self.status}")
            return "\n".join(lines)
        lines.append(f"  flops_per_byte={self.flops_per_byte:g} occupancy={self.occupancy:g}")
        lines.append(f"  roof_ratio={self.roof_ratio:g} occ_ratio={self.occ_ratio:g} "
                     f"thread_ratio={self.thread_ratio:g} score={self.score:g}")
        return "\n".join(lines)

    def stat(self, key: str) -> Any:
        return self.or_ if key == "or" else getattr(self, key)

    def to_json(self) -> dict[str, Any]:
        """One JSON-lines record: the tile by index name and every statistic."""
        rec: dict[str, Any] = {"version": VERSION, "hw": self.hw, "kind": self.kind,
                               "tile": dict(zip(self.names, self.tile, strict=True)),
                               "status": self.status}
        rec.update({k: self.stat(k) for k in _GPU_STATS})
        for k in ("flops_per_byte", "occupancy", "roof_ratio", "occ_ratio", "thread_ratio",
                  "score"):
            rec[k] = float(getattr(self, k))
        if self.kind == "cpu":
            rec.update({k: getattr(self, k) for k in _CPU_STATS})
            rec.update({k: float(getattr(self, k)) for k in _RATIOS})
        return rec


# -- one tile ----------------------------------------------------------------------------------

def score(flat: FlatContraction, tile: Sequence[int], hw: HwModel, post_ops: int = 0,
          dtype: str = "float32", *, post_inputs: int = 0) -> Cost:
    """Score one tile.  `post_ops`: fused elementwise operations after the contraction;
    `post_inputs`: extra tensors those operations read (one element per output)."""
    tile = tuple(int(t) for t in tile)
    es = hw.elem_size(dtype)
    me = max(1, hw.mem_width // es)
    lay = layout(flat, tile, hw, dtype)
    out_s = flat.output.strides
    outs = lay.out_order

    points = 1
    all_tiles = 1
    all_threads = 1
    for r, t in zip(flat.ranges, tile, strict=True):
        points *= r
        all_tiles *= -(-r // t)
        all_threads *= t
    wg = 1
    out_max = 1
    regs = 1
    mw_count = 1
    for k in outs:
        wg *= lay.groups[k]
        out_max *= tile[k]
        regs *= -(-tile[k] // lay.threads[k])
        mw_count *= -(-tile[k] // me) if out_s[k] == 1 else tile[k]
    to = points * (post_ops + 2)
    il = all_tiles // wg
    op = min(hw.threads, all_threads)
    rp = 0
    grown = out_max
    while grown < op:
        rp += 1
        grown *= 2
    tu = max(op, lay.output_threads)
    or_ = hw.threads * regs * es
    mw = mw_count * hw.mem_width
    mr = sum(i.loads for i in lay.inputs) * hw.mem_width + post_inputs * mw_count * es
    base = dict(names=tuple(flat.names), tile=tile, hw=hw.name, kind=hw.kind, to=to, wg=wg,
                il=il, or_=or_, mr=mr, mw=mw, op=op, rp=rp, tu=tu)

    if hw.kind == "cpu":
        return _score_cpu(flat, hw, lay, base, points, es, me, post_inputs)

    sm = (hw.threads * es if out_max < op else 0)
    if lay.staging == "local":
        kv = _vector_index(flat, hw)
        for t, plan in zip(flat.inputs, lay.inputs, strict=True):
            elems = 1
            for m in plan.indices:
                elems *= m.range
            once = out_max < op and elems >= all_threads and (
                kv is None or t.strides[kv] in (0, 1))
            sm += 0 if once else plan.local_size_elems * es
    if sm > hw.max_mem:
        return Cost(status="over memory", sm=sm, **base)
    if or_ > hw.max_regs:
        return Cost(status="over regs", sm=sm, **base)
    fpb, occ, roof_r, occ_r, thr_r, sc = _ratios(to, float(wg * (il * mr + mw)), wg, tu, hw)
    return Cost(status="ok", sm=sm, flops_per_byte=float(fpb), occupancy=float(occ),
                roof_ratio=float(roof_r), occ_ratio=float(occ_r), thread_ratio=float(thr_r),
                score=float(sc), **base)


def _ratios(to: Any, nbytes: Any, wg: Any, tu: Any, hw: HwModel) -> tuple:
    """PlaidML's ratios; works on numbers and on arrays, with the same float operations."""
    goal = hw.goal_flops_per_byte
    fpb = to / nbytes
    occupancy = np.minimum(wg, hw.goal_groups) * 1.0
    roof_ratio = np.minimum(fpb, goal) / goal
    occ_ratio = occupancy / hw.goal_groups
    thread_ratio = tu / hw.threads
    score_ = roof_ratio * occ_ratio * thread_ratio
    return fpb, occupancy, roof_ratio, occ_ratio, thread_ratio, score_


def cpu_consts(flat: FlatContraction, hw: HwModel, es: int, me: int) -> dict[str, Any]:
    """Per-input facts that do not depend on the tile."""
    full = [read_plan(flat.names, t, flat.ranges, me) for t in flat.inputs]
    sizes = []
    for plan in full:
        n = 1
        for m in plan.indices:
            n *= m.range
        sizes.append(n * es)
    out_size = 1
    for k in output_order(flat):
        out_size *= flat.ranges[k]
    l1 = hw.max_mem if hw.max_mem > 0 else hw.l1_bytes
    # Vectors run along the index the code generator picks (`schedule.vector_candidates`): the
    # output's unit-stride index, or a reduction index read contiguously by every input (then
    # each accumulator is a vector whose lanes are summed at the end: "dot" mode).
    cands = vector_candidates(flat, cpu=hw.kind == "cpu", lanes=hw.vec_size)
    u = cands[0] if cands and hw.vec_size > 1 else None
    # A CPU tile the range leaves over moves back (`Schedule.shift`): its lanes need not
    # divide the range.
    shift = u is not None and moves_back(flat, u, hw.kind == "cpu")
    return dict(sizes=sizes, out_bytes=out_size * es, l1=l1, l2h=hw.l2_bytes // 2,
                u=u, v=max(1, hw.vec_size), dot=u is not None and u in flat.reduce_indices,
                shift=shift)


def vector_lanes(tile_u: Any, range_u: int, v: int, shift: bool = False) -> Any:
    """Lanes the generated code uses: the largest power of two <= v dividing the tile, and
    the range too unless the tile is shorter and moves back at the end (`shift`)."""
    tile_u = np.asarray(tile_u)
    low = np.bitwise_and(tile_u, -tile_u)
    capped = np.minimum(low, range_u & -range_u)
    if shift:
        capped = np.where(tile_u < range_u, low, capped)
    return np.minimum(capped, v)


def vector_reads(t, u: int | None) -> int:
    """Vector reads per vector of input t's lanes along vector index u on CPUs: 1 for a
    unit stride, 2 for stride 2 (two reads and a shuffle: `clexpr.load_pairs`), 0 where
    each lane is read on its own (or the value is broadcast)."""
    if u is None:
        return 0
    return {1: 1, 2: 2}.get(abs(t.strides[u]), 0)


def live_vregs(acc_vregs: Any, ops: list[Any]) -> Any:
    """Vector registers a reduction step holds: the accumulators, every input's values but
    the largest set's, which is streamed through one register (each of its values meets
    the others' in its multiply-adds, then dies), as BLAS register tiles count them (6x16 on
    16 AVX2 registers: 12 accumulators, 2 B vectors, 1 broadcast A value)."""
    kept = sum(ops) - functools.reduce(np.maximum, ops) if ops else 0
    return acc_vregs + kept + 1


def _score_cpu(flat: FlatContraction, hw: HwModel, lay: Any, base: dict, points: int,
               es: int, me: int, post_inputs: int) -> Cost:
    c = cpu_consts(flat, hw, es, me)
    u, vmax, dot = c["u"], c["v"], c["dot"]
    v = int(vector_lanes(lay.tile[u], flat.ranges[u], vmax, c["shift"])) if u is not None \
        else 1
    outs = lay.out_order
    acc = {k: -(-lay.tile[k] // lay.threads[k]) for k in outs}
    acc_vregs = 1
    for k in outs:
        acc_vregs *= -(-acc[k] // v) if k == u else acc[k]
    ops, loads = [], 0
    for t in flat.inputs:
        n = 1
        reads = vector_reads(t, u)
        for k in outs:
            s = t.strides[k]
            if s == 0:
                continue
            n *= (-(-acc[k] // v) if reads else acc[k]) if k == u else acc[k]
        ops.append(n)
        loads += n * max(1, reads)
    vregs = int(live_vregs(acc_vregs, ops))
    streams = 0
    for t in flat.inputs:
        live = [k for k in outs if t.strides[k] != 0]
        low = min(live, key=lambda k: abs(t.strides[k]), default=None)
        n = 1
        for k in live:
            n *= acc[k] if k != low else 1
        streams += n - 1
    red = 1
    for k in flat.reduce_indices:
        red *= lay.tile[k]
    if dot:
        red //= v
    wg, il, mr, mw = base["wg"], base["il"], base["mr"], base["mw"]
    step = max(acc_vregs / FMA_PORTS, loads / LOAD_PORTS, float(FMA_LATENCY)) \
        + LOAD_ISSUE * loads + STREAM_CYCLES * streams
    item = il * red * step + il * CHUNK_CYCLES + TILE_CYCLES
    compute = points / (vmax * FMA_PORTS) / (wg * hw.threads * item)
    cache = min(1.0, c["l1"] / mr) if mr > 0 else 1.0

    f = lay.group_order[0] if lay.group_order else None
    gf = lay.groups[f] if f is not None else 1
    l2b = wg * mw + post_inputs * wg * (mw // hw.mem_width) * es
    dram = c["out_bytes"] * (1 + post_inputs)
    T = np.array([lay.tile], np.int64)
    _, swept = sweep_many(flat, T, hw, vec_index=u, lanes=np.array([v]),
                          acc=np.array([acc_vregs]), es=es, groups=np.array([wg]))
    reuse = int(sweep_reuse(flat, T, swept, lanes=np.array([v]), acc=np.array([acc_vregs]),
                            es=es, l1_bytes=hw.l1_bytes)[0])
    big = int(largest_panel(flat, T)[0][0])
    l2s, drs = l2b, dram
    for i, (t, plan, size) in enumerate(zip(flat.inputs, lay.inputs, c["sizes"], strict=True)):
        panel = il * plan.loads * hw.mem_width
        fresh = wg if (f is None or t.strides[f] != 0) else wg // gf
        again = wg - fresh
        once = reuse if i == big else 1  # as in `_many_cpu`
        l2 = fresh * panel + (again * panel if panel > c["l1"] else 0)
        l2b, l2s = l2b + l2, l2s + l2 // once
        dram += (size if size <= c["l2h"] else fresh * panel) + (
            again * panel if panel > c["l2h"] else 0)
        drs += (size if size <= c["l2h"] else fresh * panel // once) + (
            again * panel // once if panel > c["l2h"] else 0)

    base = dict(base, vregs=vregs, l2_bytes=l2s, dram_bytes=drs, sweep=int(swept[0]))
    if (hw.registers > 0 and vregs > hw.registers) or base["or_"] > hw.max_regs:
        return Cost(status="over regs", sm=0, **base)
    fpb, occ, roof_r, occ_r, thr_r, sc = _ratios(base["to"], float(dram), wg, base["tu"], hw)
    l2_goal = 2.0 * FMA_PORTS * vmax / hw.mem_width
    l2_ratio = min(2.0 * points / l2b, l2_goal) / l2_goal
    sc = compute * cache * l2_ratio * sc
    return Cost(status="ok", sm=0, flops_per_byte=float(fpb), occupancy=float(occ),
                roof_ratio=float(roof_r), occ_ratio=float(occ_r), thread_ratio=float(thr_r),
                score=float(sc), compute_ratio=float(compute), cache_ratio=float(cache),
                l2_ratio=float(l2_ratio), **base)


def _vector_index(flat: FlatContraction, hw: HwModel) -> int | None:
    """The index a split kernel's vectors likely run along: the first along which every
    input is contiguous (`schedule.vector_candidates` unstaged).  The schedule may choose
    otherwise and stage an input this guesses it reads through the cache; the exact
    predictions check the schedule's own staging (`predict`)."""
    cands = vector_candidates(flat, cpu=hw.kind == "cpu", lanes=hw.vec_size) \
        if hw.vec_size > 1 else []
    return cands[0] if cands else None


# -- many tiles at once ------------------------------------------------------------------------

def score_many(flat: FlatContraction, tiles: np.ndarray, hw: HwModel, post_ops: int = 0,
               dtype: str = "float32", *, post_inputs: int = 0) -> dict[str, np.ndarray]:
    """`score` for every row of `tiles` (n x len(names)), as arrays keyed by statistic name
    ("or" for or_; "status" holds an index into STATUS_TEXT)."""
    T = np.ascontiguousarray(tiles, dtype=np.int64)
    n, k = T.shape
    es = hw.elem_size(dtype)
    me = max(1, hw.mem_width // es)
    R = np.asarray(flat.ranges, dtype=np.int64)
    outs = output_order(flat)
    out_s = flat.output.strides
    G = -(-R // T)
    points = int(np.prod(R)) if k else 1
    wg = np.prod(G[:, outs], axis=1) if outs else np.ones(n, np.int64)
    il = np.prod(G, axis=1) // wg
    op = np.minimum(hw.threads, np.prod(T, axis=1))
    out_max = np.prod(T[:, outs], axis=1) if outs else np.ones(n, np.int64)
    rp = np.zeros(n, np.int64)
    grown = out_max.copy()
    while (grown < op).any():
        lt = grown < op
        rp += lt
        grown = np.where(lt, grown * 2, grown)

    thr = _on_unique(T, outs, lambda sub: thread_split(flat, _spread(sub, outs, k), hw.threads,
                                                       me)[:, outs])
    A = -(-T[:, outs] // thr) if outs else np.ones((n, 0), np.int64)
    tu = np.maximum(op, np.prod(thr, axis=1))
    or_ = hw.threads * np.prod(A, axis=1) * es
    mw_count = np.ones(n, np.int64)
    for kk in outs:
        mw_count *= -(-T[:, kk] // me) if out_s[kk] == 1 else T[:, kk]
    mw = mw_count * hw.mem_width
    loads = []
    local = np.zeros(n, np.int64)
    # On GPUs a split kernel reads an input it reads once a point through the cache
    # (`schedule.read_once`): not in local memory, and what other groups read of it again
    # is L2 traffic (`reread`, bytes).
    gpu = hw.kind != "cpu"
    split = out_max < op
    tile_points = np.prod(T, axis=1)
    kv = _vector_index(flat, hw) if gpu else None
    reread = np.zeros(n, np.int64)
    for t in flat.inputs:
        cols = [c for c in range(k) if t.strides[c] != 0]
        got = _on_unique(T, cols, lambda sub, t=t, cols=cols: np.stack(
            merge_stats(t, _spread(sub, cols, k), me), axis=1))
        loads.append(got[:, 0])
        if not gpu:
            continue
        once = split & (got[:, 2] >= tile_points) & (kv is None or t.strides[kv] in (0, 1))
        local += np.where(once, 0, got[:, 1])
        full = int(np.prod([flat.ranges[c] for c in cols])) if cols else 1
        reread += np.where(once, np.maximum(0, wg * il * got[:, 2] - full) * es, 0)
    mr = sum(loads, np.zeros(n, np.int64)) * hw.mem_width + post_inputs * mw_count * es
    to = np.full(n, points * (post_ops + 2), np.int64)
    res: dict[str, np.ndarray] = dict(to=to, wg=wg, il=il, mr=mr, mw=mw, op=op, rp=rp, tu=tu)
    res["or"] = or_

    if hw.kind == "cpu":
        return _many_cpu(flat, hw, T, A, outs, res, G, loads, points, es, me, post_inputs)

    sm = (local * es if hw.staging == "local" else np.zeros(n, np.int64)) + np.where(
        out_max < op, hw.threads * es, 0)
    status = np.where(sm > hw.max_mem, 1, np.where(or_ > hw.max_regs, 2, 0))
    fpb, occ, roof_r, occ_r, thr_r, sc = _ratios(to, (wg * (il * mr + mw)).astype(np.float64),
                                                 wg, tu, hw)
    res.update(sm=sm, status=status, reread=reread)
    _finish(res, status, flops_per_byte=fpb, occupancy=occ, roof_ratio=roof_r,
            occ_ratio=occ_r, thread_ratio=thr_r, score=sc)
    return res


def input_streams(flat: FlatContraction, t, outs: list[int], A: np.ndarray) -> np.ndarray:
    """Extra address streams input t opens a reduction step, per row: one per accumulator
    point along each output index it reads, but its lowest-stride one (that one is a run)."""
    live = [j for j, k in enumerate(outs) if t.strides[k] != 0]
    low = min(live, key=lambda j: abs(t.strides[outs[j]]), default=None)
    o = np.ones(A.shape[0], np.int64)
    for j in live:
        if j != low:
            o = o * A[:, j]
    return o - 1


def _many_cpu(flat: FlatContraction, hw: HwModel, T: np.ndarray, A: np.ndarray,
              outs: list[int], res: dict, G: np.ndarray, loads: list[np.ndarray], points: int,
              es: int, me: int, post_inputs: int) -> dict[str, np.ndarray]:
    c = cpu_consts(flat, hw, es, me)
    u, vmax, dot = c["u"], c["v"], c["dot"]
    n = T.shape[0]
    v = vector_lanes(T[:, u], flat.ranges[u], vmax, c["shift"]) if u is not None \
        else np.ones(n, np.int64)
    vecs = {j: (-(-A[:, j] // v) if kk == u else A[:, j]) for j, kk in enumerate(outs)}
    acc_vregs = np.ones(n, np.int64)
    for j in vecs:
        acc_vregs = acc_vregs * vecs[j]
    ops, nld = [], np.zeros(n, np.int64)
    for t in flat.inputs:
        o = np.ones(n, np.int64)
        reads = vector_reads(t, u)
        for j, kk in enumerate(outs):
            s = t.strides[kk]
            if s != 0:
                o = o * (vecs[j] if (kk == u and reads) else A[:, j])
        ops.append(o)
        nld = nld + o * max(1, reads)
    vregs = live_vregs(acc_vregs, ops)
    streams = sum((input_streams(flat, t, outs, A) for t in flat.inputs),
                  np.zeros(n, np.int64))
    red = np.prod(T[:, list(flat.reduce_indices)], axis=1) if flat.reduce_indices else 1
    if dot:
        red = red // v
    wg, il, mr, mw = res["wg"], res["il"], res["mr"], res["mw"]
    step = np.maximum(np.maximum(acc_vregs / FMA_PORTS, nld / LOAD_PORTS), float(FMA_LATENCY)) \
        + LOAD_ISSUE * nld + STREAM_CYCLES * streams
    item = il * red * step + il * CHUNK_CYCLES + TILE_CYCLES
    compute = points / (vmax * FMA_PORTS) / (wg * hw.threads * item)
    cache = np.where(mr > 0, np.minimum(1.0, c["l1"] / np.maximum(mr, 1)), 1.0)

    # The fastest-varying group index: the first output index (by stride) with several groups.
    Go = G[:, outs] if outs else np.ones((n, 1), np.int64)
    several = Go > 1
    has_f = several.any(axis=1)
    fpos = np.argmax(several, axis=1)
    gf = np.where(has_f, Go[np.arange(n), fpos], 1)
    l2b = wg * mw + post_inputs * wg * (mw // hw.mem_width) * es
    dram = np.full(n, c["out_bytes"] * (1 + post_inputs), np.int64)
    # The kernel's own traffic (l2s, drs) counts its sweep; the score keeps PlaidML's plan,
    # one tile a work-item (its ranking is what `--model plaidml` means).
    _, swept = sweep_many(flat, T, hw, vec_index=u, lanes=v, acc=acc_vregs, es=es, groups=wg)
    reuse = sweep_reuse(flat, T, swept, lanes=v, acc=acc_vregs, es=es, l1_bytes=hw.l1_bytes)
    big, _ = largest_panel(flat, T)
    l2s, drs = l2b, dram
    for i, (t, ld, size) in enumerate(zip(flat.inputs, loads, c["sizes"], strict=True)):
        panel = il * ld * hw.mem_width
        dep = np.array([t.strides[kk] != 0 for kk in outs] or [True])
        fresh = np.where(~has_f | dep[fpos], wg, wg // gf)
        again = wg - fresh
        # A swept work-item reads its panel of the largest input once for all its tiles.
        once = np.where(big == i, reuse, 1)
        l2 = fresh * panel + np.where(panel > c["l1"], again * panel, 0)
        dr = (size if size <= c["l2h"] else fresh * panel) + np.where(
            panel > c["l2h"], again * panel, 0)
        l2b, dram = l2b + l2, dram + dr
        l2s, drs = l2s + l2 // once, drs + (size if size <= c["l2h"] else fresh * panel // once) \
            + np.where(panel > c["l2h"], again * panel // once, 0)

    status = np.where((hw.registers > 0) & (vregs > hw.registers) | (res["or"] > hw.max_regs),
                      2, 0)
    fpb, occ, roof_r, occ_r, thr_r, sc = _ratios(res["to"], dram.astype(np.float64), wg,
                                                 res["tu"], hw)
    l2_goal = 2.0 * FMA_PORTS * vmax / hw.mem_width
    l2_ratio = np.minimum(2.0 * points / l2b, l2_goal) / l2_goal
    sc = compute * cache * l2_ratio * sc
    res.update(sm=np.zeros(n, np.int64), status=status, vregs=vregs, l2_bytes=l2s,
               dram_bytes=drs, sweep=swept)
    _finish(res, status, flops_per_byte=fpb, occupancy=occ, roof_ratio=roof_r,
            occ_ratio=occ_r, thread_ratio=thr_r, score=sc, compute_ratio=compute,
            cache_ratio=cache, l2_ratio=l2_ratio)
    return res


def _finish(res: dict, status: np.ndarray, **ratios: np.ndarray) -> None:
    """Rejected tiles get score -1 and ratios 0 (1 for the CPU-only ones), as `score` does."""
    bad = status != 0
    for key, val in ratios.items():
        fill = -1.0 if key == "score" else (1.0 if key in _RATIOS else 0.0)
        res[key] = np.where(bad, fill, np.asarray(val, dtype=np.float64))


def _spread(sub: np.ndarray, cols: list[int], k: int) -> np.ndarray:
    """Put the columns `cols` back at their places in an n x k tile array (others 1)."""
    full = np.ones((sub.shape[0], k), np.int64)
    full[:, cols] = sub
    return full


def _on_unique(T: np.ndarray, cols: list[int], fn: Any) -> np.ndarray:
    """fn over the distinct rows of T[:, cols], mapped back to every row.

    The read plan of an input and the thread split depend on a few columns only; a search's
    candidates repeat those sub-tiles many times, so computing each once is most of the speed.
    """
    n = T.shape[0]
    if not cols:
        out = fn(np.ones((1, 0), np.int64))
        return np.repeat(out, n, axis=0)
    sub = T[:, cols]
    radix = sub.max(axis=0) + 1
    bound = 1.0
    for j in range(len(cols)):
        bound *= np.count_nonzero(np.bincount(sub[:, j]))
    if bound * 2 > n:  # few repeats: sorting would cost more than it saves
        return fn(sub)
    if float(np.prod(radix.astype(np.float64))) < 2.0**62:
        key = np.zeros(n, np.int64)
        for j in range(len(cols)):
            key = key * radix[j] + sub[:, j]
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
        uniq = sub[first]
    else:
        uniq, inv = np.unique(sub, axis=0, return_inverse=True)
    return fn(uniq)[inv.reshape(-1)]


def cost_from_many(flat: FlatContraction, hw: HwModel, tiles: np.ndarray,
                   stats: dict[str, np.ndarray], i: int) -> Cost:
    """Row i of `score_many`'s result as a Cost (tests compare it with `score`)."""
    vals: dict[str, Any] = {}
    for f in fields(Cost):
        key = "or" if f.name == "or_" else f.name
        if key in stats:
            x = stats[key][i]
            vals[f.name] = float(x) if f.type == "float" else int(x)
    vals["status"] = STATUS_TEXT[int(stats["status"][i])]
    return Cost(names=tuple(flat.names), tile=tuple(int(t) for t in tiles[i]), hw=hw.name,
                kind=hw.kind, **vals)
