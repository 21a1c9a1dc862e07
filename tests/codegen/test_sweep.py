"""CPU sweeps (`plan.sweep`): a work-item runs several register tiles along an output index,
one reduction block at a time, their partial sums in private memory between blocks.  Texts are
checked device-free; the runs compare with the numpy reference (outputs poisoned) and with the
same program compiled without sweeps."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tilec
from tilec.codegen.generate import generate
from tilec.config import Config
from tilec.plan.fuse import plan_kernels
from tilec.plan.hw import HwModel

from ..device import needs_device
from .test_kernels import run_case

CONV = """function (I[N, CI, H, W], F[CO, CI, KH, KW], B[CO, U, V]) -> (R) {
  O[n, co, x0, x1 : N, CO, H, W] = +(I[n, ci, x0 + k0 - 1, x1 + k1 - 1] * F[co, ci, k0, k1]);
  R = relu(O + B);
}"""
MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"
MAX_PLUS = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = >(A[m, k] + B[k, n]); }"

CASES = {
    # whole rows of 4-pixel tiles (x1 swept), the bias and ReLU in the last block
    "conv_rows": (CONV, {"I": (1, 64, 16, 16), "F": (64, 64, 3, 3), "B": (64, 1, 1)},
                  {"ci": 8, "co": 16, "x1": 4, "x0": 1}, "x1"),
    # rows as wide as the tile (x0 swept), two blocked reductions (ci and k0), batch 2
    "conv_columns": (CONV, {"I": (2, 64, 7, 7), "F": (64, 64, 3, 3), "B": (64, 1, 1)},
                     {"ci": 16, "k0": 1, "co": 16, "x1": 7, "x0": 1, "n": 1}, "x0"),
    "matmul": (MATMUL, {"A": (64, 512), "B": (512, 64)}, {"k": 32, "n": 32, "m": 4}, "m"),
    # a max-plus product: the partial maxima start from the aggregation's identity
    "max_plus": (MAX_PLUS, {"A": (64, 512), "B": (512, 64)}, {"k": 32, "n": 32, "m": 4}, "m"),
}


def _texts(src: str, shapes: dict, tile: dict | None, hw: HwModel) -> list[str]:
    plan = plan_kernels(tilec.check_program(src, shapes, "float32"))
    config = Config(use_disk_cache=False, tiles={"*": tile} if tile else {})
    sources, _ = generate(plan, hw, config)
    return [s.text for s in sources if s.kind == "contraction"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_sweep_text(name):
    src, shapes, tile, index = CASES[name]
    text, = _texts(src, shapes, tile, HwModel.load("pocl-cpu"))
    assert re.search(rf"sweep: \d+ register tiles along {index} per work-item", text), text
    loop = re.search(rf"for \(int s_{index} = 0; s_{index} < (\d+);", text)
    assert loop, text
    # zero in the first block, the kept sums after; kept again or finished at the end
    assert re.search(r"a_0 = \(r_\w+ == 0[^?]*\) \? .* : part\[s_\w+ \* \d+ \+ 0\];", text)
    assert re.search(r"if \(!\(r_\w+ == \d+.*\)\) \{\n\s+part\[", text)
    if name == "conv_columns":  # both blocked reductions take part in first and last
        assert "(r_ci == 0 && r_k0 == 0)" in text and "r_ci == 48 && r_k0 == 2" in text


def test_no_sweep_where_the_panel_fits_l1_or_on_gpus():
    src, shapes, tile, _ = CASES["conv_rows"]
    small = {"I": (1, 8, 16, 16), "F": (16, 8, 3, 3), "B": (16, 1, 1)}  # 8x9x16 floats
    text, = _texts(src, small, {"ci": 4, "co": 16, "x1": 4, "x0": 1}, HwModel.load("pocl-cpu"))
    assert "sweep" not in text and "part[" not in text
    gpu, = _texts(src, shapes, None, HwModel.load("nvidia-h100"))
    assert "sweep" not in gpu and "part[" not in gpu


def test_sweep_leaves_work_groups_for_every_core():
    """Four work-groups a compute unit stay: 256 groups are swept 4 to 1 on 2 or 16 units,
    not at all on 64."""
    import dataclasses

    src, shapes, tile, _ = CASES["conv_rows"]
    for units, swept in ((2, True), (16, True), (64, False)):
        hw = dataclasses.replace(HwModel.load("pocl-cpu"), compute_units=units)
        text, = _texts(src, shapes, tile, hw)
        assert ("sweep: 4 register tiles" in text) == swept, units


@needs_device
@pytest.mark.parametrize("name", sorted(CASES))
def test_sweep_computes_what_the_unswept_kernel_does(name, monkeypatch):
    src, shapes, tile, _ = CASES[name]
    cfg = dict(hw="pocl-cpu", tiles={"*": tile}, use_disk_cache=False,
               use_tuning_records=False)
    swept = run_case(src, shapes, **cfg)  # against numpy, outputs poisoned
    assert "sweep:" in swept.source
    import tilec.plan.schedule as schedule

    monkeypatch.setattr(schedule, "choose_sweep", lambda *a, **k: None)
    plain = run_case(src, shapes, **cfg)
    assert "sweep:" not in plain.source
    rng = np.random.default_rng(5)
    arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    a, b = swept.run(arrays, poison=True), plain.run(arrays, poison=True)
    for k in a:
        scale = float(np.abs(b[k]).max())
        assert np.abs(a[k] - b[k]).max() <= 1e-5 * scale, k
