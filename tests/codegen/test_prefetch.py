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

from ..device import needs_device
from .test_kernels import check_run
from .test_sweep import CASES as SWEPT

# A filter with the output channels last and no more of them than the tile takes: each
# block of input channels is one contiguous run (a packed filter panel's layout).
HWIO = """function (I[N, CI, H, W], F[CI, KH, KW, CO], B[CO, U, V]) -> (R) {
  O[n, co, x0, x1 : N, CO, H, W] = +(I[n, ci, x0 + k0 - 1, x1 + k1 - 1] * F[ci, k0, k1, co]);
  R = relu(O + B);
}"""
CASES = dict(SWEPT, hwio=(HWIO, {"I": (1, 128, 16, 16), "F": (128, 3, 3, 16), "B": (16, 1, 1)},
                          {"ci": 8, "co": 16, "x1": 4, "x0": 1}, "x1"))


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
    # the filter relaid with all 64 output channels last: a block's 16 are 64 apart, the
    # span four times what is read
    assert "TILEC_PREFETCH" not in _text("conv_rows", _hw(40 * 1024))
    # two blocked reductions (ci and k0): the next block is not one step of one loop
    assert "TILEC_PREFETCH" not in _text("conv_columns", _hw(40 * 1024))
    src, shapes, _, _ = CASES["conv_rows"]
    plan = plan_kernels(tilec.check_program(src, shapes, "float32"))
    gpu, _ = generate(plan, HwModel.load("nvidia-h100"), Config(use_disk_cache=False))
    assert not any("TILEC_PREFETCH" in s.text for s in gpu)


def test_prefetch_of_a_matrix_panel():
    """matmul: B[k, n] blocks of 32 k x 32 n, 64 apart: span 2016 for 1024 elements (within
    MAX_SPAN); the next block starts 32 rows on."""
    text = _text("matmul", _hw(40 * 1024))
    assert "if (r_k + 32 < 512) {" in text
    assert "pf = b_B + (p_n_0 + 64 * (r_k + 32));" in text
    assert "l < min(2031, (s_m + 1) * 512); l += 16)" in text


@needs_device
@pytest.mark.parametrize("name", ["hwio", "matmul", "max_plus"])
def test_prefetching_kernel_against_numpy_and_without(name):
    src, shapes, tile, _ = CASES[name]
    from tilec.compiler import compile as tile_compile

    cfg = Config(tiles={"*": tile}, use_disk_cache=False, use_tuning_records=False)
    fetching = tile_compile(src, shapes, hw=_hw(40 * 1024), config=cfg)
    plain = tile_compile(src, shapes, hw=_hw(), config=cfg)
    assert "TILEC_PREFETCH(pf + l)" in fetching.source
    assert "TILEC_PREFETCH" not in plain.source
    arrays, a = check_run(fetching, seed=11)  # against numpy, outputs poisoned
    b = plain.run(arrays, poison=True)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
