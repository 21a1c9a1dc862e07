"""The last, partial tile along an output index with code of its own (`_Contraction.edge_index`):
on CPUs a 7-wide row in tiles of 4 runs a 4-wide tile and a 3-wide one instead of two 4-wide
tiles overlapping by one.  Texts are checked device-free; runs compare with numpy on random
inputs, outputs poisoned, with forced tiles that leave partial tiles behind."""

from __future__ import annotations

import re

import pytest

import tilec
from tilec.codegen.generate import generate
from tilec.config import Config
from tilec.plan.fuse import plan_kernels
from tilec.plan.hw import HwModel

from ..device import needs_device
from .test_kernels import run_case
from .test_plain_builtins import avx2_cpu

SAME_NHWC = """function (D[N, X, Y, CI], K[I, J, CO, CI]) -> (R) {
  O[n, x, y, co : N, X, Y, CO] = +(D[n, x+i-1, y+j-1, ci] * K[i, j, co, ci]);
  R = (O > 0 ? O : 0);
}"""
POOL_NHWC = """function (I[N, X, Y, C]) -> (O) {
  O[n, x, y, c : N, 6, 6, C] = >(I[n, 2*x + i, 2*y + j, c]), i < 3, j < 3;
}"""
AVG_NHWC = """function (I[N, X, Y, C]) -> (O) {
  S[n, x, y, c : N, 6, 6, C] = +(I[n, 2*x + i - 1, 2*y + j - 1, c]), i < 3, j < 3;
  O = S / 9.0;
}"""
MATMUL = """function (A[M, K], B[K, N]) -> (C) {
  C[m, n : M, N] = +(A[m, k] * B[k, n]);
}"""


def _texts(src: str, shapes: dict, hw: HwModel, tile: dict) -> list[str]:
    plan = plan_kernels(tilec.check_program(src, shapes, "float32"))
    sources, _ = generate(plan, hw, Config(use_disk_cache=False, tiles={"*": tile}))
    return [s.text for s in sources if s.kind == "contraction"]


def test_a_seven_wide_row_in_tiles_of_four_ends_with_a_three_wide_tile():
    text, = _texts(SAME_NHWC, {"D": (1, 7, 7, 64), "K": (3, 3, 64, 64)}, avx2_cpu(),
                   {"x": 1, "y": 4, "co": 16, "ci": 32, "j": 3})
    assert "edge: the last tile along y is 3 wide, with code of its own" in text
    edge, main = text.split("return;")
    # The edge tile's code computes 3 columns, the main one 4; neither moves back.
    assert "p_y_2" in edge and "p_y_3" not in edge
    assert "p_y_3" in main
    assert "min((grp % " not in text
    # The work-group's place along y, decoded as the prologue decodes it.
    assert re.search(r"if \(\(get_group_id\(0\)( / \d+)?\) % 2 == 1\) \{", edge)


def test_only_one_index_gets_edge_code_the_other_moves_back():
    # 7 x 7 pixels in 2 x 4 tiles: y repeats 1 of 8, x 1 of 8 too; one is given edge code
    # (the first with the most repeated points), the other still moves back.
    text, = _texts(SAME_NHWC, {"D": (1, 7, 7, 64), "K": (3, 3, 64, 64)}, avx2_cpu(),
                   {"x": 2, "y": 4, "co": 16, "ci": 32, "j": 3})
    assert text.count("with code of its own") == 1
    assert text.count("min((grp % ") == 2  # once in the edge code, once in the main code


