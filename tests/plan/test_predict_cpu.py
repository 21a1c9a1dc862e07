"""The CPU time model (`predict_cpu`) on synthetic hardware models: no device needed."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tilec.plan.cost import score_many
from tilec.plan.hw import HwModel
from tilec.plan.predict import BOTTLENECKS, can_predict, explain_line, predict_many
from tilec.plan.predict_cpu import predict_many_cpu
from tilec.plan.search import search

from ..flats import matmul_flat, seed_flat

CPU = HwModel.load("pocl-cpu")
CALIBRATED = replace(CPU, name="calibrated-cpu", peak_gflops=234.0, bandwidth_gbs=32.0,
                     l1_gbs=390.0, l2_gbs=220.0, launch_us=0.8, group_us=0.008, muladd_vec=8,
                     vec_size=16, registers=32, max_regs=2048)


def _predict(flat, tiles, hw):
    tiles = np.asarray(tiles, np.int64)
    return predict_many(flat, tiles, hw, score_many(flat, tiles, hw))


def test_cpu_models_with_peak_and_bandwidth_predict():
    assert can_predict(CPU) and can_predict(CALIBRATED)
    assert not can_predict(replace(CPU, peak_gflops=0.0))
    assert not can_predict(replace(CPU, bandwidth_gbs=0.0))
    assert not can_predict(HwModel.load("seed-example"))


def test_same_keys_as_the_gpu_model():
    flat = matmul_flat(256, 256, 256)
    cpu = _predict(flat, [(64, 4, 32)], CPU)
    gpu = _predict(flat, [(64, 4, 32)], HwModel.load("nvidia-h100"))
    assert set(gpu) <= set(cpu)
    assert all(len(v) == 1 for v in cpu.values())


@pytest.mark.parametrize("hw", [CPU, CALIBRATED])
def test_infeasible_tiles_are_inf_and_feasible_ones_finite(hw):
    flat = matmul_flat(512, 512, 512)
    tiles = np.asarray([(k, m, n) for k in (1, 16, 512) for m in (1, 4, 8, 64)
                        for n in (8, 16, 32, 512)], np.int64)
    stats = score_many(flat, tiles, hw)
    pred = predict_many_cpu(flat, tiles, hw, stats)
    ok = stats["status"] == 0
    assert ok.any() and (~ok).any()
    assert np.isinf(pred["time"][~ok]).all()
    assert (BOTTLENECKS.index("registers") == pred["bottleneck"][~ok]).all()
    assert np.isfinite(pred["time"][ok]).all() and (pred["time"][ok] > 0).all()


def test_monotonic_in_the_device_facts():
    flat = matmul_flat(512, 512, 512)
    tiles = [(64, 4, 32), (8, 2, 16), (512, 8, 16), (1, 1, 8)]
    base = _predict(flat, tiles, CALIBRATED)["time"]
    for field, better in [("peak_gflops", 2.0), ("bandwidth_gbs", 2.0), ("l1_gbs", 2.0),
                          ("l2_gbs", 2.0), ("compute_units", 2.0)]:
        faster = replace(CALIBRATED, **{field: type(getattr(CALIBRATED, field))(
            getattr(CALIBRATED, field) * better)})
        assert (_predict(flat, tiles, faster)["time"] <= base).all(), field
    slower = replace(CALIBRATED, launch_us=50.0, group_us=1.0)
    assert (_predict(flat, tiles, slower)["time"] > base).all()


def test_monotonic_in_the_problem_size():
    tile = [(64, 4, 32)]
    times = [_predict(matmul_flat(s, s, s), tile, CALIBRATED)["time"][0]
             for s in (128, 256, 512, 1024)]
    assert all(a < b for a, b in zip(times, times[1:], strict=False))
    # A matmul's work grows 8x a doubling; its compute-bound time close to that.
    assert 6 < times[-1] / times[-2] < 10


def test_a_register_tile_beats_a_single_element():
    flat = matmul_flat(512, 512, 512)
    t = _predict(flat, [(64, 4, 32), (64, 1, 16), (1, 1, 1)], CALIBRATED)["time"]
    assert t[0] < t[1] < t[2]


def test_tiles_that_generate_different_code_are_predicted_apart():
    flat = matmul_flat(512, 512, 512)
    tiles = np.asarray([(k, m, n) for k in (8, 16, 32, 64, 128, 256, 512)
                        for m in (2, 4, 8) for n in (16, 32, 64)], np.int64)
    stats = score_many(flat, tiles, CALIBRATED)
    t = predict_many_cpu(flat, tiles, CALIBRATED, stats)["time"]
    fin = t[np.isfinite(t)]
    assert len(np.unique(fin)) == len(fin)


def test_limits_are_named():
    pred = _predict(seed_flat(1), [(16, 4, 3, 3, 1, 1, 4)], CALIBRATED)
    line = explain_line(pred, 0)
    assert line.startswith("  Predicted: ") and "limited by " in line
    name = line.split("limited by ", 1)[1].split(" (", 1)[0]
    assert name in ("compute", "L1", "L2", "DRAM", "launch")
    # A tiny contraction is all launch cost.
    small = _predict(matmul_flat(4, 4, 4), [(4, 4, 4)], CALIBRATED)
    assert BOTTLENECKS[int(small["bottleneck"][0])] == "launch"


def test_search_ranks_cpu_tiles_by_time():
    flat = matmul_flat(512, 512, 512)
    plan = search(flat, CALIBRATED)
    assert plan.model == "time"
    times = [p for p, _ in plan.predicted]
    assert times == sorted(times)
    assert all(c.ok for c in plan.costs)
    _, tm, tn = plan.tile
    assert tm * tn >= 64  # a register tile, not a row of scalars
    assert search(flat, CALIBRATED, model="plaidml").model == "plaidml"


# A 48 KB L1 (as on Ice Lake and later Xeons): room for a 13-tile sweep's partial sums.
WIDE_L1 = replace(CALIBRATED, l1_bytes=48 * 1024)


def _pointwise(pixels: int, ci: int, co: int):
    """A 1x1 convolution over channels-last pixels: O[p, o] = +(I[p, c] * K[c, o])."""
    return matmul_flat(pixels, co, ci)


def test_a_swept_tile_is_charged_its_filter_once():
    """A classifier-like 1x1 convolution (169 pixels, 512 -> 1000): with the reduction in
    blocks a work-item runs its 13 pixel tiles in turn and reads each filter block from L2
    once; taken whole, every pixel tile streams the 64 KB filter panel again.  The model
    sees the difference (measured on a 2-core Xeon, PoCL 3.0: 1.16 ms whole, 0.68 swept)."""
    flat = _pointwise(169, 512, 1000)
    k, m, n = flat.names.index("k"), flat.names.index("m"), flat.names.index("n")
    rows = np.zeros((2, 3), np.int64)
    rows[:, m], rows[:, n] = 13, 32
    rows[:, k] = (512, 128)
    stats = score_many(flat, rows, WIDE_L1)
    assert list(stats["sweep"]) == [1, 13]
    assert stats["l2_bytes"][1] * 4 < stats["l2_bytes"][0]
    pred = predict_many(flat, rows, WIDE_L1, stats)
    assert pred["time"][1] < pred["time"][0]
    assert "13 tiles a work-item" in explain_line(pred, 1)
    assert "tiles a work-item" not in explain_line(pred, 0)


def test_a_sweep_whose_block_misses_l1_saves_nothing():
    """A reduction block larger than L1 (512 x 64 floats of B) is streamed from L2 by every
    swept tile: the sweep runs, and costs its partial sums, but saves no L2 traffic."""
    flat = matmul_flat(1024, 1024, 1024)
    k, m, n = flat.names.index("k"), flat.names.index("m"), flat.names.index("n")
    row = np.zeros((1, 3), np.int64)
    row[0, k], row[0, m], row[0, n] = 512, 4, 64
    stats = score_many(flat, row, CALIBRATED)
    plain = dict(stats)
    plain["sweep"] = np.ones(1, np.int64)
    assert stats["sweep"][0] > 1
    swept, unswept = predict_many(flat, row, CALIBRATED, stats), \
        predict_many(flat, row, CALIBRATED, plain)
    assert swept["l2_s"][0] == unswept["l2_s"][0]
    # (fewer work-groups to dispatch, partial sums to keep: about even)
    assert abs(swept["time"][0] / unswept["time"][0] - 1) < 0.02


@pytest.mark.parametrize("case", ["conv_rows", "matmul", "pointwise"])
def test_the_model_scores_the_sweep_the_schedule_makes(case):
    """The sweep the cost model charges a tile is the one the generated kernel runs."""
    import re

    import tilec
    from tilec.codegen.generate import generate
    from tilec.config import Config
    from tilec.plan.fuse import plan_kernels

    from ..codegen.test_sweep import CASES

    hw = WIDE_L1 if case == "pointwise" else CALIBRATED
    if case == "pointwise":
        src = "function (I[P, C], K[C, O]) -> (R) { R[p, o : P, O] = +(I[p, c] * K[c, o]); }"
        shapes, tile = {"I": (169, 512), "K": (512, 1000)}, {"c": 128, "o": 32, "p": 13}
    else:
        src, shapes, tile, _ = CASES[case]
    plan = plan_kernels(tilec.check_program(src, shapes, "float32"))
    sources, _ = generate(plan, hw, Config(use_disk_cache=False, tiles={"*": tile}))
    text, = [s.text for s in sources if s.kind == "contraction"]
    made = re.search(r"sweep: (\d+) register tiles", text)
    flat = next(k.flat for k in plan.kernels if getattr(k, "flat", None) is not None)
    row = np.array([[tile.get(nm, 1) for nm in flat.names]], np.int64)
    stats = score_many(flat, row, hw)
    assert made, text  # every case sweeps
    assert int(stats["sweep"][0]) == int(made.group(1))


def test_output_runs_merge_contiguous_indices():
    """A tile's stores: 7 rows of a full 64-channel row block are one run, 7 images apart
    are 7, and a half-width channel tile cannot extend its run."""
    from tilec.plan.flat import FlatContraction, FlatTensor
    from tilec.plan.layout import output_order
    from tilec.plan.predict_cpu import output_runs

    # O[n, y, c] over (n, y, c) = (4, 112, 64), no reduction: strides 7168, 64, 1
    out = FlatTensor("O", (7168, 64, 1), 0)
    src = FlatTensor("I", (7168, 64, 1), 0)
    flat = FlatContraction(("n", "y", "c"), (4, 112, 64), (out, src))
    outs = output_order(flat)
    A = np.array([[1, 7, 64], [4, 1, 64], [1, 7, 32], [1, 1, 64]], np.int64)
    A = A[:, [("n", "y", "c").index(flat.names[k]) for k in outs]]
    assert list(output_runs(flat, outs, A)) == [1, 4, 7, 1]
    # ... which the time model charges: mirrored tiles are predicted apart
    tiles = np.array([[1, 7, 64], [7, 1, 64]], np.int64)
    t = _predict(flat, tiles, CALIBRATED)["time"]
    assert t[0] < t[1]


def test_a_window_chunk_counts_its_rows_once_for_the_sweep(monkeypatch):
    """resnet18's 14x14 3x3 layer (256 -> 256, channels-last), ci=32 with the whole window,
    x1=14 swept 7 rows deep: a chunk holds a 37 KB filter block and 6 KB of image rows (the
    window's rows overlap: cache lines, not 3 x 3 x 14 points), which fit a 48 KB L1, so the
    filter comes from L2 once a work-item (it ran 0.75 ms)."""
    import tilec
    import tilec.plan.cost_cpu as cost_cpu
    from tilec.plan.fuse import plan_kernels

    src = """function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {
      O[n, x0, x1, co : N, H, W, CO] = +(I[n, x0 + k0 - 1, x1 + k1 - 1, ci] * K[k0, k1, ci, co]);
    }"""
    plan = plan_kernels(tilec.check_program(
        src, {"I": (1, 14, 14, 256), "K": (3, 3, 256, 256)}, "float32"))
    flat = next(k.flat for k in plan.kernels if getattr(k, "flat", None) is not None)
    tile = {"ci": 32, "co": 32, "k0": 3, "k1": 3, "x0": 1, "x1": 14, "n": 1}
    row = np.array([[tile[n] for n in flat.names]], np.int64)
    swept = score_many(flat, row, WIDE_L1)
    assert swept["sweep"][0] == 7
    monkeypatch.setattr(cost_cpu, "sweep_many", lambda flat, T, hw, **k: (
        np.full(T.shape[0], -1), np.ones(T.shape[0], np.int64)))
    plain = score_many(flat, row, WIDE_L1)
    assert swept["l2_bytes"][0] * 3 < plain["l2_bytes"][0]


def _maxpool_flat(window: int, stride: int):
    """O[x, y, c] = max over i, j < window of I[stride*x + i, stride*y + j, c], 56x56 outputs
    of 64 channels (channels-last): index order (c, i, j, x, y)."""
    from tilec.plan.flat import FlatContraction, FlatTensor

    side = stride * 56 + window
    out = FlatTensor("O", (1, 0, 0, 56 * 64, 64), 0)
    src = FlatTensor("I", (1, side * 64, 64, stride * side * 64, stride * 64), 0)
    return FlatContraction(("c", "i", "j", "x", "y"), (64, window, window, 56, 56), (out, src),
                           agg=">", comb=None)


def test_input_runs_follow_the_strides_and_merge_overlapping_windows():
    from tilec.plan.predict_cpu import input_runs

    pool = _maxpool_flat(2, 2)
    src = pool.tensors[1]
    T = np.array([[16, 2, 2, 1, 7],   # a quarter of each pixel: 16-float runs
                  [64, 2, 2, 1, 1],   # whole pixels, the 2 of a window row: 128
                  [64, 2, 2, 1, 7],   # 7 outputs along y: 14 pixels
                  [64, 2, 2, 7, 1],   # 7 outputs down x: rows apart, 2 pixels
                  [64, 1, 1, 1, 1]], np.int64)
    assert list(input_runs(pool, src, T)) == [16, 128, 896, 128, 64]
    # A 3x3 stride-2 window over 7 outputs covers 15 contiguous pixels, not 3 x 7.
    pool3 = _maxpool_flat(3, 2)
    assert list(input_runs(pool3, pool3.tensors[1], np.array([[64, 3, 3, 1, 7]]))) == [15 * 64]


def test_short_runs_and_idle_cores_cost_memory_time():
    """A tile that reads a quarter of each pixel moves the same bytes as one reading whole
    pixels and is predicted slower from DRAM; so is a matrix-vector product split into fewer
    work-items than the device has cores (8 of 16 ran 2x slower on a 16-core Xeon)."""
    pool = _maxpool_flat(2, 2)
    T = np.array([[16, 2, 2, 1, 4], [64, 2, 2, 1, 1]], np.int64)
    p = _predict(pool, T, CALIBRATED)
    assert p["dram_s"][0] > 1.1 * p["dram_s"][1]
    from tilec.plan.predict_cpu import DEFAULT
    off = predict_many_cpu(pool, T, CALIBRATED, score_many(pool, T, CALIBRATED),
                           coeff=replace(DEFAULT, run_bytes=0.0))
    assert off["dram_s"][0] == pytest.approx(off["dram_s"][1], rel=0.02)
    gemv = matmul_flat(1, 1024, 4096)
    sixteen = replace(CALIBRATED, compute_units=16)
    T = np.array([[256, 1, 64], [256, 1, 128]], np.int64)  # 16 and 8 work-items
    p = _predict(gemv, T, sixteen)
    assert p["dram_s"][1] > 1.8 * p["dram_s"][0]
    assert p["l2_s"][1] > 1.8 * p["l2_s"][0]


def test_reads_across_fewer_pages_are_predicted_faster_and_mirrored_tiles_do_not_tie():
    """A panel copy `B_panels[po, d0, pi] = B[d0, 16 po + pi]` of a 1024 x 1024 matrix: tiles
    of 8 runs of 8 floats each read and write the same bytes and runs, but those reading 1, 2,
    4 or 8 rows (4 KB apart) measured 0.45, 0.50, 0.59 and 0.57 ms on a Zen 3 and the fewer
    rows ran faster on a 16-core Xeon too; they were predicted alike.  The pages a
    work-item's reads span now cost (`CpuCoefficients.page`)."""
    from tilec.plan.flat import FlatContraction, FlatTensor
    from tilec.plan.predict_cpu import DEFAULT, read_pages
    out = FlatTensor("B_panels", (16, 1, 16384), 0)
    b = FlatTensor("B", (1024, 1, 16), 0)
    copy = FlatContraction(("d0", "pi", "po"), (1024, 16, 64), (out, b))
    T = np.array([[1, 8, 8], [2, 8, 4], [4, 8, 2], [8, 8, 1]], np.int64)
    assert read_pages(b, [0, 1, 2], T, 4) == pytest.approx([1, 2, 4, 8], rel=0.12)
    t = _predict(copy, T, CALIBRATED)["time"]
    assert list(t) == sorted(t) and len(set(t)) == 4
    flat = predict_many_cpu(copy, T, CALIBRATED, score_many(copy, T, CALIBRATED),
                            coeff=replace(DEFAULT, page=0.0))["time"]
    assert len(set(np.round(flat, 12))) == 1  # without the term: one predicted time for all


def _depthwise_flat(constraints=()):
    """A 5x5 depthwise convolution over 14x14x240 read from a bordered 18x18 buffer:
    c i j x y over O, D, K."""
    from tilec.plan.flat import FlatContraction, FlatTensor

    out = FlatTensor("O", (1, 0, 0, 14 * 240, 240), 0)
    d = FlatTensor("D", (1, 18 * 240, 240, 18 * 240, 240), 0)
    k = FlatTensor("K", (1, 5 * 240, 240, 0, 0), 0)
    return FlatContraction(("c", "i", "j", "x", "y"), (240, 5, 5, 14, 14), (out, d, k),
                           constraints=constraints)


def test_an_unrolled_window_reads_its_shared_pixels_once():
    from tilec.plan.predict_cpu import window_share

    flat = _depthwise_flat()
    tiles = np.asarray([(48, 5, 5, 1, 7), (48, 5, 5, 7, 1)], np.int64)
    A = tiles[:, [0, 3, 4]]  # c, x, y: one work-item a tile
    outs = [0, 3, 4]
    inner = 2  # j: the innermost reduction loop, unrolled
    d, k = flat.inputs
    # 7 pixels along y under 5 window columns: 11 distinct, not 35; along x (the rolled i
    # loop) nothing is shared; the filter slides with no output index.
    assert window_share(flat, d, outs, A, tiles, inner, 0) == pytest.approx([11 / 35, 1.0])
    assert window_share(flat, k, outs, A, tiles, inner, 0) == pytest.approx([1.0, 1.0])
    # With bounds tests each window point's loads stand in a block of their own.
    bounded = _depthwise_flat(constraints=(object(),))
    assert window_share(bounded, d, outs, A, tiles, inner, 0) == pytest.approx([1.0, 1.0])
    pred = _predict(flat, tiles, CALIBRATED)["time"]
    assert pred[0] < pred[1]


def test_the_start_of_every_core_is_charged_to_every_tile_alike():
    hw = replace(CALIBRATED, compute_units=16, goal_groups=64, threads=16)
    flat = matmul_flat(16, 16, 64)
    tiles = np.asarray([(64, 16, 16), (64, 4, 16), (64, 1, 16)], np.int64)  # 1, 4, 16 items
    base = _predict(flat, tiles, hw)
    slow = _predict(flat, tiles, replace(hw, start_us=30.0))
    extra = (slow["time"] - base["time"]) * 1e6
    # A tile on one core would not pay it launched alone, but a model's phase launch pays it
    # once for all its kernels: the ranking must not trade cores for it.
    assert extra == pytest.approx([30.0, 30.0, 30.0], abs=0.01)
