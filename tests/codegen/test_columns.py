"""Epilogues in columns (`codegen/columns.py`): an NCHW convolution on a CPU holds its output
channels in the lanes, which the output holds apart; the register tile's points along the
output's unit-stride index are read lane by lane as columns, post-ops run on the columns and
each is one vector store.  Texts are checked device-free; runs compare with numpy on random
inputs, outputs poisoned, with tiles forced to make columns of every width, points left
over, partial tiles at the border, two results written and a strided window."""

from __future__ import annotations

import pytest

import tilec
from tilec.codegen.generate import generate
from tilec.config import Config
from tilec.plan.fuse import plan_kernels
from tilec.plan.hw import HwModel

from ..device import needs_device
from .test_kernels import run_case
from .test_plain_builtins import avx2_cpu

CONV = """function (I[N, CI, H, W], F[KH, KW, CI, CO], B[CO, U, V], S[N, CO, H, W]) -> (R) {
  O[n, co, x, y : N, CO, H, W] = +(I[n, ci, x + i - 1, y + j - 1] * F[i, j, ci, co]);
  R = relu(O + B + S);
}"""
# Two results: the contraction's own output and the post-op's, both kept.
TWO = """function (I[N, CI, H, W], F[KH, KW, CI, CO], B[CO, U, V]) -> (O, R) {
  O[n, co, x, y : N, CO, H, W] = +(I[n, ci, x + i - 1, y + j - 1] * F[i, j, ci, co]);
  R = exp(O * 0.1) - B;
}"""
# A 1x1 convolution at stride 2, no post-op: columns of the accumulators themselves.
STRIDED = """function (I[N, CI, H, W], F[CI, CO]) -> (O) {
  O[n, co, x, y : N, CO, 5, 9] = +(I[n, ci, 2 * x, 2 * y] * F[ci, co]);
}"""


def _shapes(h: int, w: int, ci: int = 3, co: int = 16) -> dict:
    return {"I": (1, ci, h, w), "F": (3, 3, ci, co), "B": (co, 1, 1), "S": (1, co, h, w)}


def _texts(src: str, shapes: dict, hw: HwModel, tiles: dict | None = None) -> str:
    plan = plan_kernels(tilec.check_program(src, shapes, "float32"))
    config = Config(use_disk_cache=False, use_tuning_records=False, tiles=tiles or {})
    sources, _ = generate(plan, hw, config)
    return "\n".join(s.text for s in sources if s.kind == "contraction")


def test_points_along_the_row_become_columns():
    """8 lanes along co, 7 points along y: columns of 4 and 2, the seventh point alone.  The
    lanes go to a private array once, and one loop takes the columns in turn."""
    text = _texts(CONV, _shapes(6, 7), avx2_cpu(), {"*": {"co": 8, "y": 7, "x": 1}})
    assert "vector: 8 lanes along co" in text, text
    finish = text.split("Finish each output")[1]
    assert "lanes_t[3] = a_3;" in finish and "for (int l = 0; l < 8; l += 1)" in finish
    assert "const int ol = o + l * 42;" in finish, finish
    assert ("const float4 v = ((float4)(lanes_p[0 + l], lanes_p[8 + l], lanes_p[16 + l], "
            "lanes_p[24 + l]));") in finish, finish
    assert "const float2 v = ((float2)(lanes_p[0 + l], lanes_p[8 + l]));" in finish, finish
    # Bias broadcast along the column, residual and result as vectors along y.
    assert "(float4)(b_B[p_co_0 + l])" in finish, finish
    assert "b_S + (ol)" in finish and "b_R + (ol))) = v_R;" in finish, finish
    # The point left over keeps the lanes' form.
    assert "const float8 v = a_6;" in finish and "v_R.s7;" in finish, finish


def test_narrow_lanes_keep_columns_written_out(monkeypatch):
    """Below `LOOP_LANES` each column is written out with its lane's constant offsets."""
    from tilec.codegen import columns

    monkeypatch.setattr(columns, "LOOP_LANES", 16)
    text = _texts(CONV, _shapes(6, 7), avx2_cpu(), {"*": {"co": 8, "y": 7, "x": 1}})
    finish = text.split("Finish each output")[1]
    assert "lanes_t" not in finish, finish
    assert "const float4 v = ((float4)(a_0.s0, a_1.s0, a_2.s0, a_3.s0));" in finish, finish
    assert "const float2 v = ((float2)(a_4.s7, a_5.s7));" in finish, finish
    assert "(float4)(b_B[7 + p_co_0])" in finish, finish