def test_whole_tiles_gpus_and_vector_indices_get_no_edge_code():
    cpu = avx2_cpu()
    text, = _texts(SAME_NHWC, {"D": (1, 8, 8, 64), "K": (3, 3, 64, 64)}, cpu,
                   {"x": 1, "y": 4, "co": 16, "ci": 32, "j": 3})
    assert "return;" not in text
    gpu = HwModel.load("nvidia-h100")
    text, = _texts(SAME_NHWC, {"D": (1, 7, 7, 64), "K": (3, 3, 64, 64)}, gpu,
                   {"x": 1, "y": 4, "co": 16, "ci": 16})
    assert "with code of its own" not in text
    # 20 columns of a matrix in vectors of 8: the vector index keeps its moved-back tile.
    text, = _texts(MATMUL, {"A": (8, 16), "B": (16, 20)}, cpu, {"m": 4, "n": 8, "k": 16})
    assert "with code of its own" not in text


RUNS = {
    # A padded window (edge masks inside the edge tile too), bias-free ReLU post-op.
    "same_conv_row": (SAME_NHWC, {"D": (1, 7, 7, 32), "K": (3, 3, 32, 32)},
                      {"x": 1, "y": 4, "co": 16, "ci": 16, "j": 3}),
    "same_conv_two_partial": (SAME_NHWC, {"D": (1, 7, 13, 16), "K": (3, 3, 16, 16)},
                              {"x": 3, "y": 5, "co": 8, "ci": 8}),
    # A sweep along x (8 rows, a work-item each 4) with the partial tile along y.
    "same_conv_swept": (SAME_NHWC, {"D": (1, 8, 7, 64), "K": (3, 3, 64, 64)},
                        {"x": 1, "y": 4, "co": 16, "ci": 16, "j": 3}),
    "max_pool": (POOL_NHWC, {"I": (1, 13, 13, 16)}, {"x": 4, "y": 4, "c": 8}),
    "avg_pool_padded": (AVG_NHWC, {"I": (1, 12, 12, 16)}, {"x": 1, "y": 4, "c": 16}),
    "matmul_rows": (MATMUL, {"A": (13, 24), "B": (24, 16)}, {"m": 4, "n": 16, "k": 8}),
}


@needs_device
@pytest.mark.parametrize("name", sorted(RUNS))
def test_edge_tiles_compute_the_reference(name):
    src, shapes, tile = RUNS[name]
    exe = run_case(src, shapes, tiles={"*": tile}, use_disk_cache=False,
                   use_tuning_records=False)
    if exe.hw.kind == "cpu":
        assert any("with code of its own" in s.text for s in exe.sources), name


@needs_device
def test_edge_code_and_moved_back_tiles_agree():
    # The same tile built both ways (`Config.edge_tiles`), run on the same random inputs with
    # the outputs poisoned, each checked against numpy and the two against each other.
    from tilec.compiler import compile as tile_compile

    from .test_kernels import check_run

    src, shapes, tile = RUNS["same_conv_two_partial"]
    outs = {}
    for on in (True, False):
        exe = tile_compile(src, shapes, config=Config(
            tiles={"*": tile}, use_disk_cache=False, use_tuning_records=False, edge_tiles=on))
        text = "".join(s.text for s in exe.sources)
        if exe.hw.kind == "cpu":
            assert ("with code of its own" in text) == on
        _, outs[on] = check_run(exe, seed=3)
    for name in outs[True]:
        assert (outs[True][name] == outs[False][name]).all() or \
            abs(outs[True][name] - outs[False][name]).max() < 1e-5


def test_explain_names_the_edge_the_kernel_has(tmp_path, capsys):
    from tilec.cli.main import main

    src = tmp_path / "conv.tile"
    src.write_text(SAME_NHWC)
    args = ["explain", str(src), "--shape", "D=1x7x7x64", "--shape", "K=3x3x64x64",
            "--hw", "pocl-cpu"]
    assert main([*args, "--tile", "x=1,y=4,co=16,ci=32,i=3,j=3"]) == 0
    assert "the last tile along y with code of its own" in capsys.readouterr().out
    assert main([*args, "--tile", "x=1,y=7,co=16,ci=32,i=3,j=3"]) == 0
    assert "with code of its own" not in capsys.readouterr().out
