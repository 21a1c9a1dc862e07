"""Constrained CPU contractions: the unmasked interior copy of the free reduction loops and the
steered masked reads of the edge copy (`codegen.interior`).  Texts are checked device-free;
the runs compare with the numpy reference on random inputs, outputs poisoned, with tiles forced
to leave partial tiles, ragged reductions and strided windows at the border."""

from __future__ import annotations

import pytest

from tilec.plan.hw import HwModel

from ..device import needs_device
from .test_kernels import run_tiled
from .test_plain_builtins import avx2_cpu, contraction_texts

NHWC = """function (D[N, X, Y, CI], K[I, J, CO, CI]) -> (R) {
  O[n, x, y, co : N, X, Y, CO] = +(D[n, x+i-1, y+j-1, ci] * K[i, j, co, ci]);
  R = (O > 0 ? O : 0);
}"""
NCHW_STRIDED = """function (D[N, CI, X, Y], W[CO, CI, I, J]) -> (O) {
  O[n, co, x, y : N, CO, 5, 4] = +(D[n, ci, 2*x+i-1, 2*y+j-2] * W[co, ci, i, j]);
}"""
# Padded pooling windows: every reduction index constrained, the window's columns (an output
# index a constraint mentions) as the vector lanes on CPUs.
MAX_POOL = """function (X[N, C, H, W]) -> (P) {
  P[n, c, x0, x1 : N, C, 8, 16] = >(X[n, c, 2*x0 + k0 - 1, 2*x1 + k1 - 1]), k0 < 3, k1 < 3;
}"""
SUM_POOL = """function (X[N, C, H, W]) -> (P) {
  P[n, c, x0, x1 : N, C, H, W] = +(X[n, c, x0 + k0 - 1, x1 + k1 - 1]), k0 < 3, k1 < 3;
}"""
MIN_POOL = """function (X[C, W]) -> (P) {
  P[c, x : C, 20] = <(X[c, x + k - 2]), k < 5;
}"""
# NCHW depthwise convolutions: no channel index any input holds contiguously, so the padded
# columns are the lanes (CPU models) with a bias and ReLU6 after.
DEPTHWISE = """function (I[N, C, H, W], F[C, U, KH, KW], B[C, P, Q]) -> (R) {
  O[n, g, x0, x1 : N, C, H, W] = +(I[n, g, x0 + k0 - 1, x1 + k1 - 1] * F[g, 0, k0, k1]), g < C;
  R = min(max(O + B, 0.0), 6.0);
}"""
DEPTHWISE_S2 = """function (I[N, C, H, W], F[C, U, KH, KW]) -> (O) {
  O[n, g, x0, x1 : N, C, 7, 9] = +(I[n, g, 2*x0 + k0 - 1, 2*x1 + k1 - 1] * F[g, 0, k0, k1]),
      g < C;
}"""
# Padding on the left only, a 1-D window over rows of channels.
LEFT_PADDED = """function (D[X, CI], W[I, CI, CO]) -> (O) {
  O[x, co : X, CO] = +(D[x + i - 2, ci] * W[i, ci, co]);
}"""


def test_cpu_conv_runs_an_unmasked_interior():
    text, = contraction_texts(NHWC, {"D": (1, 14, 14, 16), "K": (3, 3, 16, 16)}, avx2_cpu())
    assert "/* Interior: every constraint holds" in text
    assert "/* Edge: loads masked by the constraints. */" in text
    interior = text.split("/* Interior")[1].split("/* Edge")[0]
    edge = text.split("/* Edge")[1]
    # No masks or clamps inside; the edge's masks are computed once a read, addresses
    # steered into the tensor by them.
    assert "?" not in interior, interior
    assert "const int m0_" in edge and " ? -" in edge


def test_gpu_models_keep_one_masked_loop():
    """A warp at the border would run both copies: GPU kernels are unchanged."""
    text, = contraction_texts(NHWC, {"D": (1, 14, 14, 16), "K": (3, 3, 16, 16)},
                              HwModel.load("nvidia-h100"))
    assert "Interior" not in text and "const int m0_" not in text


def test_unconstrained_products_have_no_interior():
    text, = contraction_texts("function (A[M, K], B[K, N]) -> (C) "
                              "{ C[m, n : M, N] = +(A[m, k] * B[k, n]); }",
                              {"A": (64, 64), "B": (64, 64)}, avx2_cpu())
    assert "Interior" not in text


