"""The tile space of one contraction: enumerating candidate tiles and ranking them.

`ranked_tiles` scores every tile (or, past `search.LIMIT`, climbs a beam from the all-1 tile),
keeps the best by the ranking in `search`'s docstring and, with the time model, predicts the
best POOL of them exactly (the approximate first pass splits threads as PlaidML's layout
does, the exact one as the schedule will) and ranks them again.  On GPUs it also predicts
exactly, for each reduction tile, the output tile the approximate pass likes best (the
spread, `_exhaustive`), taken where clearly faster than the pool's best."""

from __future__ import annotations

import itertools

import numpy as np

from .cost import score_many
from .flat import FlatContraction
from .predict import predict_many


def pow2_candidates(r: int) -> list[int]:
    """Powers of two up to r, and r."""
    out = {r}
    p = 1
    while p <= r:
        out.add(p)
        p *= 2
    return sorted(out)


def candidates(r: int) -> list[int]:
    """Powers of two up to r, the divisors of r, and r."""
    out = set(pow2_candidates(r))
    d = 1
    while d * d <= r:
        if r % d == 0:
            out.add(d)
            out.add(r // d)
        d += 1
    return sorted(out)


# Register-tile sides besides the powers of two and divisors, for the output indices of a CPU
# convolution (a sum of products over a sliding window): 16 vector registers fit 12
# accumulators as 3, 6 or 12 points by 4, 2 or 1 vectors where powers of two stop at 8,
# whether or not the side divides the range (the last tile moves back, `Schedule.shift`).
# Measured on a Zen 3 (PyPI PoCL 3.0): the seed conv at N=1 56x56, 4 vectors by 3 points
# 1.60-1.84 ms against 2.05 for the best tile of powers of two; resnet18 at batch 1 6-10%
# faster, its 3x3 layers 5-15% at their minimums.  Where they do not pay (BENCHMARKS.md):
# * sums without a sliding window (`slides`: matrix products, 1x1 convolutions): the 6x16
#   matmul tile ran 7-24% slower than 4x16 on the 2048 matmul, squeezenet's classifier 7%
#   slower, on the Zen 3 (why the windowed sums gain and these do not was not found out);
# * more than CPU_SIDE_ACC accumulator vectors: on a 16-core Xeon (AVX-512, Debian PoCL 5.0)
#   24 (6 points by 4 vectors) ran 10-16% slower than 16 (resnet18's 7x7 stem, the 2048 matmul,
#   the seed conv), which already keep the two FMA pipes busy;
# * tiles that cover much more than the range: squeezenet's 13-wide 3x3 layers in tiles of 5
#   (15 columns computed for 13) ran 7-20% slower than in one 13-wide tile;
# * one-input reductions (pools): a 3-wide max pool ran slower than a 2-wide one (`search`).
CPU_SIDES = (3, 5, 6, 12)
CPU_SIDE_ACC = 16  # accumulator vectors of a tile with such a side, at most
CPU_SIDE_WASTE = 0.10  # points computed twice, at most, as a share of the range


def slides(flat: FlatContraction) -> bool:
    """Whether an input reads a sliding window: an output index and a reduction index along
    overlapping spans of one axis (a convolution's x + i, strided 2*x + i or not), where
    neighbouring output points read some of the same elements.  A matrix product's m and k
    do not overlap (m steps over all of k's span), nor do a dilated window's points."""
    for t in flat.inputs:
        for o in flat.out_indices:
            so = abs(t.strides[o])
            for r in flat.reduce_indices:
                sr = abs(t.strides[r])
                if so and sr and flat.ranges[r] > 1 and so % sr == 0 and \
                        so < sr * flat.ranges[r]:
                    return True
    return False


def cpu_candidates(r: int) -> list[int]:
    """`candidates(r)` and the register-tile sides `CPU_SIDES` below r whose tiles cover at
    most CPU_SIDE_WASTE more than r (the last tile moves back over points already done)."""
    return sorted(set(candidates(r)) | {
        s for s in CPU_SIDES if s < r and -(-r // s) * s <= (1 + CPU_SIDE_WASTE) * r})


POOL = 64
# How much faster (predicted) a spread tile must be than the pool's best to be taken.
SPREAD_MARGIN = 0.05
CHUNK = 1 << 18
# Tiles from which output tiles over the registers are dropped first (`_within_registers`):
# below it the extra scoring costs more (about a millisecond) than it saves (2-3 us a tile).
PREFILTER_TILES = 2048
BEAM = 64


def ranked_tiles(cands: list[list[int]], top_k: int, es: int, args: tuple,
                  strategy: str, by_score: list | None = None) -> tuple[np.ndarray, list[int]]:
    """The best top_k tiles by the args' ranking.  The time model's first pass is approximate
    (`predict_many(exact=False)`): a wider pool of its best tiles is predicted exactly and
    ranked again.  `by_score` (a list, timed exhaustive searches): receives the top_k by
    PlaidML's score of the same tiles, which an untimed search would return, so that a
    search that cannot trust the times (`search`) need not score every tile again."""
    timed = args[-1]
    pool = max(top_k, POOL) if timed else top_k
    spread = np.zeros((0, len(cands)), np.int64)
    if strategy == "beam":
        best, tally = _beam(cands, pool, args)
    else:
        best, tally, spread, scored = _exhaustive(
            cands, pool, es, args, score_k=top_k if by_score is not None else 0)
        if by_score is not None:
            by_score[:] = [scored, list(tally)]
    if timed and best.shape[0]:
        best = _exact_order(best, _new_rows(spread, best), args)[:top_k]
    return best, tally


def _new_rows(rows: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """The rows of `rows` that are not in `seen`."""
    have = {tuple(r) for r in seen.tolist()}
    keep = [i for i, r in enumerate(rows.tolist()) if tuple(r) not in have]
    return rows[keep]


def count(cands: list[list[int]]) -> int:
    n = 1
    for c in cands:
        n *= len(c)
    return n


def _product(lists: list[list[int]]) -> np.ndarray:
    if not lists:
        return np.ones((1, 0), np.int64)
    grids = np.meshgrid(*[np.asarray(c, np.int64) for c in lists], indexing="ij")
    return np.stack([g.reshape(-1) for g in grids], axis=1)


def _exhaustive(cands: list[list[int]], top_k: int, es: int, args: tuple, score_k: int = 0
                ) -> tuple[np.ndarray, list[int], np.ndarray, np.ndarray]:
    """The top_k tiles, the tally, on a GPU with the time model the spread: for each
    reduction tile, the output tile with the least approximate time, and the score_k best by
    PlaidML's score alone (the ranking without "time", as an untimed search ranks; none
    where score_k is 0).  The approximate pass
    misjudges some reduction-tile shapes as a whole (it splits threads as PlaidML's layout
    does): at N=1 224x224 the seed convolution's tiles with a 3x1 window tile were all
    outside its top 64 though predicted 30% faster exactly, and ran 18% faster on the H200;
    the spread has them predicted exactly too."""
    flat, hw = args[0], args[1]
    k = len(cands)
    outs = list(flat.out_indices)
    reds = list(flat.reduce_indices)
    out_rows = _product([cands[i] for i in outs])
    red_rows = _product([cands[i] for i in reds])
    acc = np.prod(out_rows, axis=1)
    keep = acc * es <= hw.max_regs
    if hw.kind == "cpu" and hw.threads == 1 and hw.registers > 0:
        keep &= acc <= (hw.registers - 1) * max(1, hw.vec_size)
    # A register-tile side (`CPU_SIDES`) only up to CPU_SIDE_ACC accumulator vectors.
    sides = {j: sorted(set(cands[o]) - set(candidates(flat.ranges[o])))
             for j, o in enumerate(outs)} if hw.kind == "cpu" else {}
    if any(sides.values()):
        extra = np.zeros(out_rows.shape[0], bool)
        for j, s in sides.items():
            extra |= np.isin(out_rows[:, j], s)
        keep &= ~extra | (acc <= CPU_SIDE_ACC * max(1, hw.vec_size))
    pruned = int((~keep).sum()) * red_rows.shape[0]
    out_rows = out_rows[keep]
    tally = [0, 0, 0, pruned]
    if hw.kind == "cpu" and out_rows.shape[0] * red_rows.shape[0] >= PREFILTER_TILES:
        out_rows = _within_registers(out_rows, outs, red_rows.shape[0], k, args, tally)
    best = np.zeros((0, k), np.int64)
    best_stats: dict[str, np.ndarray] = {}
    scored, scored_stats = best, best_stats  # (`score_k`)
    per = max(1, CHUNK // max(1, red_rows.shape[0]))
    nr = red_rows.shape[0]
    spread_t = np.full(nr, np.inf)
    spread = np.ones((nr, k), np.int64)
    for lo in range(0, out_rows.shape[0], per):
        block = out_rows[lo:lo + per]
        tiles = np.ones((block.shape[0] * nr, k), np.int64)
        tiles[:, outs] = np.repeat(block, nr, axis=0)
        tiles[:, reds] = np.tile(red_rows, (block.shape[0], 1))
        stats = _stats(tiles, args)
        _tally(stats, tally)
        if args[-1] and hw.kind == "gpu" and k and tiles.shape[0]:
            t = np.where(stats["status"] == 0, stats["time"], np.inf).reshape(-1, nr)
            at = t.argmin(axis=0)
            lower = t[at, np.arange(nr)] < spread_t
            spread_t = np.where(lower, t[at, np.arange(nr)], spread_t)
            spread[lower] = tiles.reshape(-1, nr, k)[at[lower], np.flatnonzero(lower)]
        best, best_stats = _merge_best(tiles, best, best_stats, top_k, tally, args,
                                       stats=stats)
        if score_k:
            plain = {key: v for key, v in stats.items() if key != "time"}
            scored, scored_stats = _merge_best(tiles, scored, scored_stats, score_k, tally,
                                               args, stats=plain)
    return best, tally, spread[np.isfinite(spread_t)], scored


def _within_registers(out_rows: np.ndarray, outs: list[int], reductions: int, k: int,
                      args: tuple, tally: list[int]) -> np.ndarray:
    """The output tiles whose tiles fit the registers, scored once each (reduction sides 1);
    the others' tiles are counted as scored and over registers, as scoring each would.  On a
    CPU what a tile holds in registers (its accumulators, the vectors its inputs load a
    step, `cost_cpu.live_vregs`) and its thread split depend on its output sides alone,
    and half of a model's convolution tiles are over: resnet50's 3x3 layers scored 40-100k
    tiles each, 2.6 us a tile, half of them to be rejected."""
    flat, hw, post_ops, dtype, post_inputs, _ = args
    probe = np.ones((out_rows.shape[0], k), np.int64)
    probe[:, outs] = out_rows
    over = score_many(flat, probe, hw, post_ops, dtype, post_inputs=post_inputs)["status"] == 2
    rejected = int(over.sum()) * reductions
    tally[0] += rejected
    tally[2] += rejected
    return out_rows[~over]


def _beam(cands: list[list[int]], top_k: int, args: tuple) -> tuple[np.ndarray, list[int]]:
    k = len(cands)
    nxt = [dict(itertools.pairwise(c)) for c in cands]
    frontier = np.ones((1, k), np.int64)
    seen = {tuple(frontier[0])}
    tally = [0, 0, 0, 0]
    best = np.zeros((0, k), np.int64)
    best_stats: dict[str, np.ndarray] = {}
    first = True
    while frontier.shape[0]:
        if first:
            new = frontier
            first = False
        else:
            grown = []
            for row in frontier.tolist():
                for i in range(k):
                    up = nxt[i].get(row[i])
                    if up is None:
                        continue
                    t = tuple(row[:i] + [up] + row[i + 1:])
                    if t not in seen:
                        seen.add(t)
                        grown.append(t)
            if not grown:
                break
            new = np.asarray(grown, np.int64)
        stats = _stats(new, args)
        _tally(stats, tally)
        ok = stats["status"] == 0
        if ok.any():
            frontier = new[ok][_ranked(new[ok], _sub(stats, ok))[:BEAM]]
        else:
            # A rejected tile can have valid descendants (the reduction scratch of the all-1
            # tile goes away once the output tile covers the threads), so climb on from some.
            frontier = new[:BEAM]
        best, best_stats = _merge_best(new, best, best_stats, top_k, [0, 0, 0, 0], args,
                                       stats=stats)
    return best, tally


def _tally(stats: dict[str, np.ndarray], tally: list[int]) -> None:
    tally[0] += stats["status"].shape[0]
    tally[1] += int((stats["status"] == 1).sum())
    tally[2] += int((stats["status"] == 2).sum())


def _merge_best(tiles: np.ndarray, best: np.ndarray, best_stats: dict[str, np.ndarray],
                top_k: int, tally: list[int], args: tuple,
                stats: dict[str, np.ndarray] | None = None) -> tuple[np.ndarray, dict]:
    """Score `tiles` (unless `stats` are given) and keep the top_k of them and `best`."""
    if stats is None:
        stats = _stats(tiles, args)
        _tally(stats, tally)
    ok = stats["status"] == 0
    if ok.any():
        # Only tiles that can still reach the top need the full tie-break.
        if ok.sum() > top_k:
            if "time" in stats:
                cut = np.partition(stats["time"][ok], top_k - 1)[top_k - 1]
                ok &= stats["time"] <= cut
            else:
                sc = stats["score"]
                cut = np.partition(sc[ok], -top_k)[-top_k]
                ok &= sc >= cut
        tiles = np.concatenate([best, tiles[ok]])
        merged = {key: np.concatenate([best_stats.get(key, v[:0]), v[ok]])
                  for key, v in stats.items()}
    else:
        tiles, merged = best, best_stats
    if tiles.shape[0] == 0:
        return tiles, merged
    order = _ranked(tiles, merged)[:top_k]
    return tiles[order], {key: v[order] for key, v in merged.items()}


def _stats(tiles: np.ndarray, args: tuple, exact: bool = False) -> dict[str, np.ndarray]:
    """PlaidML's statistics of each tile and, with the time model, its predicted "time"."""
    flat, hw, post_ops, dtype, post_inputs, timed = args
    stats = score_many(flat, tiles, hw, post_ops, dtype, post_inputs=post_inputs)
    if timed:
        stats["time"] = predict_many(flat, tiles, hw, stats, dtype, exact=exact)["time"]
    return stats


def _exact_order(pool: np.ndarray, extra: np.ndarray, args: tuple) -> np.ndarray:
    """`pool` ranked again with exact predictions (rejected ones dropped), with the `extra`
    tiles (the spread) among them where the best of those is predicted SPREAD_MARGIN faster
    than the pool's best: a near tie is within what the model can tell apart (vgg11's 28x28
    convolutions: 0.3% predicted, slower on the H200)."""
    tiles = np.concatenate([pool, extra]) if extra.shape[0] else pool
    stats = _stats(tiles, args, exact=True)
    ok = stats["status"] == 0
    in_pool = np.arange(tiles.shape[0]) < pool.shape[0]
    times = np.where(ok, stats["time"], np.inf)
    pool_best, extra_best = times[in_pool].min(), times[~in_pool].min(initial=np.inf)
    if not (np.isfinite(pool_best) and extra_best < (1 - SPREAD_MARGIN) * pool_best):
        ok &= in_pool
    tiles, stats = tiles[ok], _sub(stats, ok)
    return tiles[_ranked(tiles, stats)]


def _sub(stats: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {key: v[mask] for key, v in stats.items()}


def _ranked(tiles: np.ndarray, stats: dict[str, np.ndarray]) -> np.ndarray:
    """Row order, best first (the ranking in the module docstring)."""
    if tiles.shape[0] == 0:
        return np.zeros(0, np.int64)
    l2 = stats.get("l2_bytes", np.zeros(tiles.shape[0], np.int64))
    keys = [tiles[:, j] for j in range(tiles.shape[1] - 1, -1, -1)]
    keys += [stats["or"], stats["sm"], stats["il"], stats["wg"], l2,
             -stats["flops_per_byte"], -stats["score"]]
    if "time" in stats:
        keys.append(stats["time"])
    return np.lexsort(keys)
