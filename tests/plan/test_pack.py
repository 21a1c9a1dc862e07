"""Packed panels (`plan.pack`): which operands are packed, and the packed program computes
what the program as written does (numpy reference of both, random inputs)."""

from __future__ import annotations

import numpy as np
import pytest

from tilec.codegen.generate import packed
from tilec.config import Config
from tilec.lang import ir
from tilec.lang.api import check_program
from tilec.lang.reference import evaluate_program, random_array
from tilec.plan.fuse import plan_kernels
from tilec.plan.group_order import cpu_group_order
from tilec.plan.hw import HwModel
from tilec.plan.schedule import make_schedule
from tilec.plan.search import search

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"
GEMM_RELU = """function (A[M, K], B[K, N], bias[N]) -> (R) {
  C[m, n : M, N] = +(A[m, k] * B[k, n]);
  R = (C + bias > 0 ? C + bias : 0);
}"""
CPU = HwModel.load("pocl-cpu")
CONFIG = Config(use_disk_cache=False, use_tuning_records=False)


def _same_outputs(src: str, shapes: dict, hw: HwModel = CPU, config: Config = CONFIG):
    """The packed program, after checking its outputs against the program as written."""
    program = check_program(src, shapes)
    out = packed(program, hw, config)
    rng = np.random.default_rng(3)
    arrays = {n: random_array(rng, program.tensors[n].shape, "float32") for n in program.inputs}
    want = evaluate_program(program, arrays)
    got = evaluate_program(out, arrays)
    for name in program.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)
    return program, out


def _packs(program: ir.Program) -> list[ir.Contraction]:
    return [op for op in program.ops if isinstance(op, ir.Contraction) and op.agg == "="
            and op.output.endswith("_panels")]


