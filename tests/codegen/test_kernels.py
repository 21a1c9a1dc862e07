"""Every program is compiled to OpenCL, run on the CPU device with its outputs poisoned first,
and compared with the numpy reference on random inputs."""

from __future__ import annotations

import numpy as np
import pytest

import tilec
from tilec.config import Config
from tilec.lang.reference import random_array

from ..device import needs_device
from ..kernel_cases import CASES, INT_CASES

pytestmark = needs_device


def run_case(src: str, shapes: dict, *, dtype: str = "float32", seed: int = 0,
             **config) -> tilec.compiler.Executable:
    from tilec.compiler import compile as tile_compile

    exe = tile_compile(src, shapes, dtype=dtype, config=Config(**config))
    check_run(exe, seed)
    return exe


def run_tiled(src: str, shapes: dict, tile: dict, forced: bool) -> None:
    """`run_case` with the tile `tile` forced on every contraction, or searched."""
    run_case(src, shapes, tiles={"*": tile} if forced else {}, use_disk_cache=False,
             use_tuning_records=False)


def check_run(exe, seed: int = 0) -> tuple[dict, dict]:
    """Run `exe` on random inputs with its outputs poisoned first and check the outputs
    against the numpy reference; the inputs and outputs, for comparisons with other runs."""
    rng = np.random.default_rng(seed)
    arrays = {n: random_array(rng, exe.program.tensors[n].shape, exe.program.tensors[n].dtype)
              for n in exe.program.inputs}
    outs = exe.run(arrays, poison=True)
    for name, arr in outs.items():
        assert not np.isnan(arr).any() if arr.dtype.kind == "f" else True, name
    v = exe.check(exe._inputs(arrays), outs)
    assert v.ok, v.worst
    return arrays, outs


@pytest.mark.parametrize("name", sorted(CASES))
def test_program_cpu_model(name):
    src, shapes = CASES[name]
    run_case(src, shapes)


@pytest.mark.parametrize("name", sorted(CASES))
def test_program_gpu_model_local_staging(name):
    """The GPU path (local staging, many threads, float4) on the CPU device."""
    src, shapes = CASES[name]
    run_case(src, shapes, hw="nvidia-h100", seed=1)


@pytest.mark.parametrize("name", ["matmul_odd", "conv_same_relu", "maxpool", "depthwise",
                                  "conv_strided", "argmax_cond", "softmax"])
def test_program_seed_model_scalar(name):
    src, shapes = CASES[name]
    run_case(src, shapes, hw="seed-example", seed=2)


@pytest.mark.parametrize("name", sorted(INT_CASES))
def test_int_programs(name):
    src, shapes = INT_CASES[name]
    run_case(src, shapes, dtype="int32")


def test_float16_inputs():
    src, shapes = CASES["conv_bias_relu"]
    exe = run_case(src, shapes, dtype="float16")
    assert exe.program.tensors["R"].dtype == "float16"


def test_output_poison_is_overwritten_everywhere():
    # A strided output: odd elements come from the initialisation kernel, even ones from the
    # contraction; poison (NaN) must be gone from all of them.
    src, shapes = CASES["strided_output"]
    exe = run_case(src, shapes)
    assert [k.kind for k in exe.kernels] == ["init", "contraction"]


def test_fused_relu_is_one_kernel_and_intermediate_not_written():
    src, shapes = CASES["conv_same_relu"]
    # (Without the filter's relaid copy, a kernel of its own: `plan.pack`.)
    exe = run_case(src, shapes, pack_panels=False)
    assert len(exe.kernels) == 1
    assert exe.kernels[0].args[-1] == "R" and "O" not in exe.kernels[0].args


@pytest.mark.parametrize("tile", [
    {"ci": 8, "co": 2, "i": 1, "j": 3, "n": 1, "x": 4, "y": 2},
    {"ci": 4, "co": 6, "i": 3, "j": 1, "n": 2, "x": 1, "y": 7},
    {"ci": 8, "co": 4, "i": 2, "j": 2, "n": 2, "x": 3, "y": 3},
])
@pytest.mark.parametrize("hw", ["pocl-cpu", "nvidia-h100", "seed-example"])
def test_forced_partial_tiles(tile, hw):
    src, shapes = CASES["conv_same_relu"]
    run_case(src, shapes, hw=hw, tiles={"*": tile})


def test_odd_tiles_get_full_work_groups():
    # 7x7 spatial tiles do not split evenly over power-of-two threads: the extra threads repeat
    # the tile's last point and must never store it.
    src, shapes = CASES["conv_same_relu"]
    tile = {"ci": 8, "co": 2, "i": 3, "j": 3, "n": 1, "x": 7, "y": 7}
    exe = run_case(src, {"D": (2, 14, 14, 8), "K": (3, 3, 2, 8)}, hw="nvidia-h100",
                   tiles={"*": tile})
    (k,) = exe.kernels
    assert k.local_size >= 32 and "min(w_" in exe.source
