"""A search's top tiles ranked again with the compiler's register counts (`plan.registers`)."""

from __future__ import annotations

import numpy as np
import pytest

from tilec.plan.cost import score_many
from tilec.plan.hw import HwModel
from tilec.plan.predict import predict_many
from tilec.plan.registers import (
    MIN_SECONDS,
    QUERY_TILES,
    counted_enough,
    reranked,
    worth_counting,
)
from tilec.plan.search import search

from ..flats import matmul_flat, seed_flat

H100 = HwModel.load("nvidia-h100")


def test_counts_replace_the_estimate_in_whole_units() -> None:
    flat = seed_flat(32)
    tiles = np.asarray([[4, 64, 3, 3, 4, 8, 8]] * 3, np.int64)
    stats = score_many(flat, tiles, H100)
    pred = predict_many(flat, tiles, H100, stats, registers=np.array([0, 128, 147]))
    est = predict_many(flat, tiles, H100, stats)
    assert pred["regs"][0] == est["regs"][0]  # 0: not known, the estimate stays
    assert list(pred["regs"][1:]) == [128, 152]  # 147 is allocated as 152 (8 a work-item)
    # 256 threads of 128 registers: two groups an SM; of 152: one.
    assert list(pred["resident"][1:]) == [2, 1]
    assert pred["time"][2] > pred["time"][1]
    assert list(pred["compiled_regs"]) == [0, 128, 147]


def test_tiles_the_compiler_gives_more_registers_move_down() -> None:
    plan = search(seed_flat(32), H100, top_k=QUERY_TILES)
    assert worth_counting(plan)
    # The first half compiled to 255 registers, the rest to 128: the first is now from the
    # rest, and every kept prediction says it used the compiler's count.
    counts = [255 if i < len(plan.top) // 2 else 128 for i in range(len(plan.top))]
    again = reranked(plan, counts, keep=8)
    assert len(again.top) == 8
    assert again.tile in [t for t, _ in plan.top[len(plan.top) // 2:]]
    assert again.tile == again.top[0][0] and again.cost is again.top[0][1]
    times = [p for p, _ in again.predicted]
    assert times == sorted(times)
    assert all("registers as compiled" in line for _, line in again.predicted)
    assert "registers as compiled" in again.log_lines(0)[-1]


def test_unknown_counts_keep_the_search_order_and_predictions() -> None:
    plan = search(seed_flat(32), H100, top_k=QUERY_TILES)
    again = reranked(plan, [None] * len(plan.top), keep=len(plan.top))
    assert again.top == plan.top
    assert [p for p, _ in again.predicted] == pytest.approx([p for p, _ in plan.predicted])
    assert again.predicted[0][1] == plan.predicted[0][1]  # no "as compiled" where not known


def test_counts_must_match_the_tiles() -> None:
    plan = search(seed_flat(32), H100, top_k=4)
    with pytest.raises(ValueError, match="3 register counts for 4 tiles"):
        reranked(plan, [128, 128, 128], keep=4)


def test_only_long_gpu_kernels_ranked_by_time_are_worth_counting() -> None:
    assert worth_counting(search(matmul_flat(4096, 4096, 4096), H100))
    short = search(matmul_flat(1024, 1024, 1024), H100)
    assert short.predicted[0][0] < MIN_SECONDS and not worth_counting(short)
    assert not worth_counting(search(matmul_flat(4096, 4096, 4096), H100, model="plaidml"))
    cpu = search(matmul_flat(1024, 1024, 1024), HwModel.load("pocl-cpu"))
    assert not worth_counting(cpu)


def test_counting_stops_once_a_counted_tile_beats_every_estimate_left() -> None:
    plan = search(seed_flat(32), H100, top_k=QUERY_TILES)
    n = len(plan.top)
    # The first tile keeps what the estimate gave it: nothing left can beat it.
    est = int(predict_many(plan.flat, np.asarray([plan.top[0][0]], np.int64), H100,
                           score_many(plan.flat, np.asarray([plan.top[0][0]], np.int64),
                                      H100))["regs"][0])
    assert counted_enough(plan, [est] + [None] * (n - 1), 1)
    # Given 255 registers it is slower than the second tile's estimate: count on.
    assert not counted_enough(plan, [255] + [None] * (n - 1), 1)
    assert counted_enough(plan, [255] * n, n)  # all counted


def test_staging_reads_count_whole_l2_sectors() -> None:
    """A 3x3 convolution tile of 2 channels reads 8 bytes of each pixel: with 32-byte
    sectors its staging copies move 4x the bytes it stages, and its L2 term grows."""
    import dataclasses

    flat = seed_flat(32)
    tiles = np.asarray([[2, 64, 3, 3, 4, 16, 4], [8, 64, 3, 3, 4, 16, 4]], np.int64)
    plain = dataclasses.replace(H100, sector_bytes=0)
    assert H100.sector_bytes == 32
    st = score_many(flat, tiles, H100)
    assert "sectors" not in score_many(flat, tiles, plain)
    # D's rows: 2 channels in a 32-byte sector, 8 channels in one of 32 bytes exactly.
    d_share = st["sectors"] / st["sm"]
    assert d_share[0] > 1.5 and d_share[1] == pytest.approx(1.0, abs=0.05)
    with_sectors = predict_many(flat, tiles, H100, st)["l2_s"]
    without = predict_many(flat, tiles, plain, score_many(flat, tiles, plain))["l2_s"]
    assert with_sectors[0] > 1.5 * without[0]
    assert with_sectors[1] == pytest.approx(without[1], rel=0.05)
