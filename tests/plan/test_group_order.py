"""CPU work-group order (`plan.group_order.reuse_order`, `past_l2_order`): which output index
varies fastest from one work-group to the next, and the reordered kernels against numpy on the
CPU device."""

from __future__ import annotations

import re

import pytest

from tilec.lang.api import check_program
from tilec.plan.fuse import plan_kernels
from tilec.plan.group_order import past_l2_bytes, past_l2_order, reuse_order
from tilec.plan.hw import HwModel
from tilec.plan.schedule import make_schedule

CPU = HwModel.load("pocl-cpu")

POOL = """function (X[N, C, H, W]) -> (P) {
  P[n, c, y, x : N, C, 56, 56] = >(X[n, c, 2*y + i - 1, 2*x + j - 1]), i < 3, j < 3;
}"""
STEM = """function (I[N, CI, H, W], F[CO, CI2, KH, KW]) -> (O) {
  O[n, co, y, x : N, CO, 112, 112] = +(I[n, ci, 2*y + i - 3, 2*x + j - 3] * F[co, ci, i, j]);
}"""
DEPTHWISE = """function (D[N, X, Y, C], K[I, J, C]) -> (R) {
  R[n, x, y, c : N, X, Y, C] = +(D[n, x+i-1, y+j-1, c] * K[i, j, c]);
}"""
POINTWISE = """function (I[N, CI, H, W], K[CI2, CO]) -> (O) {
  O[n, co, y, x : N, CO, H, W] = +(I[n, ci, y, x] * K[ci, co]);
}"""
CLASSIFIER = """function (D[N, X, Y, CI], K[CI2, CO]) -> (O) {
  O[n, x, y, co : N, X, Y, CO2] = +(D[n, x, y, ci] * K[ci, co]);
}"""


def _flat(src: str, shapes: dict):
    return plan_kernels(check_program(src, shapes)).kernels[0].flat


def _fastest(flat, tile) -> str:
    order = reuse_order(flat, tile, CPU.l1_bytes) or flat.out_indices
    return flat.names[[k for k in order if flat.ranges[k] > tile[k]][0]]


def test_a_pool_walks_its_rows_in_memory_order():
    # One input, read along every output index: nothing to keep, so the groups follow the
    # output's memory order (x, then y, then c) where the flat (name) order puts c first.
    flat = _flat(POOL, {"X": (1, 64, 112, 112)})
    tile = tuple({"c": 1, "i": 3, "j": 3, "y": 4, "x": 16}[n] for n in flat.names)
    assert flat.names[flat.out_indices[0]] == "c"
    order = reuse_order(flat, tile, CPU.l1_bytes)
    assert order is not None
    assert [flat.names[k] for k in order if flat.ranges[k] > 1] == ["x", "y", "c"]


def test_a_filter_in_l1_is_kept_by_groups_along_the_row():
    # Two co-blocks of the stem's filter (3 x 7 x 7 x 32: 19 KB a block) fit L1 and do not
    # read x or y: those vary first, x (stride 1) before y, co last, where the name order
    # would put co first.
    flat = _flat(STEM, {"I": (1, 3, 224, 224), "F": (64, 3, 7, 7)})
    tile = tuple({"ci": 3, "co": 32, "i": 7, "j": 7, "y": 1, "x": 4}[n] for n in flat.names)
    assert [flat.names[k] for k in flat.out_indices if flat.ranges[k] > tile[k]][0] == "co"
    order = reuse_order(flat, tile, CPU.l1_bytes)
    assert order is not None
    assert [flat.names[k] for k in order if flat.ranges[k] > 1] == ["x", "y", "co"]


def test_an_input_panel_in_l1_keeps_the_channel_blocks_together():
    # 64 input channels x 32 pixels (8 KB) fit L1 and do not depend on the output channel:
    # the channel blocks of one pixel tile run back to back, although the name order (the
    # channel index renamed zc) would put the pixels first.
    src = POINTWISE.replace("co", "zc")
    flat = _flat(src, {"I": (1, 64, 32, 32), "K": (64, 128)})
    tile = tuple({"ci": 64, "zc": 16, "y_x": 32}[n] for n in flat.names)
    assert flat.names[flat.out_indices[0]] == "y_x"
    assert _fastest(flat, tile) == "zc"
    # A panel larger than L1 earns nothing: with 4096 input channels (512 KB a panel) the
    # filter block (4096 x 16: 256 KB) neither, and memory order decides.
    flat2 = _flat(POINTWISE, {"I": (1, 4096, 32, 32), "K": (4096, 128)})
    tile2 = tuple({"ci": 4096, "co": 16, "y_x": 32}[n] for n in flat2.names)
    assert flat2.names[flat2.out_indices[0]] == "co"
    assert _fastest(flat2, tile2) == "y_x"  # y and x, merged


def test_a_filter_cached_whole_keeps_nothing():
    # A 3x3 depthwise filter of 128 channels (4.5 KB) stays in L1 in any order: the channel
    # blocks of a pixel tile run back to back (channels-last memory order), where keeping
    # the filter's block would put them outermost and read the image once a block.
    flat = _flat(DEPTHWISE, {"D": (4, 112, 112, 128), "K": (3, 3, 128)})
    tile = tuple({"c": 32, "i": 3, "j": 3, "n": 1, "x": 7, "y": 2}[n] for n in flat.names)
    assert _fastest(flat, tile) == "c"
    # 2048 channels (72 KB) do not fit: the filter block is kept, pixels first.
    flat2 = _flat(DEPTHWISE, {"D": (1, 28, 28, 2048), "K": (3, 3, 2048)})
    tile2 = tuple({"c": 32, "i": 3, "j": 3, "x": 7, "y": 2}.get(n, 1) for n in flat2.names)
    assert _fastest(flat2, tile2) == "y"


