"""The CPU half of `cost`: one tile's (or many tiles') statistics on a CPU hardware model.

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
  Where the schedule sweeps the tile (`sweep.sweep_many`: a work-item runs several register
  tiles one reduction block at a time), the largest input's block is read from L2 once for all
  of them if it stays in L1 while each tile runs (`sweep.sweep_reuse`): the reported
  l2_bytes and dram_bytes, which the time model uses, count that; the score keeps PlaidML's
  one tile a work-item.  They also count once what a window's work-item shares with its
  neighbour along an output index (a stride-2 pool's shared column) where the work-items
  between the two read less than the cache holds (`overlap`: L1 for the L2 bytes, half of
  L2 for the DRAM bytes).
* occ_ratio and thread_ratio as on GPUs (goal_groups = groups that keep every core busy).

For a matmul on pocl-cpu (AVX2: 16 registers, v=8) this picks 4x16 register tiles (6x16 when
6 divides M) with a K chunk near 256 that keeps A and B chunks in L1."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from .cost_record import Cost, finish, ratios
from .flat import FlatContraction
from .layout import output_order, read_plan
from .overlap import reread_factors
from .schedule import moves_back, vector_candidates
from .sweep import largest_panel, sweep_many, sweep_reuse

if TYPE_CHECKING:
    from .hw import HwModel

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


@functools.lru_cache(maxsize=512)
def cpu_consts(flat: FlatContraction, hw: HwModel, es: int, me: int) -> dict[str, Any]:
    """Per-input facts that do not depend on the tile (kept for the search's many calls:
    read only)."""
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


def score_cpu(flat: FlatContraction, hw: HwModel, lay: Any, base: dict, points: int,
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
                          acc=np.array([acc_vregs]), es=es, groups=np.array([wg]),
                          fastest=np.array([-1 if f is None else f]))
    reuse = int(sweep_reuse(swept, chunk_bytes=np.array([mr]),
                            partial_bytes=np.array([acc_vregs * v * es]),
                            l1_bytes=hw.l1_bytes)[0])
    big = int(largest_panel(flat, T)[0][0])
    l2s, drs = l2b, dram
    G = np.array([lay.groups], np.int64)
    group_bytes = np.array([il * mr + mw], np.int64)
    for i, (t, plan, size) in enumerate(zip(flat.inputs, lay.inputs, c["sizes"], strict=True)):
        panel = il * plan.loads * hw.mem_width
        fresh = wg if (f is None or t.strides[f] != 0) else wg // gf
        again = wg - fresh
        once = reuse if i == big else 1  # as in `many_cpu`
        l2 = fresh * panel + (again * panel if panel > c["l1"] else 0)
        l2b += l2
        dram += (size if size <= c["l2h"] else fresh * panel) + (
            again * panel if panel > c["l2h"] else 0)
        new1, new2 = (float(a[0]) for a in reread_factors(
            flat, t, T, G, list(outs), group_bytes, (c["l1"], c["l2h"])))
        l2s += (int(fresh * panel * new1) + (again * panel if panel > c["l1"] else 0)) // once
        drs += (size if size <= c["l2h"] else int(fresh * panel * new2) // once) + (
            again * panel // once if panel > c["l2h"] else 0)

    base = dict(base, vregs=vregs, l2_bytes=l2s, dram_bytes=drs, sweep=int(swept[0]))
    if (hw.registers > 0 and vregs > hw.registers) or base["or_"] > hw.max_regs:
        return Cost(status="over regs", sm=0, **base)
    fpb, occ, roof_r, occ_r, thr_r, sc = ratios(base["to"], float(dram), wg, base["tu"], hw)
    l2_goal = 2.0 * FMA_PORTS * vmax / hw.mem_width
    l2_ratio = min(2.0 * points / l2b, l2_goal) / l2_goal
    sc = compute * cache * l2_ratio * sc
    return Cost(status="ok", sm=0, flops_per_byte=float(fpb), occupancy=float(occ),
                roof_ratio=float(roof_r), occ_ratio=float(occ_r), thread_ratio=float(thr_r),
                score=float(sc), compute_ratio=float(compute), cache_ratio=float(cache),
                l2_ratio=float(l2_ratio), **base)


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


def many_cpu(flat: FlatContraction, hw: HwModel, T: np.ndarray, A: np.ndarray,
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
    fastest = np.where(has_f, np.array(outs or [-1])[fpos], -1)
    panel = largest_panel(flat, T)
    big = panel[0]
    _, swept = sweep_many(flat, T, hw, vec_index=u, lanes=v, acc=acc_vregs, es=es, groups=wg,
                          fastest=fastest, panel=panel)
    reuse = sweep_reuse(swept, chunk_bytes=mr, partial_bytes=acc_vregs * v * es,
                        l1_bytes=hw.l1_bytes)
    l2s, drs = l2b, dram
    group_bytes = il * mr + mw
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
        # The kernel's own traffic leaves out what a neighbouring work-item's window read
        # and the cache still holds (`overlap`); PlaidML's score keeps its count.
        new1, new2 = reread_factors(flat, t, T, G, outs, group_bytes, (c["l1"], c["l2h"]))
        l2s = l2s + ((fresh * panel * new1).astype(np.int64)
                     + np.where(panel > c["l1"], again * panel, 0)) // once
        drs = drs + (size if size <= c["l2h"] else
                     (fresh * panel * new2).astype(np.int64) // once) \
            + np.where(panel > c["l2h"], again * panel // once, 0)

    status = np.where((hw.registers > 0) & (vregs > hw.registers) | (res["or"] > hw.max_regs),
                      2, 0)
    fpb, occ, roof_r, occ_r, thr_r, sc = ratios(res["to"], dram.astype(np.float64), wg,
                                                 res["tu"], hw)
    l2_goal = 2.0 * FMA_PORTS * vmax / hw.mem_width
    l2_ratio = np.minimum(2.0 * points / l2b, l2_goal) / l2_goal
    sc = compute * cache * l2_ratio * sc
    res.update(sm=np.zeros(n, np.int64), status=status, vregs=vregs, l2_bytes=l2s,
               dram_bytes=drs, sweep=swept)
    finish(res, status, flops_per_byte=fpb, occupancy=occ, roof_ratio=roof_r,
            occ_ratio=occ_r, thread_ratio=thr_r, score=sc, compute_ratio=compute,
            cache_ratio=cache, l2_ratio=l2_ratio)
    return res