def test_reused_operand_is_packed_in_register_tile_panels():
    n = 768  # B is 2.25 MB, more than the model's L2
    shapes = {"A": (128, n), "B": (n, n)}
    program, out = _same_outputs(MATMUL, shapes)
    (pack,) = _packs(out)
    assert pack.inputs[0].tensor == "B"
    panels = out.tensors[pack.output].shape
    # The panel width is the vector tile the search gives the product as written.
    flat = plan_kernels(program).kernels[0].flat
    tile = search(flat, CPU).tile
    sched = make_schedule(flat, tile, CPU)
    nr = tile[sched.vec_index]
    assert panels == (n // nr, n, nr)
    product = out.ops[-1]
    assert product.inputs[1].tensor == pack.output and product.inputs[0].tensor == "A"
    assert len(out.ops) == 2


def test_post_ops_read_the_product_of_packed_panels():
    _, out = _same_outputs(GEMM_RELU, {"A": (160, 1024), "B": (1024, 384), "bias": (384,)})
    assert len(_packs(out)) == 1
    kernels = plan_kernels(out).kernels
    assert [len(k.post_ops) for k in kernels if hasattr(k, "post_ops")][-1] == 1


@pytest.mark.parametrize("shapes, why", [
    ({"A": (1, 4096), "B": (4096, 512)}, "one row: each panel read by one work-group"),
    ({"A": (24, 4096), "B": (4096, 512)}, "24 rows: each panel read by a few work-groups"),
    ({"A": (256, 256), "B": (256, 256)}, "B fits L2"),
])
def test_left_as_written(shapes, why):
    program, out = _same_outputs(MATMUL, shapes)
    assert out is program, why


def test_a_scalar_product_is_left_as_written():
    src = "function (A[N], B[N]) -> (C) { C[] = +(A[i] * B[i]); }"
    program, out = _same_outputs(src, {"A": (1 << 20,), "B": (1 << 20,)})
    assert out is program


def test_gpu_models_and_the_switch_and_forced_tiles_leave_it():
    shapes = {"A": (256, 1024), "B": (1024, 1024)}
    program = check_program(MATMUL, shapes)
    assert packed(program, HwModel.load("nvidia-h100"), CONFIG) is program
    from dataclasses import replace
    assert packed(program, CPU, replace(CONFIG, pack_panels=False)) is program
    forced = replace(CONFIG, tiles={"C": {"m": 4, "n": 16, "k": 256}})
    assert packed(program, CPU, forced) is program


def test_one_packed_copy_for_two_products_of_one_operand():
    src = """function (A[M, K], D[M, K], B[K, N]) -> (C, E) {
      C[m, n : M, N] = +(A[m, k] * B[k, n]);
      E[m, n : M, N] = +(D[m, k] * B[k, n]);
    }"""
    _, out = _same_outputs(src, {"A": (128, 512), "D": (128, 512), "B": (512, 1024)})
    assert len(_packs(out)) == 1
    assert out.ops[1].inputs[1].tensor == out.ops[2].inputs[1].tensor == _packs(out)[0].output


def test_groups_keep_a_contiguous_panel_larger_than_l1():
    # 1024 x 16 panels: 64 KB, more than L1; B 4 MB, more than L2.
    program, out = _same_outputs(MATMUL, {"A": (128, 1024), "B": (1024, 1024)})
    kernel = plan_kernels(out).kernels[-1]
    flat = kernel.flat
    tile = search(flat, CPU).tile
    order = cpu_group_order(flat, tile, CPU.l1_bytes) or flat.out_indices
    assert flat.names[order[0]] == "m"  # the panel's groups run back to back
    # Renamed so that the flat order would walk the panels first, the order is kept.
    out2 = check_program(MATMUL.replace("m", "z").replace("M", "Z"),
                         {"A": (128, 1024), "B": (1024, 1024)})
    flat2 = plan_kernels(packed(out2, CPU, CONFIG)).kernels[-1].flat
    order2 = cpu_group_order(flat2, search(flat2, CPU).tile, CPU.l1_bytes)
    assert order2 is not None and flat2.names[order2[0]] == "z"
    # As written, B's panel is strided: the flat order stays.
    flat0 = plan_kernels(program).kernels[0].flat
    assert cpu_group_order(flat0, search(flat0, CPU).tile, CPU.l1_bytes) is None


def test_convolutions_are_left_without_a_search():
    """Weights that do not read the output's unit-stride index are not packed, and weights
    holding the output channels last need no relayout: no search is paid for them."""
    from tilec.plan.pack import pack_panels

    src = """function (D[N, CI, X, Y], W[CI, I, J, CO]) -> (O) {
      O[n, co, x, y : N, CO, X - 2, Y - 2] = +(D[n, ci, x + i, y + j] * W[ci, i, j, co]);
    }"""
    program = check_program(src, {"D": (1, 256, 16, 16), "W": (256, 3, 3, 256)})

    def no_search(flat):
        raise AssertionError("searched")

    assert pack_panels(program, CPU, no_search) is program


# Relayout (`choose_relayout`): an operand read along an output index at a stride.

NHWC_CONV = """function (D[N, X, Y, CI], K[I, J, CO, CI]) -> (R) {
  O[n, x, y, co : N, X, Y, CO] = +(D[n, x+i-1, y+j-1, ci] * K[i, j, co, ci]);
  R = (O > 0 ? O : 0);
}"""
NCHW_CONV = """function (D[N, CI, X, Y], W[CO, CI, I, J]) -> (O) {
  O[n, co, x, y : N, CO, X, Y] = +(D[n, ci, x+i-1, y+j-1] * W[co, ci, i, j]);
}"""
POINTWISE = """function (D[N, CI, X, Y], W[CO, CI]) -> (O) {
  O[n, co, x, y : N, CO, X, Y] = +(D[n, ci, x, y] * W[co, ci]);
}"""


def _relaid(program: ir.Program) -> list[ir.Contraction]:
    return [op for op in program.ops if isinstance(op, ir.Contraction) and op.agg == "="
            and op.output.endswith("_t")]


def _no_time_model(hw: HwModel) -> HwModel:
    """The model an uncalibrated CPU gets: no time predictions, so the structural rule."""
    from dataclasses import replace
    return replace(hw, peak_gflops=0.0)


@pytest.mark.parametrize("src, shapes, operand, moved", [
    (NHWC_CONV, {"D": (1, 14, 14, 32), "K": (3, 3, 32, 32)}, "K", (3, 3, 32, 32)),
    (NCHW_CONV, {"D": (1, 32, 14, 14), "W": (32, 32, 3, 3)}, "W", (32, 3, 3, 32)),
])
@pytest.mark.parametrize("timed", [True, False])
def test_filters_are_relaid_with_the_lane_index_last(src, shapes, operand, moved, timed):
    hw = CPU if timed else _no_time_model(CPU)
    program, out = _same_outputs(src, shapes, hw)
    (copy,) = _relaid(out)
    assert copy.inputs[0].tensor == operand
    assert out.tensors[copy.output].shape == moved
    product = [op for op in out.ops if op.output != copy.output][0]
    assert copy.output in [x.tensor for x in product.inputs]
    # The product as compile would build it: vectors along the index the copy put last.
    kernel = [k for k in plan_kernels(out).kernels if k.op.output == product.output][0]
    sched = make_schedule(kernel.flat, search(kernel.flat, hw).tile, hw)
    lane = kernel.flat.names[sched.vec_index]
    assert not sched.dot and lane == "co"


def test_activations_and_gpu_products_are_not_relaid():
    # The pixels keep the lanes, nothing is copied: where the vector divides them, and where
    # it does not (13 x 13: the last tile moves back, `Schedule.shift`).
    for hw in (CPU, _no_time_model(CPU)):
        for side in (16, 13):
            program, out = _same_outputs(POINTWISE, {"D": (1, 64, side, side), "W": (48, 64)},
                                         hw)
            assert not _relaid(out), side
    program = check_program(NCHW_CONV, {"D": (1, 32, 14, 14), "W": (32, 32, 3, 3)})
    assert packed(program, HwModel.load("nvidia-h100"), CONFIG) is program


@pytest.mark.parametrize("l2", [64 * 1024, None])
@pytest.mark.parametrize("timed", [True, False])
def test_relaid_filters_are_copied_in_panels_of_the_tile(timed, l2):
    """A relaid filter whose tile takes part of its channels is copied in panels of the
    tile's channels (`_in_panels`), larger than L2 or not: each work-item's panel is one
    block (a channels-last column's lines lie a row apart and share a few cache sets), and
    the groups that read it run one after another (the pixels vary fastest)."""
    from dataclasses import replace

    hw = CPU if l2 is None else replace(CPU, l2_bytes=l2)
    hw = hw if timed else _no_time_model(hw)
    program, out = _same_outputs(NCHW_CONV, {"D": (1, 64, 7, 7), "W": (64, 64, 3, 3)}, hw)
    assert not _relaid(out)
    (copy,) = _packs(out)
    assert copy.inputs[0].tensor == "W"
    nr = out.tensors[copy.output].shape[-1]
    assert out.tensors[copy.output].shape == (64 // nr, 64, 3, 3, nr) and 1 < nr < 64
    product = [op for op in out.ops if op.output == "O"][0]
    kernel = [k for k in plan_kernels(out).kernels if k.op.output == "O"][0]
    flat = kernel.flat
    tile = search(flat, hw).tile
    sched = make_schedule(flat, tile, hw)
    assert copy.output in [x.tensor for x in product.inputs]
    assert flat.names[sched.vec_index] == "coi"
    assert tile[flat.names.index("coi")] == nr
    order = [flat.names[k] for k in cpu_group_order(flat, tuple(tile), hw.l1_bytes)]
    assert order[:2] == ["x", "y"] and order[-1] == "coo", order


def test_a_filter_whose_tile_takes_every_channel_is_relaid_whole():
    """Eight output channels, one vector: the tile takes them all, so there is no panel to
    cut and the copy holds the channels last."""
    _, out = _same_outputs(NCHW_CONV, {"D": (1, 64, 7, 7), "W": (8, 64, 3, 3)}, CPU)
    (copy,) = _relaid(out)
    assert out.tensors[copy.output].shape == (64, 3, 3, 8) and not _packs(out)


def test_filter_panels_run_against_numpy():
    """The device runs a convolution reading its 4.7 MB filter in panels (larger than any
    x86 core's L2) and matches numpy, outputs poisoned first; padding and post-ops too."""
    from ..codegen.test_kernels import run_case

    src = """function (D[N, CI, X, Y], W[CO, CI, I, J], B[CO, U, V]) -> (R) {
      O[n, co, x, y : N, CO, X, Y] = +(D[n, ci, x+i-1, y+j-1] * W[co, ci, i, j]);
      R = relu(O + B);
    }"""
    # PoCL's CPU device (the default device on a GPU host would be the GPU, which packs
    # nothing).
    exe = run_case(src, {"D": (1, 256, 3, 5), "W": (512, 256, 3, 3), "B": (512, 1, 1)},
                   seed=5, device="Portable Computing Language")
    assert exe.hw.kind == "cpu"
    names = [k.name for k in exe.kernels]
    assert any("W_panels" in n for n in names), names


def test_small_filter_panels_run_against_numpy():
    """The seed convolution's layout (NHWC, the filter an input copied each call) with a
    64-channel filter far smaller than L2: read in panels of the tile's channels, it matches
    numpy on the device, outputs poisoned first."""
    from ..codegen.test_kernels import run_case

    src = """function (D[N, X, Y, CI], K[I, J, CO, CI]) -> (R) {
      O[n, x, y, co : N, X, Y, CO] = +(D[n, x+i-1, y+j-1, ci] * K[i, j, co, ci]);
      R = (O > 0 ? O : 0);
    }"""
    exe = run_case(src, {"D": (1, 10, 13, 64), "K": (3, 3, 64, 64)}, seed=7,
                   device="Portable Computing Language")
    assert exe.hw.kind == "cpu"
    names = [k.name for k in exe.kernels]
    assert any("K_panels" in n for n in names), names


@pytest.mark.parametrize("l2", [None, 64 * 1024])
def test_a_forced_tile_keeps_its_indices_and_still_gets_the_relaid_filter(l2):
    """A forced tile that names the indices as written keeps them: the filter is still
    relaid with the channels last (never in panels, which split `co`), so the forced tile
    gets the vector lanes the searched one gets.  Forcing the search's own choice, which
    names the panels' indices (`coi`, `coo`) where it reads panels, builds the same kernel."""
    from dataclasses import replace

    from tilec.codegen.generate import generate

    hw = CPU if l2 is None else replace(CPU, l2_bytes=l2)
    shapes = {"D": (1, 64, 7, 7), "W": (64, 64, 3, 3)}
    flat_tile = {"co": 32, "ci": 16, "i": 3, "j": 3, "x": 1, "y": 7, "n": 1}
    forced = replace(CONFIG, tiles={"O": flat_tile})
    program, out = _same_outputs(NCHW_CONV, shapes, hw, forced)
    (copy,) = _relaid(out)
    assert not _packs(out) and out.tensors[copy.output].shape == (64, 3, 3, 64)
    kernel = [k for k in plan_kernels(out).kernels if k.op.output == "O"][0]
    sched = make_schedule(kernel.flat, tuple(flat_tile.get(n, 1) for n in kernel.flat.names),
                          hw)
    assert kernel.flat.names[sched.vec_index] == "co" and not sched.dot
    if l2 is None:  # the search relays it the same way: forcing its tile changes nothing
        searched = packed(check_program(NCHW_CONV, shapes), hw, CONFIG)
        plan = plan_kernels(searched)
        (k,) = [k for k in plan.kernels if k.op.output == "O"]
        tile = dict(zip(k.flat.names, search(k.flat, hw).tile, strict=True))
        again = replace(CONFIG, tiles={"O": tile})
        texts = [[s.text.split("*/", 1)[1] for s in generate(plan_kernels(p), hw, c)[0]
                  if s.name == "contract_O"]
                 for p, c in ((searched, CONFIG), (packed(program, hw, again), again))]
        assert texts[0] and texts[0] == texts[1]


STRIDED_POINTWISE = """function (D[N, CI, X, Y], W[CO, CI, I, J], B[CO, U, V]) -> (R) {
  O[n, co, x, y : N, CO, OX, OY] = +(D[n, ci, 2*x, 2*y] * W[co, ci, 0, 0]);
  R = O + B;
}"""


def _strided(side: int) -> tuple[str, dict]:
    out = side // 2
    src = STRIDED_POINTWISE.replace("OX, OY", f"{out}, {out}")
    return src, {"D": (1, 64, side, side), "W": (128, 64, 1, 1), "B": (128, 1, 1)}


@pytest.mark.parametrize("timed", [True, False])
def test_short_pixel_rows_give_the_lanes_to_the_channels(timed):
    """A stride-2 1x1 convolution (resnet's downsample) at 7x7: its output columns, the
    output's unit-stride index, fill 4 of 16 lanes (`vector_candidates` with `lanes`), so
    its filter is relaid (in panels of the tile's channels where the tile takes part of
    them) and the output channels take all 16; at 28x28 the columns fill the vector and
    keep it, nothing copied."""
    hw = CPU if timed else _no_time_model(CPU)
    src, shapes = _strided(14)
    program, out = _same_outputs(src, shapes, hw)
    (copy,) = _relaid(out) + _packs(out)
    assert copy.inputs[0].tensor == "W"
    kernel = [k for k in plan_kernels(out).kernels if k.op.output == "O"][0]
    sched = make_schedule(kernel.flat, search(kernel.flat, hw).tile, hw)
    assert kernel.flat.names[sched.vec_index] in ("co", "coi") and sched.vec == hw.vec_size
    src, shapes = _strided(56)
    program, out = _same_outputs(src, shapes, hw)
    assert not _relaid(out) and not _packs(out)


def test_vector_candidates_put_short_indices_after_full_ones():
    from tilec.plan.schedule import vector_candidates

    src = """function (D[N, CI, X, Y], W[CI, CO]) -> (O) {
      O[n, co, x, y : N, CO, 7, 7] = +(D[n, ci, 2*x, 2*y] * W[ci, co]);
    }"""
    program = check_program(src, {"D": (1, 64, 14, 14), "W": (64, 128)})
    flat = plan_kernels(program).kernels[0].flat
    first = [flat.names[k] for k in vector_candidates(flat, cpu=True, lanes=16)]
    assert first[0] == "co" and "y" in first
    # Without the width (GPU models, and the order before) the output's unit stride leads;
    # where every candidate is short the order is as before too.
    assert flat.names[vector_candidates(flat, cpu=True)[0]] == "y"
    assert flat.names[vector_candidates(flat, cpu=True, lanes=4)[0]] == "y"
    assert vector_candidates(flat, cpu=False, lanes=16) == vector_candidates(flat, cpu=False)


def test_strided_pointwise_runs_against_numpy():
    """On the CPU device, the relaid stride-2 1x1 convolution with its bias matches numpy,
    outputs poisoned first, at 7x7 (relaid) and 9x9 (an odd row: the last tile moves back)."""
    from ..codegen.test_kernels import run_case

    for side in (14, 18):
        src, shapes = _strided(side)
        exe = run_case(src, shapes, seed=side, device="Portable Computing Language")
        assert exe.hw.kind == "cpu"


# A stride-2 1x1 convolution in channels-last layout, as a model's graph writes it: the
# weight K is two-dimensional, so only `constants` says it is bound once.
STRIDED_1X1 = """function (I[N, H, W, CI], K[CI, CO], B[CO]) -> (R) {
  O[n, x0, x1, co : N, 7, 7, CO] = +(I[n, 2 * x0, 2 * x1, ci] * K[ci, co]);
  R = O + B;
}"""


def test_constant_weights_are_packed_at_any_size():
    """K is 256 KB: under the model's L2, so a product reading it as an operand that changes
    each call keeps it as written; bound once (`constants`) it is packed, under any L2, and
    a 7x7 output's tiles (fewer than `MIN_REREADS` readers a panel) are enough."""
    from dataclasses import replace

    from tilec.plan.pack import pack_panels

    shapes = {"I": (1, 14, 14, 128), "K": (128, 512), "B": (512,)}
    size = 128 * 512 * 4
    hw = replace(CPU, l2_bytes=2 * size)
    assert size < hw.l2_bytes
    program = check_program(STRIDED_1X1, shapes)

    def choose(flat):
        return search(flat, hw).tile, None

    assert not _packs(pack_panels(program, hw, choose))
    out = pack_panels(program, hw, choose, constants={"K"})
    (copy,) = _packs(out)
    assert copy.inputs[0].tensor == "K"
    nr = out.tensors[copy.output].shape[-1]
    assert out.tensors[copy.output].shape == (512 // nr, 128, nr)
    rng = np.random.default_rng(4)
    arrays = {n: random_array(rng, program.tensors[n].shape, "float32") for n in program.inputs}
    np.testing.assert_allclose(evaluate_program(out, arrays)["R"],
                               evaluate_program(program, arrays)["R"], rtol=1e-5, atol=1e-5)
    # A constant far under L2 too.
    large = replace(CPU, l2_bytes=64 * size)
    assert _packs(pack_panels(program, large, choose, constants={"K"}))


def test_constant_weight_panels_run_against_numpy():
    """Compiled with K as a bound constant on the CPU device: the panels are made at bind and
    the convolution matches numpy, outputs poisoned; the same without constants is not
    packed."""

    import tilec

    from ..codegen.test_kernels import check_run

    shapes = {"I": (1, 14, 14, 256), "K": (256, 1024), "B": (1024,)}  # K: 1 MiB
    config = Config(device="Portable Computing Language", use_disk_cache=False,
                    use_tuning_records=False)
    exe = tilec.compile(STRIDED_1X1, shapes, config=config, constants={"K"})
    assert any("K_panels" in k.name for k in exe.kernels), [k.name for k in exe.kernels]
    check_run(exe, seed=9)
    plain = tilec.compile(STRIDED_1X1, shapes, config=config)
    assert not any("K_panels" in k.name for k in plain.kernels)


def test_a_count_the_tile_does_not_divide_takes_narrower_panels():
    """squeezenet's classifier, 512 -> 1000 classes on 13x13 pixels, its weight bound: the
    search's 16-wide tiles do not divide 1000, so the panels are the widest whole vectors that
    do (8 wide: 125 panels); the packed program computes what the one as written does."""
    from tilec.plan.pack import pack_panels

    src = """function (I[N, H, W, CI], K[CI, CO], B[CO]) -> (R) {
  O[n, x0, x1, co : N, H, W, CO] = +(I[n, x0, x1, ci] * K[ci, co]);
  R = O + B;
}"""
    shapes = {"I": (1, 13, 13, 512), "K": (512, 1000), "B": (1000,)}
    program = check_program(src, shapes)

    def choose(f):
        """The search's tile, 16 wide along the channels (as on a Zen 3's device model)."""
        tile = list(search(f, CPU).tile)
        if "co" in f.names:
            tile[f.names.index("co")] = 16
        return tuple(tile), None

    (flat,) = [k.flat for k in plan_kernels(program).kernels if hasattr(k, "flat")]
    tile = choose(flat)[0]
    sched = make_schedule(flat, tile, CPU)
    assert 1000 % tile[sched.vec_index], "the case needs a tile width that does not divide"

    out = pack_panels(program, CPU, choose, constants={"K"})
    (copy,) = _packs(out)
    shape = out.tensors[copy.output].shape
    assert shape[-1] % sched.vec == 0 and 1000 % shape[-1] == 0 and shape[-1] < tile[
        sched.vec_index]
    assert shape == (1000 // shape[-1], 512, shape[-1])
    rng = np.random.default_rng(6)
    arrays = {n: random_array(rng, program.tensors[n].shape, "float32") for n in program.inputs}
    np.testing.assert_allclose(evaluate_program(out, arrays)["R"],
                               evaluate_program(program, arrays)["R"], rtol=1e-5, atol=1e-5)


def test_narrower_panels_run_against_numpy():
    """The same classifier compiled on the CPU device with its weight bound: the panels are
    made at bind and the product matches numpy, outputs poisoned."""
    import tilec

    from ..codegen.test_kernels import check_run

    src = """function (I[N, H, W, CI], K[CI, CO], B[CO]) -> (R) {
  O[n, x0, x1, co : N, H, W, CO] = +(I[n, x0, x1, ci] * K[ci, co]);
  R = O + B;
}"""
    shapes = {"I": (1, 13, 13, 512), "K": (512, 1000), "B": (1000,)}
    config = Config(device="Portable Computing Language", use_disk_cache=False,
                    use_tuning_records=False)
    exe = tilec.compile(src, shapes, config=config, constants={"K"})
    check_run(exe, seed=11)


def test_narrower_panels_only_for_weights():
    """An operand copied at every call (no `constants`) whose count the tile's width does not
    divide keeps its layout: the narrower panels were measured for bound weights only."""
    from tilec.plan.pack import pack_panels

    shapes = {"A": (256, 512), "B": (512, 1000)}  # B: 2 MB, past the model's L2
    program = check_program(MATMUL, shapes)

    def choose(f):
        tile = list(search(f, CPU).tile)
        tile[f.names.index("n")] = 16
        return tuple(tile), None

    assert not _packs(pack_panels(program, CPU, choose))
    out = pack_panels(program, CPU, choose, constants={"B"})
    (copy,) = _packs(out)
    assert out.tensors[copy.output].shape == (125, 512, 8)


@pytest.mark.parametrize("tile, says", [
    ({"cox": 32, "ci": 16}, "unknown index cox"),
    ({"co": 32, "coi": 32}, "mixes the two sets"),
])
def test_a_forced_tile_in_neither_set_of_indices_names_both(tile, says):
    """A tile that names neither the statement's own indices nor those of the statement
    reading panels is refused with both sets listed (a typo in `co` was reported against
    `coi, coo` alone)."""
    from dataclasses import replace

    from tilec.errors import TileError

    program = check_program(NCHW_CONV, {"D": (1, 64, 7, 7), "W": (64, 64, 3, 3)})
    with pytest.raises(TileError) as e:
        packed(program, CPU, replace(CONFIG, tiles={"O": tile}))
    msg = str(e.value)
    assert says in msg and "as written: ci, co, i, j" in msg and "coi, coo" in msg, msg


@pytest.mark.parametrize("src, shapes, constants", [
    (MATMUL, {"A": (128, 768), "B": (768, 768)}, ()),
    (NHWC_CONV, {"D": (1, 14, 14, 32), "K": (3, 3, 32, 32)}, ("K",)),
    (NHWC_CONV, {"D": (1, 7, 7, 512), "K": (3, 3, 512, 512)}, ("K",)),
    (GEMM_RELU, {"A": (64, 96), "B": (96, 1000), "bias": (1000,)}, ("B",)),
])
def test_the_flats_listed_for_searches_ahead_are_those_packing_asks_about(src, shapes,
                                                                          constants):
    # Searches run ahead in other processes (`runtime.search_ahead`) are listed without the
    # search's answers; every question pack_panels then asks must be among them.
    from tilec.plan.pack import pack_panels, searched_flats
    from tilec.plan.search import search_key

    program = check_program(src, shapes)
    asked = []

    def choose(flat):
        asked.append(search_key(flat, CPU))
        r = search(flat, CPU)
        return r.tile, (r.predicted[0][0] if r.predicted else None)

    plain = pack_panels(program, CPU, choose, constants=constants)
    memo: dict = {}
    listed = {search_key(f, CPU) for f in searched_flats(program, CPU, constants, memo=memo)}
    assert asked and set(asked) <= listed
    # The flats the listing kept give the packing it makes without them.
    assert memo and pack_panels(program, CPU, choose, constants=constants, memo=memo) == plain
    assert searched_flats(program, HwModel.load("nvidia-h100"), constants) == []
