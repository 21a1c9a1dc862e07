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

CPU models (`kind = "cpu"`) are scored by `cost_cpu`: a register-tile cycle count and cache
traffic in place of the staging terms, the same statistics reported, plus the CPU line's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any

import numpy as np

from .cost_record import STATUS_TEXT, Cost, finish, ratios
from .flat import FlatContraction
from .layout import layout, merge_stats, output_order, thread_split
from .schedule import vector_candidates

if TYPE_CHECKING:
    from .hw import HwModel

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
        from .cost_cpu import score_cpu  # (it imports this module's Cost)
        return score_cpu(flat, hw, lay, base, points, es, me, post_inputs)

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
    fpb, occ, roof_r, occ_r, thr_r, sc = ratios(to, float(wg * (il * mr + mw)), wg, tu, hw)
    return Cost(status="ok", sm=sm, flops_per_byte=float(fpb), occupancy=float(occ),
                roof_ratio=float(roof_r), occ_ratio=float(occ_r), thread_ratio=float(thr_r),
                score=float(sc), **base)


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
    # Reads in the L2's sectors (`HwModel.sector_bytes`), for the time model's L2 term.
    ms = max(1, hw.sector_bytes // es) if gpu and hw.sector_bytes else 0
    sectors = np.zeros(n, np.int64)
    for t in flat.inputs:
        cols = [c for c in range(k) if t.strides[c] != 0]
        # (With the L2's sectors known, the same sub-tiles' reads in sectors too: column 3.)
        got = _on_unique(T, cols, lambda sub, t=t, cols=cols: np.stack(
            [*merge_stats(t, _spread(sub, cols, k), me)]
            + ([merge_stats(t, _spread(sub, cols, k), ms)[0]] if ms else []), axis=1))
        loads.append(got[:, 0])
        if not gpu:
            continue
        once = split & (got[:, 2] >= tile_points) & (kv is None or t.strides[kv] in (0, 1))
        local += np.where(once, 0, got[:, 1])
        if ms:
            sectors += np.where(once, 0, got[:, 3])
        full = int(np.prod([flat.ranges[c] for c in cols])) if cols else 1
        reread += np.where(once, np.maximum(0, wg * il * got[:, 2] - full) * es, 0)
    mr = sum(loads, np.zeros(n, np.int64)) * hw.mem_width + post_inputs * mw_count * es
    to = np.full(n, points * (post_ops + 2), np.int64)
    res: dict[str, np.ndarray] = dict(to=to, wg=wg, il=il, mr=mr, mw=mw, op=op, rp=rp, tu=tu)
    res["or"] = or_

    if hw.kind == "cpu":
        from .cost_cpu import many_cpu
        return many_cpu(flat, hw, T, A, outs, res, G, loads, points, es, me, post_inputs)

    sm = (local * es if hw.staging == "local" else np.zeros(n, np.int64)) + np.where(
        out_max < op, hw.threads * es, 0)
    status = np.where(sm > hw.max_mem, 1, np.where(or_ > hw.max_regs, 2, 0))
    fpb, occ, roof_r, occ_r, thr_r, sc = ratios(to, (wg * (il * mr + mw)).astype(np.float64),
                                                 wg, tu, hw)
    res.update(sm=sm, status=status, reread=reread)
    if ms:
        res["sectors"] = sectors * ms * es
    finish(res, status, flops_per_byte=fpb, occupancy=occ, roof_ratio=roof_r,
            occ_ratio=occ_r, thread_ratio=thr_r, score=sc)
    return res


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