RUNS = {
    # partial output tiles (7 rows of x in tiles of 2, 9 of y in tiles of 4), reduction ragged
    "nhwc_partial": (NHWC, {"D": (1, 7, 9, 12), "K": (3, 3, 12, 12)},
                     {"x": 2, "y": 4, "ci": 8, "co": 4}),
    "nhwc_vector_co": (NHWC, {"D": (2, 6, 6, 16), "K": (3, 3, 16, 16)},
                       {"y": 3, "co": 16, "ci": 16}),
    "nchw_strided": (NCHW_STRIDED, {"D": (1, 3, 10, 9), "W": (4, 3, 3, 4)},
                     {"y": 4, "co": 2}),
    "left_padded": (LEFT_PADDED, {"D": (10, 24), "W": (3, 24, 16)}, {"x": 4, "co": 8, "ci": 8}),
    # Lanes along the padded columns: whole-row tiles, tiles that move back (12 of 16), a
    # ragged window (k1 in tiles of 2), and odd widths the lanes overshoot.
    "max_pool_rows": (MAX_POOL, {"X": (1, 3, 16, 32)}, {"x0": 2, "x1": 16, "k0": 3, "k1": 3}),
    "max_pool_moved": (MAX_POOL, {"X": (1, 3, 16, 32)}, {"x0": 3, "x1": 12, "k1": 2}),
    "sum_pool_odd": (SUM_POOL, {"X": (1, 2, 7, 13)}, {"x0": 2, "x1": 8, "k0": 3, "k1": 3}),
    "min_pool_1d": (MIN_POOL, {"X": (3, 20)}, {"x": 8, "k": 5}),
    # Depthwise columns as lanes: whole rows, rows in tiles that move back (20 of 24), a
    # tile wider than the row the lanes overshoot, stride 2 (pairs of vector reads).
    "depthwise_rows": (DEPTHWISE, {"I": (1, 5, 9, 32), "F": (5, 1, 3, 3), "B": (5, 1, 1)},
                       {"g": 1, "x0": 3, "x1": 32}),
    "depthwise_moved": (DEPTHWISE, {"I": (2, 3, 6, 24), "F": (3, 1, 3, 3), "B": (3, 1, 1)},
                        {"g": 2, "x0": 2, "x1": 16}),
    "depthwise_over": (DEPTHWISE, {"I": (1, 4, 5, 13), "F": (4, 1, 3, 3), "B": (4, 1, 1)},
                       {"g": 1, "x0": 5, "x1": 16}),
    "depthwise_s2": (DEPTHWISE_S2, {"I": (1, 6, 14, 18), "F": (6, 1, 3, 3)},
                     {"g": 3, "x0": 7, "x1": 9}),
}


def test_padded_pooling_runs_vectors_along_its_columns():
    """The interior updates whole vectors of the window's columns with no test inside; the
    edge tests each point's lanes at once and walks them one by one only where some fail."""
    text, = contraction_texts(MAX_POOL, {"X": (1, 8, 16, 32)}, avx2_cpu())
    assert "vector: 8 lanes along x1" in text, text
    interior = text.split("/* Interior")[1].split("/* Edge")[0]
    edge = text.split("/* Edge")[1]
    assert "if (" not in interior and "fmax" not in interior and ".even" in interior
    assert "for (int l = 0; l < 8; l += 1) if (" in edge
    # The walks run at the buffer's ends only; LLVM is told not to make gathers of them.
    walks = edge.split("for (int l = 0;")
    assert len(walks) > 1 and all(w.rstrip().endswith("#pragma clang loop vectorize(disable)")
                                  for w in walks[:-1]), edge
    # GPU models: no vectors along a constrained index.
    gpu, = contraction_texts(MAX_POOL, {"X": (1, 8, 16, 32)}, HwModel.load("nvidia-h100"))
    assert "lanes along x1" not in gpu and "for (int l" not in gpu


def test_nchw_depthwise_runs_vectors_along_its_padded_columns():
    """No input holds the channels contiguously, so the padded columns are the lanes (they
    were scalar code: 5 GFLOP/s in mobilenet_v2); a border point whose reads stay inside the
    input updates one vector and keeps its valid lanes by a select, and only a point whose
    reads would leave the tensor walks its lanes."""
    text, = contraction_texts(DEPTHWISE, {"I": (1, 32, 56, 56), "F": (32, 1, 3, 3),
                                          "B": (32, 1, 1)}, avx2_cpu())
    assert "vector: 8 lanes along x1" in text, text
    edge = text.split("/* Edge")[1]
    assert "? nv : a_0;" in edge and "((int8)(0, 1, 2, 3, 4, 5, 6, 7))" in edge, edge
    assert "for (int l = 0; l < 8; l += 1) if (" in edge


@needs_device
@pytest.mark.parametrize("name", sorted(RUNS))
@pytest.mark.parametrize("forced", [True, False])
def test_interior_and_edge_compute_the_reference(name, forced):
    run_tiled(*RUNS[name], forced)


def test_transposed_convolutions_keep_the_clamped_loop():
    """An init kernel and a defracted product (ConvTranspose) keep clamped masked reads: with
    steered ones, some tiles read NaN from poisoned memory."""
    from ..kernel_cases import CASES

    src, shapes = CASES["convt2d_s2"]
    texts = contraction_texts(src, shapes, avx2_cpu())
    assert texts and not any("Interior" in t or "const int m0_" in t for t in texts)


def _pool_text(tile: dict) -> str:
    import tilec
    from tilec.codegen.generate import generate
    from tilec.config import Config
    from tilec.plan.fuse import plan_kernels

    plan = plan_kernels(tilec.check_program(MAX_POOL, {"X": (1, 8, 16, 64)}, "float32"))
    sources, _ = generate(plan, avx2_cpu(), Config(use_disk_cache=False, tiles={"*": tile}))
    text, = [s.text for s in sources if s.kind == "contraction"]
    return text


def test_lane_edge_window_is_unrolled_within_its_budget():
    """Each point of a lane-edge kernel carries a lane walk, and PoCL's time to generate the
    code grows faster than its length (resnet18's pool: 17 s with 28 vectors and the window
    unrolled): window loops unroll while points x copies stay within 64."""
    small = _pool_text({"c": 1, "x0": 1, "x1": 16})  # 2 vectors: 18 a window
    assert small.count("#pragma unroll\n") == 2 and "for (int l = 0; l < 8" in small, small
    large = _pool_text({"c": 1, "x0": 8, "x1": 16})  # 16 vectors: 48 a row, 144
    assert "#pragma unroll\n        for (int u_k1" in large, large
    assert "#pragma unroll\n    for (int u_k0" not in large
    huge = _pool_text({"c": 4, "x0": 8, "x1": 16})  # 64 vectors: 192 a row
    assert "for (int u_k1" in huge and "#pragma unroll" not in huge, huge