def test_gpu_models_and_unit_stride_lanes_are_unchanged():
    # Vectors along the output's own rows: stored whole, no columns.
    text = _texts(STRIDED, {"I": (1, 4, 10, 18), "F": (4, 8)}, avx2_cpu(),
                  {"*": {"co": 2, "y": 8}})
    assert "const int ol" not in text, text
    text = _texts(CONV, _shapes(6, 7), HwModel.load("nvidia-h100"))
    assert "const int ol" not in text, text


def _overhanging(monkeypatch, index: str) -> None:
    """CPU tiles move back rather than overhang (`Schedule.shift`) wherever every output
    element is one point; elsewhere a last tile may pass the range: make `index` overhang."""
    from tilec.codegen.contraction import _Contraction

    monkeypatch.setattr(_Contraction, "overhangs",
                        lambda self, k: self.flat.names[k] == index)


def test_guarded_points_keep_a_point_by_point_form(monkeypatch):
    """Points whose positions may pass the range are guarded: columns run where all of
    their points are inside, point by point, each behind its guard, where not."""
    _overhanging(monkeypatch, "y")
    text = _texts(CONV, _shapes(5, 8), avx2_cpu(), {"*": {"co": 8, "y": 4, "x": 1}})
    finish = text.split("Finish each output")[1]
    assert "if (p_y_0 < 8 && p_y_1 < 8 && p_y_2 < 8 && p_y_3 < 8) {" in finish, finish
    assert "else {" in finish and "if (p_y_3 < 8) {" in finish, finish


@needs_device
def test_guarded_columns_match_the_reference(monkeypatch):
    _overhanging(monkeypatch, "y")
    exe = run_case(CONV, _shapes(5, 8), tiles={"*": {"co": 8, "y": 4, "x": 1}},
                   use_disk_cache=False, use_tuning_records=False)
    if exe.hw.kind == "cpu" and exe.hw.vec_size >= 8:
        assert any("p_y_3 < 8) {" in s.text and "const int ol" in s.text
                   for s in exe.sources), exe.sources[-1].text


CASES = {
    "columns_4_2_1": (CONV, _shapes(6, 7), {"*": {"co": 8, "y": 7, "x": 1}}),
    "columns_8": (CONV, _shapes(4, 16, ci=5, co=32), {"*": {"co": 16, "y": 8, "x": 2}}),
    "columns_16": (CONV, _shapes(3, 16, co=8), {"*": {"co": 8, "y": 16, "x": 1}}),
    "moved_back": (CONV, _shapes(5, 9), {"*": {"co": 8, "y": 4, "x": 1}}),
    "moved_back_rows": (CONV, _shapes(7, 11, ci=4, co=24), {"*": {"co": 8, "y": 4, "x": 2}}),
    "two_results": (TWO, {k: v for k, v in _shapes(5, 12).items() if k != "S"},
                    {"*": {"co": 16, "y": 4, "x": 2}}),
    "searched": (CONV, _shapes(14, 14, ci=8, co=32), None),
}


@needs_device
@pytest.mark.parametrize("looped", [True, False])
@pytest.mark.parametrize("name", sorted(CASES))
def test_columns_match_the_reference(name, looped, monkeypatch):
    """Both forms of the columns (a loop over the lanes, and written out) against numpy."""
    from tilec.codegen import columns

    if not looped:
        monkeypatch.setattr(columns, "LOOP_LANES", 64)
    src, shapes, tiles = CASES[name]
    extra = {"tiles": tiles} if tiles else {}
    exe = run_case(src, shapes, use_disk_cache=False, use_tuning_records=False, **extra)
    if tiles and exe.hw.kind == "cpu" and exe.hw.vec_size >= 8:  # the form under test ran
        texts = [s.text for s in exe.sources]
        assert any("const int ol" in t for t in texts), texts[-1]
        assert any("lanes_t" in t for t in texts) == looped, texts[-1]
