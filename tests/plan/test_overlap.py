"""What neighbouring CPU work-items read of an input in common (`plan.overlap`), and the CPU
cost model counting a window's shared part once where the cache still holds it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tilec.lang.api import check_program
from tilec.plan.cost import score, score_many
from tilec.plan.fuse import plan_kernels
from tilec.plan.hw import HwModel
from tilec.plan.overlap import neighbour_shares, reread_factors

CPU = HwModel.load("pocl-cpu")

POOL = """function (I[N, X, Y, C]) -> (O) {
  O[n, x, y, c : N, 27, 27, C] = >(I[n, 2*x + i, 2*y + j, c]), i < 3, j < 3;
}"""
CONV = """function (D[N, X, Y, CI], K[I, J, CI, CO]) -> (O) {
  O[n, x, y, co : N, X, Y, CO] = +(D[n, x+i-1, y+j-1, ci] * K[i, j, ci, co]);
}"""
MATMUL = """function (A[M, K], B[K, N]) -> (C) {
  C[m, n : M, N] = +(A[m, k] * B[k, n]);
}"""
STRIDED = """function (D[N, X, Y, CI], K[CI, CO]) -> (O) {
  O[n, x, y, co : N, 28, 28, CO] = +(D[n, 2*x, 2*y, ci] * K[ci, co]);
}"""


def _flat(src: str, shapes: dict):
    return plan_kernels(check_program(src, shapes)).kernels[0].flat


def _tile(flat, **sizes) -> np.ndarray:
    return np.array([[sizes.get(n, 1) for n in flat.names]], np.int64)


def _shares(flat, t, T) -> dict[str, float]:
    return {flat.names[k]: round(float(s[0]), 4) for k, s in neighbour_shares(flat, t, T)}


def test_a_stride_two_pool_shares_one_window_column_with_its_neighbour():
    flat = _flat(POOL, {"I": (1, 55, 55, 128)})
    (t,) = flat.inputs
    # One output column reads 3 input columns; the next reads 2 further on: 1 of 3 shared.
    one = _shares(flat, t, _tile(flat, c=64, i=3, j=3))
    assert one == {"c": 0.0, "y": round(1 / 3, 4), "x": round(1 / 3, 4)}
    # Three output columns read 7 input columns and the next three start 6 further on.
    three = _shares(flat, t, _tile(flat, c=32, i=3, j=3, y=3))
    assert three["y"] == round(1 / 7, 4) and three["x"] == round(1 / 3, 4)


def test_a_same_convolution_shares_its_window_less_the_tile():
    flat = _flat(CONV, {"D": (1, 56, 56, 64), "K": (3, 3, 64, 64)})
    d = flat.inputs[0]
    for y in (1, 2, 4):
        # y columns read y + 2; the next tile starts y further on: 2 of y + 2 shared.
        got = _shares(flat, d, _tile(flat, ci=16, co=32, j=3, i=3, y=y))
        assert got["y"] == round(2 / (y + 2), 4)
        assert got["x"] == round(2 / 3, 4)
    # The filter moves with the output channels alone: no window, nothing shared.
    k = flat.inputs[1]
    assert _shares(flat, k, _tile(flat, ci=16, co=32, i=3, j=3, y=4)) == {}


@pytest.mark.parametrize("src, shapes", [
    (MATMUL, {"A": (256, 512), "B": (512, 256)}),
    (STRIDED, {"D": (1, 56, 56, 64), "K": (64, 128)}),
])
def test_reads_without_a_window_share_nothing(src, shapes):
    flat = _flat(src, shapes)
    T = _tile(flat, **{n: min(8, r) for n, r in zip(flat.names, flat.ranges, strict=True)})
    for t in flat.inputs:
        assert all(v == 0.0 for v in _shares(flat, t, T).values())


def test_a_neighbour_read_too_long_ago_is_not_in_the_cache():
    flat = _flat(POOL, {"I": (1, 55, 55, 128)})
    (t,) = flat.inputs
    T = _tile(flat, c=64, i=3, j=3)
    G = -(-np.array([flat.ranges]) // T)
    outs = sorted(flat.out_indices, key=lambda k: abs(flat.output.strides[k]))
    group = np.array([2304], np.int64)
    # Along y the neighbour is 2 work-items back (the two channel groups run first), along
    # x 2 x 27 = 54: 5 KB and 124 KB of reads ago.
    small, mid, big = reread_factors(flat, t, T, G, outs, group, (8 << 10, 192 << 10, 1 << 20))
    assert small[0] == pytest.approx(2 / 3)
    assert mid[0] == big[0] == pytest.approx(4 / 9)
    none, = reread_factors(flat, t, T, G, outs, group, (1 << 10,))
    assert none[0] == 1.0


def test_the_pool_reads_its_input_from_dram_once():
    # squeezenet's 55x55x128 max pool (1.5 MB, past half of a 512 KB L2): every window
    # column once from DRAM whatever the tile, where each work-item's panel had been counted
    # (3.7 MB for a one-column tile, 3.0 MB for a three-column one).
    hw = replace(CPU, l1_bytes=32 << 10, l2_bytes=512 << 10, max_mem=32 << 10)
    flat = _flat(POOL, {"I": (1, 55, 55, 128)})
    size = 55 * 55 * 128 * 4
    out = 27 * 27 * 128 * 4
    for sizes in ({"c": 64, "i": 3, "j": 3}, {"c": 32, "i": 3, "j": 3, "y": 3}):
        tile = tuple(int(v) for v in _tile(flat, **sizes)[0])
        c = score(flat, tile, hw)
        # Never past the input once (the shared columns counted twice had made 1.9-2.4x),
        # a little under it: the first column of each row has no neighbour to share with.
        assert 0.95 * size + out <= c.dram_bytes <= size + out
        many = score_many(flat, np.array([tile]), hw)
        assert int(many["dram_bytes"][0]) == c.dram_bytes
        assert int(many["l2_bytes"][0]) == c.l2_bytes


def test_the_score_keeps_plaidml_counting():
    # PlaidML's score (`--model plaidml`, seed 001's log) is not the kernel's traffic: its
    # roof ratio still counts each work-item's panel.
    hw = replace(CPU, l1_bytes=32 << 10, l2_bytes=512 << 10, max_mem=32 << 10)
    flat = _flat(POOL, {"I": (1, 55, 55, 128)})
    tile = tuple(int(v) for v in _tile(flat, c=64, i=3, j=3)[0])
    c = score(flat, tile, hw)
    panels = 27 * 27 * 2 * 9 * 256  # work-items x window points x 256-byte lines
    assert c.flops_per_byte == pytest.approx(c.to / (panels + 27 * 27 * 128 * 4), rel=0.02)
