"""CPU kernels read each input from one base pointer a loop pass, at constant offsets
(`Inputs.based_read`); a padded NHWC max pool keeps its window rolled.  Texts are checked
device-free; the runs compare with the numpy reference on random inputs, outputs poisoned,
with tiles forced where the offsets are least regular (partial tiles, odd row lengths,
stride-2 pairs of reads)."""

from __future__ import annotations

import re

import pytest

from tilec.plan.hw import HwModel

from ..device import needs_device
from .test_kernels import run_tiled
from .test_plain_builtins import avx2_cpu, contraction_texts

NHWC_HALO = """function (D[N, X, Y, CI], K[I, J, CI, CO]) -> (O) {
  O[n, x, y, co : N, 12, 12, CO] = +(D[n, x + i, y + j, ci] * K[i, j, ci, co]);
}"""
NHWC_S2 = """function (D[N, X, Y, CI], K[I, J, CI, CO]) -> (O) {
  O[n, x, y, co : N, 6, 6, CO] = +(D[n, 2*x + i, 2*y + j, ci] * K[i, j, ci, co]);
}"""
SHIFTED_MATMUL = ("function (A[M, K], B[K, L]) -> (C) "
                  "{ C[m, n : M, 32] = +(A[m, k] * B[k, n + 1]); }")
NHWC_MAX_POOL = """function (X[N, H, W, C]) -> (P) {
  P[n, x0, x1, c : N, 8, 8, C] = >(X[n, 2*x0 + k0 - 1, 2*x1 + k1 - 1, c]), k0 < 3, k1 < 3;
}"""


NHWC_1X1 = """function (D[N, X, Y, CI], K[CI, CO]) -> (O) {
  O[n, x, y, co : N, X, Y, CO] = +(D[n, x, y, ci] * K[ci, co]);
}"""


def _loop_body(text: str) -> str:
    """The text from the first base pointer to the end of the reduction loops."""
    return text[text.index("base"):text.index("/* Finish")]


def _offsets(body: str) -> list[str]:
    return re.findall(r"base\d(?: \+ \(|\[)([^)\]]*)", body)


def test_tile_reads_are_constant_offsets_from_a_base():
    text, = contraction_texts(NHWC_1X1, {"D": (1, 14, 14, 64), "K": (64, 32)}, avx2_cpu())
    assert re.search(r"__global const float\* base0 = b_D \+ \(", text), text
    assert re.search(r"__global const float\* base1 = b_K \+ \(", text), text
    body = _loop_body(text)
    # Every read in the loop goes through a base; the tensors' own pointers appear only in
    # the bases' declarations.
    assert "b_D[" not in body and "(b_D + (" not in body.split("\n", 2)[2], body
    offsets = _offsets(body)
    assert offsets and all(o.strip().lstrip("-").isdigit() for o in offsets), offsets


def test_window_reads_that_meet_across_passes_stay_written_out():
    """An unrolled 3x3 window over a row of register-tile points: the image's element at
    (window column j, point y) is the one at (j + 1, y - 1), so the image's reads keep
    their sums (`reads_meet`); the filter's reads, which never meet, come from a base."""
    text, = contraction_texts(NHWC_HALO, {"D": (1, 14, 14, 16), "K": (3, 3, 16, 32)},
                              avx2_cpu())
    body = text[text.index("#pragma unroll"):text.index("/* Finish")]
    assert "b_D[" in body and "= b_D +" not in body, body
    assert re.search(r"base\d = b_K \+", body), body


def test_gpu_kernels_keep_their_addresses():
    text, = contraction_texts(NHWC_HALO, {"D": (1, 14, 14, 16), "K": (3, 3, 16, 32)},
                              HwModel.load("nvidia-h100"))
    assert "base0" not in text


def test_clamped_reads_keep_their_clamp():
    """A padded window's masked copy reads at steered or clamped offsets, never a base's."""
    src = """function (D[N, X, Y, CI], K[I, J, CO, CI]) -> (O) {
      O[n, x, y, co : N, X, Y, CO] = +(D[n, x+i-1, y+j-1, ci] * K[i, j, co, ci]);
    }"""
    text, = contraction_texts(src, {"D": (1, 14, 14, 16), "K": (3, 3, 16, 16)}, avx2_cpu())
    edge = text.split("/* Edge")[1]
    assert "const int m0_" in edge
    # The edge's reads of D go to steered offsets, not to a base of D.
    d_base = re.search(r"(base\d) = b_D \+", edge)
    assert d_base is None or f"{d_base.group(1)} + (" not in edge.split("const int m0_")[1], edge


def test_padded_max_pool_keeps_its_window_rolled():
    text, = contraction_texts(NHWC_MAX_POOL, {"X": (1, 16, 16, 64)}, avx2_cpu())
    assert "Interior" in text and "#pragma unroll" not in text, text
    # Other sums over constrained indices keep their unrolled loops (a defracted reshape's
    # nine constrained indices ran several times slower rolled).
    sum_pool = NHWC_MAX_POOL.replace(">(X", "+(X")
    text, = contraction_texts(sum_pool, {"X": (1, 16, 16, 64)}, avx2_cpu())
    assert "Interior" in text and "#pragma unroll" in text, text


RUNS = {
    "nhwc_halo": (NHWC_HALO, {"D": (2, 14, 14, 16), "K": (3, 3, 16, 24)},
                  {"x": 3, "y": 5, "co": 16, "ci": 8}),
    "nhwc_stride2": (NHWC_S2, {"D": (1, 13, 13, 8), "K": (3, 3, 8, 16)},
                     {"x": 2, "y": 4, "co": 16}),
    "shifted_matmul": (SHIFTED_MATMUL, {"A": (16, 13), "B": (13, 33)}, {"m": 3, "n": 16}),
    "nhwc_max_pool": (NHWC_MAX_POOL, {"X": (1, 16, 16, 40)}, {"x0": 3, "x1": 3, "c": 16}),
}


@needs_device
@pytest.mark.parametrize("name", sorted(RUNS))
@pytest.mark.parametrize("forced", [True, False])
def test_based_reads_compute_the_reference(name, forced):
    run_tiled(*RUNS[name], forced)
