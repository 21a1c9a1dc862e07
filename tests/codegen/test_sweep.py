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

from ..device import CPU, needs_device
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
    cfg = dict(device=CPU, hw="pocl-cpu", tiles={"*": tile}, use_disk_cache=False,
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


# -- the rules of the 512 KiB L2 (Zen 3): streamed rows within half of L2, windows merged ------

RESNET_14 = (
    "function (I[N, X, Y, CI], F[KH, KW, CI, CO]) -> (O) {\n"
    "  O[n, x0, x1, co : N, X, Y, CO] =\n"
    "      +(I[n, x0 + k0 - 1, x1 + k1 - 1, ci] * F[k0, k1, ci, co]);\n"
    "}")
RESNET_14_SHAPES = {"I": (1, 14, 14, 256), "F": (3, 3, 256, 256)}
RESNET_14_TILE = {"ci": 64, "co": 8, "k0": 3, "k1": 3, "x0": 1, "x1": 14}
TALL = {"A": (512, 512), "B": (512, 64)}  # the matmul case with 128 row tiles


def _l2(kib: int) -> HwModel:
    import dataclasses

    return dataclasses.replace(HwModel.load("pocl-cpu"), l2_bytes=kib * 1024)


def test_window_elems_merges_a_window_with_its_pixels():
    """A 14-pixel row under a 3-wide window reads 16 pixels a row (NHWC: one span of 16 x 256
    channels, then the rows a row apart), not 14 x 3; the filter's indices are its product."""
    from tilec.plan.flatten import flatten
    from tilec.plan.sweep import largest_panel, panel_elems, window_elems

    program = tilec.check_program(RESNET_14, RESNET_14_SHAPES, "float32")
    flat = flatten(program.ops[0], program.tensors)
    T = np.array([[RESNET_14_TILE.get(n, 1) for n in flat.names]], np.int64)
    image, filt = flat.inputs
    # the rows' span: 16 pixels of 256 channels, three rows a row (14 pixels) apart
    assert window_elems(flat, image, T)[0] == 256 * 16 + 256 * 14 * 2
    assert panel_elems(flat, image, tuple(T[0])) == 14 * 3 * 3 * 256  # the plain product
    assert window_elems(flat, filt, T)[0] == 3 * 3 * 256 * 8
    big, _ = largest_panel(flat, T)
    assert flat.inputs[int(big[0])] is filt


def test_a_windowed_image_is_streamed_and_the_filter_block_kept():
    """resnet's 14x14 3x3 layer: the filter block stays in L1 and the rows are swept (the
    image had been counted 14 x 3 x 3 pixels and kept, the 2.4 MB filter streamed)."""
    text, = _texts(RESNET_14, RESNET_14_SHAPES, RESNET_14_TILE, _l2(512))
    assert re.search(r"sweep: \d+ register tiles along x0 per work-item", text), text


def test_streamed_rows_stay_within_half_of_l2():
    """A 512 x 512 x 64 matmul swept along m (4-row tiles of A, 8 KB each over the
    reduction): a 1 MiB L2 holds the 32 tiles the partial sums allow (256 KB), a 64 KiB one 4
    (32 KB), a 40 KiB one 2 (16 KB of its 20)."""
    src, _, tile, _ = CASES["matmul"]
    shapes = TALL
    for kib, tiles in ((1024, 32), (64, 4), (40, 2)):
        text, = _texts(src, shapes, tile, _l2(kib))
        found = re.search(r"sweep: (\d+) register tiles along m", text)
        assert (int(found.group(1)) if found else 0) == tiles, (kib, text[:1500])


def test_no_l2_cap_where_the_next_work_item_reads_other_rows():
    """The cap holds only where consecutive work-items read the same streamed rows: with the
    groups running along m (A's rows) the next work-item reads other rows anyway."""
    from tilec.plan.flatten import flatten
    from tilec.plan.sweep import sweep_many

    src, _, tile, _ = CASES["matmul"]
    program = tilec.check_program(src, TALL, "float32")
    flat = flatten(program.ops[0], program.tensors)
    T = np.array([[tile.get(n, 1) for n in flat.names]], np.int64)
    m, n = flat.names.index("m"), flat.names.index("n")
    args = dict(vec_index=n, lanes=np.array([8]), acc=np.array([16]), es=4,
                groups=np.array([256]))
    hw = _l2(64)
    _, shared = sweep_many(flat, T, hw, fastest=np.array([n]), **args)
    _, apart = sweep_many(flat, T, hw, fastest=np.array([m]), **args)
    _, unknown = sweep_many(flat, T, hw, **args)
    assert (int(shared[0]), int(apart[0]), int(unknown[0])) == (4, 32, 32)


@needs_device
def test_a_sweep_capped_by_l2_computes_the_product():
    """The capped sweep (a 64 KiB L2) against numpy, outputs poisoned."""
    src, _, tile, _ = CASES["matmul"]
    shapes = TALL
    hw = _l2(64)
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "small-l2.toml"
    path.write_text(hw.to_toml())
    exe = run_case(src, shapes, device=CPU, hw=str(path), tiles={"*": tile},
                   use_disk_cache=False, use_tuning_records=False)
    assert "sweep: 4 register tiles along m" in exe.source
