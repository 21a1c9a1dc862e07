"""The GPU forms of staged contractions (`plan.gpu_form`): runs of accumulator points read as
one vector from local memory, and the pipelined reduction loop.  Every program of the kernel
suite is compiled with them forced on, with tiles that leave several (and ragged) reduction
tiles so the pipeline's prefetch and double buffers are exercised, and run against numpy on
the CPU device with poisoned outputs; the same kernels without the forms are run too."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tilec
from tilec.config import Config
from tilec.plan.fuse import plan_kernels
from tilec.plan.gpu_form import PIPELINE_COPIES, PIPELINE_MIN_TRIPS, pipeline_fits
from tilec.plan.hw import HwModel
from tilec.plan.schedule import make_schedule

from ..device import needs_device
from ..kernel_cases import CASES, INT_CASES
from .test_kernels import run_case


def _tiles(src: str, shapes: dict, dtype: str = "float32") -> dict:
    """Per contraction: reduction tiles a quarter of the range (four trips, the last ragged
    where the range is not a multiple), output tiles of at most 8."""
    prog = tilec.check_program(src, shapes, dtype=dtype)
    out = {}
    for k in plan_kernels(prog).kernels:
        flat = getattr(k, "flat", None)
        if flat is None:
            continue
        out[k.name] = {n: (max(1, -(-r // 4)) if i in flat.reduce_indices else min(r, 8))
                       for i, (n, r) in enumerate(zip(flat.names, flat.ranges, strict=True))}
    return out


@needs_device
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("forms", [True, False])
def test_program_with_gpu_forms(name, forms):
    src, shapes = CASES[name]
    run_case(src, shapes, hw="nvidia-h100", seed=3, gpu_forms=forms,
             tiles=_tiles(src, shapes), use_tuning_records=False)


@needs_device
@pytest.mark.parametrize("name", sorted(INT_CASES))
def test_int_program_with_gpu_forms(name):
    src, shapes = INT_CASES[name]
    run_case(src, shapes, dtype="int32", hw="nvidia-h100", seed=4, gpu_forms=True,
             tiles=_tiles(src, shapes, "int32"), use_tuning_records=False)


MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"


@needs_device
@pytest.mark.parametrize("shape,tile,runs", [
    ((128, 96, 128), {"k": 16, "m": 64, "n": 64}, True),  # whole tiles: runs and pipeline
    ((130, 100, 70), {"k": 16, "m": 64, "n": 32}, True),  # partial tiles, ragged reduction
    # 32 x 32 on 256 threads: a point a thread along m, so no runs; four short trips
    ((64, 16, 64), {"k": 4, "m": 32, "n": 32}, False),
])
def test_matmul_runs_and_pipeline(shape, tile, runs):
    m, k, n = shape
    exe = run_case(MATMUL, {"A": (m, k), "B": (k, n)}, hw="nvidia-h100", seed=5,
                   gpu_forms=True, tiles={"*": tile}, use_tuning_records=False)
    assert "pipelined:" in exe.source
    assert ("runs: A read 4 points along m" in exe.source) == runs
    if runs:
        assert "runs: A read 4 points along m" in exe.source
        assert "*((__local const float4*)(c_0 + (" in exe.source  # a run in one read
    assert exe.source.count("barrier(CLK_LOCAL_MEM_FENCE)") == 2  # one before, one a tile


@needs_device
def test_padded_conv_pipelined_with_bounds_tests():
    src, shapes = CASES["conv_same_relu"]
    exe = run_case(src, shapes, hw="nvidia-h100", seed=6, gpu_forms=True,
                   tiles=_tiles(src, shapes), use_tuning_records=False)
    assert "pipelined:" in exe.source
    assert ">= 0 && (" in exe.source  # the halo's elements bounds-tested as they are read


# -- device-free: when the forms apply -------------------------------------------------------

def _matmul_flat(m: int, k: int, n: int):
    prog = tilec.check_program(MATMUL, {"A": (m, k), "B": (k, n)})
    return plan_kernels(prog).kernels[0].flat


def test_schedule_forms_on_gpu_model_only():
    flat = _matmul_flat(512, 512, 512)
    tile = (16, 128, 128)  # k, m, n
    gpu = HwModel.load("nvidia-h100")
    s = make_schedule(flat, tile, gpu)
    assert s.pipeline and s.run is not None
    assert flat.names[s.run.index] == "m" and flat.inputs[s.run.input].name == "A"
    assert s.acc_counts()[s.run.index] == 8  # 16 threads x 8 points (two runs of 4)
    assert not make_schedule(flat, tile, gpu, gpu_forms=False).pipeline
    cpu = HwModel.load("pocl-cpu")
    s = make_schedule(flat, tile, cpu)
    assert not s.pipeline and s.run is None  # CPUs read through the cache


def test_no_pipeline_for_one_tile_or_small_local_memory():
    flat = _matmul_flat(64, 16, 64)
    gpu = HwModel.load("nvidia-h100")
    assert not make_schedule(flat, (16, 64, 64), gpu).pipeline  # one reduction tile
    assert not make_schedule(flat, (8, 64, 64), gpu).pipeline  # two
    assert make_schedule(flat, (4, 64, 64), gpu).pipeline
    small = dataclasses.replace(gpu, local_mem_bytes=2048)
    assert not make_schedule(flat, (4, 64, 64), small).pipeline  # halves would not fit


def test_no_runs_where_points_are_not_whole_runs():
    flat = _matmul_flat(64, 64, 64)
    s = make_schedule(flat, (16, 6, 64), HwModel.load("nvidia-h100"))
    assert s.run is None


def test_pipeline_fits_limits():
    assert not pipeline_fits([64], [64], 64, PIPELINE_MIN_TRIPS - 1, 0)  # too few tiles
    assert pipeline_fits([64], [64], 64, PIPELINE_MIN_TRIPS, 0)
    assert not pipeline_fits([PIPELINE_COPIES * 64 + 1], [2000], 64, 4, 0)
    assert pipeline_fits([100], [1000], 64, 4, 8000)  # 2 x 4 x 1000 bytes
    assert not pipeline_fits([100], [1001], 64, 4, 8000)  # rounded up to 1004: 8032


@needs_device
def test_forms_match_plain_kernel_exactly_on_integers():
    """The transformed kernel against the untransformed one: integer products are exact."""
    shapes = {"A": (96, 40), "B": (40, 64)}
    rng = np.random.default_rng(9)
    arrays = {n: rng.integers(-50, 50, s).astype(np.int32) for n, s in shapes.items()}
    outs = []
    for forms in (True, False):
        cfg = Config(hw="nvidia-h100", gpu_forms=forms, use_tuning_records=False,
                           tiles={"*": {"k": 8, "m": 32, "n": 32}})
        exe = tilec.compile(MATMUL, shapes, dtype="int32", hw="nvidia-h100", config=cfg)
        assert ("pipelined:" in exe.source) == forms
        outs.append(exe.run(arrays, poison=True)["C"])
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], arrays["A"] @ arrays["B"])


CONV = """function (D[N, X, Y, CI], K[I, J, CO, CI]) -> (R) {
  O[n, x, y, co : N, X, Y, CO] = +(D[n, x+i-1, y+j-1, ci] * K[i, j, co, ci]);
  R = (O > 0 ? O : 0);
}"""


@needs_device
@pytest.mark.parametrize("tile,runs", [
    ({"ci": 8, "co": 16, "i": 1, "j": 1, "n": 1, "x": 8, "y": 32}, True),  # runs along y
    # a halo in the tile; 64 output threads, so the reduction is split (not pipelined)
    ({"ci": 4, "co": 16, "i": 1, "j": 3, "n": 1, "x": 2, "y": 8}, False),
    ({"ci": 8, "co": 16, "i": 3, "j": 3, "n": 2, "x": 3, "y": 12}, False),  # ragged x
])
def test_padded_conv_as_a_matmul(tile, runs):
    """With enough points a thread, the filter (stride CI along co) is gathered into local
    memory with co innermost, so the output channels are the vector index, and the image's
    tile has y innermost and is read four points at a time (the matmul form); without runs the
    vectors stay along ci."""
    shapes = {"D": (2, 8, 32, 16), "K": (3, 3, 16, 16)}  # ci tiles below CI: no merging
    exe = run_case(CONV, shapes, hw="nvidia-h100", seed=7, gpu_forms=True,
                   tiles={"*": tile}, use_tuning_records=False)
    assert ("vector: 4 lanes along co" in exe.source) == runs
    assert ("runs: D read 4 points along y" in exe.source) == runs