def test_cpu_schedules_carry_the_order_and_gpu_schedules_do_not():
    flat = _flat(POOL, {"X": (1, 64, 112, 112)})
    tile = tuple({"c": 1, "i": 3, "j": 3, "y": 4, "x": 16}[n] for n in flat.names)
    assert make_schedule(flat, tile, CPU).group_order == reuse_order(flat, tile, CPU.l1_bytes)
    assert make_schedule(flat, tile, HwModel.load("nvidia-h100")).group_order is None


@pytest.mark.parametrize("side", [112, 110])
def test_reordered_pools_and_convolutions_run_against_numpy(side):
    """On the CPU device, a stride-2 max pool and a 7x7 stride-2 convolution with the rows
    in memory order match numpy, outputs poisoned first; at 110 the pool's last tile along
    x is shifted back (55 is no multiple of its tile)."""
    from ..codegen.test_kernels import run_case

    out = side // 2
    pool = POOL.replace("56, 56", f"{out}, {out}")
    exe = run_case(pool, {"X": (1, 8, side, side)}, seed=side,
                   device="Portable Computing Language")
    assert exe.hw.kind == "cpu"
    (text,) = [s.text for s in exe.sources if s.name.startswith("contract_P")]
    first = re.search(r"const int [og]_(\w+) = [^;]*grp %", text).group(1)
    assert first == "x", first  # the rows in memory order, as planned
    stem = STEM.replace("112, 112", f"{out}, {out}")
    run_case(stem, {"I": (1, 3, side, side), "F": (16, 3, 7, 7)}, seed=side + 1,
             device="Portable Computing Language")


def _classifier(co: int):
    flat = _flat(CLASSIFIER.replace("CO2", str(co)), {"D": (1, 13, 13, 512), "K": (512, co)})
    tile = tuple({"ci": 512, "co": 32, "x_y": 13}[n] for n in flat.names)
    return flat, tile


def test_a_filter_past_l2_is_kept_by_the_pixels():
    # squeezenet's classifier: the 26 KB input panel fits L1, so `reuse_order` walks the
    # channel blocks first, and each of the 13 rows of pixels reads the whole 2 MB filter;
    # with the pixels first the filter is read once and the input (346 KB) stays in L2.
    flat, tile = _classifier(1000)
    first = reuse_order(flat, tile, CPU.l1_bytes)
    assert flat.names[(first or flat.out_indices)[0]] == "co"
    co, xy = flat.names.index("co"), flat.names.index("x_y")
    walked = past_l2_bytes(flat, tile, co, CPU.l2_bytes)
    kept = past_l2_bytes(flat, tile, xy, CPU.l2_bytes)
    assert walked == pytest.approx(13 * 512 * 1000 * 4 + 169 * 512 * 4, rel=0.05)
    assert kept == pytest.approx(512 * 1000 * 4 + 169 * 512 * 4, rel=0.05)
    order = past_l2_order(flat, tile, CPU.l2_bytes, first)
    assert order is not None and flat.names[order[0]] == "x_y"
    assert make_schedule(flat, tile, CPU).group_order == order
    # A larger L2 holds the filter: the order the L1 rule chose stays.
    assert past_l2_order(flat, tile, 8 * CPU.l2_bytes, first) == first


def test_a_filter_within_l2_keeps_the_l1_order():
    flat, tile = _classifier(96)  # 192 KB: the row of groups reads it from L2
    first = reuse_order(flat, tile, CPU.l1_bytes)
    assert past_l2_order(flat, tile, CPU.l2_bytes, first) == first


def test_a_classifier_with_its_pixels_first_runs_against_numpy():
    """On the CPU device the classifier's kernel (whatever order the device's caches give it)
    matches numpy, outputs poisoned first; on a CPU with an L2 under 2 MB its groups walk the
    pixels first."""
    from ..codegen.test_kernels import run_case

    exe = run_case(CLASSIFIER.replace("CO2", "1000"), {"D": (1, 13, 13, 512),
                                                       "K": (512, 1000)},
                   seed=7, device="Portable Computing Language")
    assert exe.hw.kind == "cpu"
    (text,) = [s.text for s in exe.sources if s.name.startswith("contract_O")]
    first = re.search(r"const int [og]_(\w+) = [^;]*grp %", text).group(1)
    if 0 < exe.hw.l2_bytes < 2 * 1024 * 1024 and "co=32" in text.replace(" ", ""):
        assert first != "co", first


def test_a_window_keeps_the_l1_order():
    # A 3x3 convolution's neighbouring groups share rows, which the count does not see:
    # its order stays the L1 rules' even where the count would move it.
    src = """function (D[N, X, Y, CI], K[I, J, CI2, CO]) -> (O) {
  O[n, x, y, co : N, X, Y, CO] = +(D[n, x + i - 1, y + j - 1, ci] * K[i, j, ci, co]);
}"""
    flat = _flat(src, {"D": (1, 14, 14, 512), "K": (3, 3, 512, 512)})
    tile = tuple({"ci": 64, "co": 32, "i": 1, "j": 3, "x": 1, "y": 14}.get(n, 1)
                 for n in flat.names)
    first = reuse_order(flat, tile, CPU.l1_bytes)
    assert past_l2_order(flat, tile, CPU.l2_bytes, first) == first
    assert past_l2_order(flat, tile, 64 * 1024, first) == first
