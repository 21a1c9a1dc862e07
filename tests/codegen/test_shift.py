"""CPU tiles that the range leaves over move back to end where it ends (`Schedule.shift`), so
vectors run along indices whose range they do not divide (NCHW's 55x55 images), and an input
read at stride 2 along the vector index (stride-2 windows) is two vector reads and a shuffle
(`clexpr.load_pairs`).  Texts are checked device-free; runs compare with numpy on random
inputs, outputs poisoned, with forced tiles that leave a partial tile on every output index."""

from __future__ import annotations

import dataclasses

import pytest

import tilec
from tilec.plan.fuse import plan_kernels
from tilec.plan.hw import HwModel
from tilec.plan.schedule import distinct_points, make_schedule, shift_fits

from ..device import needs_device
from .test_kernels import run_case
from .test_plain_builtins import avx2_cpu, contraction_texts

POOL = """function (X[N, C, H, W]) -> (P) {
  P[n, c, x0, x1 : N, C, PH, PW] = >(X[n, c, 2*x0 + k0, 2*x1 + k1]), k0 < 3, k1 < 3;
}"""
CONV_S2 = """function (I[N, CI, H, W], F[CO, CI, KH, KW], B[CO, U, V]) -> (R) {
  O[n, co, x0, x1 : N, CO, OH, OW] = +(I[n, ci, 2*x0 + k0, 2*x1 + k1] * F[co, ci, k0, k1]);
  R = relu(O + B);
}"""
SAME_NHWC = """function (D[N, X, Y, CI], K[I, J, CO, CI]) -> (R) {
  O[n, x, y, co : N, X, Y, CO] = +(D[n, x+i-1, y+j-1, ci] * K[i, j, co, ci]);
  R = (O > 0 ? O : 0);
}"""
MATMUL = """function (A[M, K], B[K, N]) -> (C) {
  C[m, n : M, N] = +(A[m, k] * B[k, n]);
}"""
POINTWISE = """function (D[N, CI, X, Y], W[CO, CI]) -> (O) {
  O[n, co, x, y : N, CO, X, Y] = +(D[n, ci, x, y] * W[co, ci]);
}"""


def _pool(h: int, w: int) -> tuple[str, dict]:
    ph, pw = (h - 3) // 2 + 1, (w - 3) // 2 + 1
    return POOL.replace("PH", str(ph)).replace("PW", str(pw)), {"X": (1, 3, h, w)}


def _conv(h: int, w: int, ci: int = 3, co: int = 8) -> tuple[str, dict]:
    oh, ow = (h - 3) // 2 + 1, (w - 3) // 2 + 1
    return CONV_S2.replace("OH", str(oh)).replace("OW", str(ow)), \
        {"I": (1, ci, h, w), "F": (co, ci, 3, 3), "B": (co, 1, 1)}


def test_nchw_pool_vectors_run_along_odd_columns_read_in_pairs():
    src, shapes = _pool(111, 111)  # 55 x 55 outputs: no power of two divides them
    text, = contraction_texts(src, shapes, avx2_cpu())
    assert "min((grp % " in text, text  # the last column tile moves back
    assert ").even, (" in text and ").odd))" in text
    # Every lane is inside the image: no clamp, no store mask.
    assert " ? 0 : (" not in text and "if (p_" not in text


def test_gpu_models_keep_partial_tiles():
    src, shapes = _pool(111, 111)
    text, = contraction_texts(src, shapes, HwModel.load("nvidia-h100"))
    assert "min((grp % " not in text and ".even" not in text


def test_distinct_points():
    def flat(src: str, shapes: dict):
        plan = plan_kernels(tilec.check_program(src, shapes, "float32"))
        return plan.kernels[0].flat

    assert distinct_points(flat(*_pool(11, 15)))
    assert distinct_points(flat(POINTWISE, {"D": (1, 4, 5, 7), "W": (6, 4)}))
    # Output indices whose strides overlap (flatten gives none from a Tile program: a table
    # made so): distinct points share elements, so no tile may move back.
    f = flat(*_pool(11, 15))
    x0, x1 = (f.names.index(n) for n in ("x0", "x1"))
    strides = list(f.output.strides)
    strides[x0] = 2  # rows two elements apart, over columns seven long
    out = dataclasses.replace(f.output, strides=tuple(strides))
    f = dataclasses.replace(f, tensors=(out, *f.inputs))
    assert not distinct_points(f)
    assert not shift_fits(f, x1, 4, cpu=True) and shift_fits(f, x1, 7, cpu=True)
    sched = make_schedule(f, tuple(4 if k == x1 else 1 for k in range(len(f.names))),
                          avx2_cpu())
    assert not sched.shift and not sched.shifted(x1)


RUNS = {
    # 5 x 7 outputs in tiles of 2 x 4: both last tiles move back; vectors of 4 read in pairs.
    "pool_odd": (*_pool(11, 15), {"x0": 2, "x1": 4}),
    "pool_vector_whole_row": (*_pool(9, 19), {"x1": 8, "c": 2}),
    # Post-ops (bias, relu) on the stored lanes; stride-2 input, weights broadcast.
    "conv_s2_bias_relu": (*_conv(13, 15), {"x1": 4, "co": 2}),
    "conv_s2_channels": (*_conv(11, 21, ci=5, co=6), {"x0": 2, "x1": 8, "co": 4, "ci": 2}),
    # 13 x 13 pixels merged into 169: vectors along them, the last tile moved back.
    "pointwise_odd_pixels": (POINTWISE, {"D": (1, 8, 13, 13), "W": (6, 8)}, {}),
    # The register-tile sides of CPU convolutions (`space.CPU_SIDES`) on ranges they do not
    # divide: 3 and 5 points of a padded 11 x 13 image; 6 rows of a 20-row product (forced).
    "same_conv_register_sides": (SAME_NHWC, {"D": (1, 11, 13, 16), "K": (3, 3, 16, 16)},
                                 {"x": 5, "y": 3, "co": 16, "ci": 8}),
    "same_conv_six_points": (SAME_NHWC, {"D": (1, 11, 13, 16), "K": (3, 3, 16, 16)},
                             {"x": 1, "y": 6, "co": 16, "ci": 16, "j": 1}),
    "matmul_six_rows": (MATMUL, {"A": (20, 24), "B": (24, 32)}, {"m": 6, "n": 16, "k": 8}),
}


@needs_device
@pytest.mark.parametrize("name", sorted(RUNS))
@pytest.mark.parametrize("forced", [True, False])
def test_shifted_tiles_compute_the_reference(name, forced):
    src, shapes, tile = RUNS[name]
    tiles = {"*": tile} if forced and tile else {}
    exe = run_case(src, shapes, tiles=tiles, use_disk_cache=False, use_tuning_records=False)
    if forced and tile and exe.hw.kind == "cpu":
        # Moved back, or (one index a kernel) run as a narrower tile of its own
        # (`test_edge_tiles`).
        assert any("min((grp % " in s.text or "with code of its own" in s.text
                   for s in exe.sources)
