"""Software prefetch of a swept CPU kernel's next reduction block (`codegen.prefetch`): texts
device-free, and the prefetching kernels on the CPU device against numpy (outputs poisoned)
and against the same program compiled without the prefetches."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tilec
from tilec.codegen.generate import generate
from tilec.config import Config
from tilec.plan.fuse import plan_kernels
from tilec.plan.hw import HwModel

from ..device import CPU, needs_device
from .test_kernels import check_run
from .test_sweep import CASES as SWEPT

# A filter with the output channels last and no more of them than the tile takes: each
# block of input channels is one contiguous run (a packed filter panel's layout).
HWIO = """function (I[N, CI, H, W], F[CI, KH, KW, CO], B[CO, U, V]) -> (R) {
  O[n, co, x0, x1 : N, CO, H, W] = +(I[n, ci, x0 + k0 - 1, x1 + k1 - 1] * F[ci, k0, k1, co]);
  R = relu(O + B);
}"""
# The window taps outermost (a channels-last filter panel): a block of input channels is one
# run of channels x output channels for each tap, the taps a whole panel apart.
TAPS = """function (I[N, H, W, CI], F[KH, KW, CI, CO], B[CO]) -> (R) {
  O[n, x0, x1, co : N, H, W, CO] = +(I[n, x0 + k0 - 1, x1 + k1 - 1, ci] * F[k0, k1, ci, co]);
  R = relu(O + B);
}"""
CASES = dict(SWEPT, hwio=(HWIO, {"I": (1, 128, 16, 16), "F": (128, 3, 3, 16), "B": (16, 1, 1)},
                          {"ci": 8, "co": 16, "x1": 4, "x0": 1}, "x1"),
             taps=(TAPS, {"I": (1, 16, 16, 128), "F": (3, 3, 128, 32), "B": (32,)},
                   {"ci": 8, "co": 32, "x1": 8, "x0": 1}, "x1"))


def _hw(l2_bytes: int | None = None) -> HwModel:
    hw = HwModel.load("pocl-cpu")
    return hw if l2_bytes is None else dataclasses.replace(hw, l2_bytes=l2_bytes)


def _text(name: str, hw: HwModel) -> str:
    src, shapes, tile, _ = CASES[name]
    plan = plan_kernels(tilec.check_program(src, shapes, "float32"))
    sources, _ = generate(plan, hw, Config(use_disk_cache=False, tiles={"*": tile}))
    text, = [s.text for s in sources if s.kind == "contraction"]
    return text


def test_prefetch_text_of_a_filter_past_l2():
    """hwio: filter 128x3x3x16 (74 KB) past a 40 KB L2; blocks of 8 input channels (8 x 9 x
    16: 1152 elements, contiguous), 4 sweep tiles of 19 lines each (73 lines reach the
    block's last element from any start); the last block prefetches nothing."""
    text = _text("hwio", _hw(40 * 1024))
    assert "#define TILEC_PREFETCH(p) __builtin_prefetch((p), 0, 2)" in text
    assert "if (r_ci + 8 < 128) {" in text
    assert "__global const float* pf = b_F + (p_co_0 + 144 * (r_ci + 8));" in text
    assert "for (int l = s_x1 * 304; l < min(1167, (s_x1 + 1) * 304); l += 16) " \
           "TILEC_PREFETCH(pf + l);" in text
    # inside the sweep loop, before the tile's reads
    sweep = text.index("for (int s_x1 = 0;")
    assert sweep < text.index("TILEC_PREFETCH(pf + l)") < text.index("for (int u_")


def test_no_prefetch_where_the_input_fits_l2_or_blocks_are_not_one_step():
    assert "TILEC_PREFETCH" not in _text("hwio", _hw())  # a 1 MiB L2 holds the filter
    # an OIHW filter: a block is a run of 8 x 3 x 3 elements (under MIN_RUN lines) for each
    # of 16 output channels, 576 apart
    assert "TILEC_PREFETCH" not in _text("conv_rows", _hw(40 * 1024))
    # two blocked reductions (ci and k0): the next block is not one step of one loop
    assert "TILEC_PREFETCH" not in _text("conv_columns", _hw(40 * 1024))
    src, shapes, _, _ = CASES["conv_rows"]
    plan = plan_kernels(tilec.check_program(src, shapes, "float32"))
    gpu, _ = generate(plan, HwModel.load("nvidia-h100"), Config(use_disk_cache=False))
    assert not any("TILEC_PREFETCH" in s.text for s in gpu)


def test_prefetch_of_a_matrix_panel():
    """matmul: B[k, n] blocks of 32 k x 32 n, 64 apart: span 2016 for 1024 elements (within
    MAX_SPAN); the next block starts 32 rows on.  The 40 KB L2 also caps the sweep at 2
    tiles of A's rows (4 x 512 floats each: 16 KB of the L2's 20 KB half), so each tile
    prefetches half of the block."""
    text = _text("matmul", _hw(40 * 1024))
    assert "sweep: 2 register tiles along m" in text
    assert "if (r_k + 32 < 512) {" in text
    assert "pf = b_B + (p_n_0 + 64 * (r_k + 32));" in text
    assert "l < min(2031, (s_m + 1) * 1024); l += 16)" in text


def test_prefetch_of_a_block_in_runs():
    """taps: blocks of 8 input channels x 32 output channels (256 elements: 16 lines, 17 from
    any start) at each of the 9 taps, 4096 apart: 153 lines, 2 sweep tiles of 77."""
    text = _text("taps", _hw(40 * 1024))
    assert "if (r_ci + 8 < 128) {" in text
    assert "pf = b_F + (p_co_0 + 32 * (r_ci + 8));" in text
    assert ("for (int l = s_x1 * 77; l < min(153, (s_x1 + 1) * 77); l += 1) TILEC_PREFETCH("
            "pf + 4096 * ((l / 17) % 3) + 12288 * ((l / 17) / 3) + 16 * (l % 17));") in text


def test_no_prefetch_in_runs_too_short_or_overlapping():
    from tilec.codegen.prefetch import MIN_RUN, _in_runs

    # runs of 2 lines: a prefetch for every 32 elements read
    assert _in_runs(["head"], [(1, 32), (64, 9)], 16, 4, "s") == []
    assert MIN_RUN * 16 > 32 and MIN_RUN * 16 <= 128
    # a second dimension inside the first's reach: lines would be fetched twice
    assert _in_runs(["head"], [(1, 128), (150, 4), (300, 3)], 16, 4, "s") == []
    assert _in_runs(["head"], [(1, 128), (150, 2), (300, 3)], 16, 4, "s") != []


@needs_device
@pytest.mark.parametrize("name", ["hwio", "matmul", "max_plus", "taps"])
def test_prefetching_kernel_against_numpy_and_without(name):
    src, shapes, tile, _ = CASES[name]
    from tilec.compiler import compile as tile_compile

    cfg = Config(device=CPU, tiles={"*": tile}, use_disk_cache=False,
                 use_tuning_records=False)
    fetching = tile_compile(src, shapes, hw=_hw(40 * 1024), config=cfg)
    plain = tile_compile(src, shapes, hw=_hw(), config=cfg)
    assert "TILEC_PREFETCH(pf + " in fetching.source
    assert "TILEC_PREFETCH" not in plain.source
    arrays, a = check_run(fetching, seed=11)  # against numpy, outputs poisoned
    b = plain.run(arrays, poison=True)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
