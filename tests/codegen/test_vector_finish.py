"""Post-ops over whole vectors (`codegen/vector_finish.py`): where a contraction's vector runs
along a unit-stride output index, bias, activations and residual adds are computed on the
vectors and stored as vectors; operands that do not allow it keep the lane-by-lane form.
Texts are checked device-free; runs compare with numpy on random inputs, outputs poisoned,
every case also with the lane-by-lane form's tiles forced where the vector form applies."""

from __future__ import annotations

import pytest

import tilec
from tilec.codegen import clexpr
from tilec.lang import ir
from tilec.plan.fuse import plan_kernels
from tilec.plan.hw import HwModel

from ..device import needs_device
from .test_kernels import run_case
from .test_plain_builtins import PYPI_POCL, avx2_cpu, contraction_texts

POINTWISE = """function (D[N, CI, X, Y], W[CO, CI], {extra}) -> ({outs}) {{
  O[n, co, x, y : N, CO, X, Y] = +(D[n, ci, x, y] * W[co, ci]);
  {post}
}}"""


def _pw(post: str, extra: str, outs: str = "R", x: int = 6, y: int = 16, co: int = 4,
        shapes: dict | None = None) -> tuple[str, dict]:
    src = POINTWISE.format(extra=extra, outs=outs, post=post)
    return src, {"D": (1, 5, x, y), "W": (co, 5), **(shapes or {})}


CASES = {
    # Bias per output channel (broadcast along the vector) and ReLU.
    "bias_relu": _pw("R = relu(O + B);", "B[CO, U, V]", shapes={"B": (4, 1, 1)}),
    # A residual laid out as the output: read as vectors.
    "residual_relu": _pw("R = relu(O + S);", "S[N, CO, X, Y]", shapes={"S": (1, 4, 6, 16)}),
    # An operand along the vector index alone, and constants beside vectors in min / max /
    # pow (no scalar-vector form of those builtins), int literals included.
    "row_clip_pow": _pw("R = pow(2.0, min(1.5, max(0, O * T)));", "T[Y]",
                        shapes={"T": (16,)}),
    "swish_tanh": _pw("R = O * sigmoid(O) + tanh(O) / 4;", "Z[N]", shapes={"Z": (1,)}),
    # Two results written: the contraction's own output and a post-op's.
    "two_outputs": _pw("R = exp(O - 1) - S;", "S[N, CO, X, Y]", outs="O, R",
                       shapes={"S": (1, 4, 6, 16)}),
    # Lane-by-lane: a select, and a comparison turned into a number.
    "leaky_select": _pw("R = O > 0 ? O : 0.1 * O;", "Z[N]", shapes={"Z": (1,)}),
    "comparison": _pw("R = (O > S) * O;", "S[N, CO, X, Y]", shapes={"S": (1, 4, 6, 16)}),
    # 13 x 13 pixels: vectors along the merged pixels, the last tile moved back.
    "odd_pixels_bias": _pw("R = relu(O + B);", "B[CO, U, V]", x=13, y=13,
                           shapes={"B": (4, 1, 1)}),
}
VECTOR = ("bias_relu", "residual_relu", "row_clip_pow", "swish_tanh", "two_outputs",
          "odd_pixels_bias")


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpu_text(name):
    src, shapes = CASES[name]
    text, = contraction_texts(src, shapes, avx2_cpu())
    vec = "const float8 v_R = " in text or "const float4 v_R = " in text
    assert vec == (name in VECTOR), text
    if vec:
        assert ".s0" not in text.split("Finish each output")[1], text
        assert "b_R + (o))) = v_R;" in text, text


NCHW_PAD = """function (I[N, CI, H, W], F[KH, KW, CI, CO], B[CO, U, V], S[N, CO, H, W]) -> (R) {
  O[n, co, x, y : N, CO, H, W] = +(I[n, ci, x + i - 1, y + j - 1] * F[i, j, ci, co]);
  R = relu(O + B + S);
}"""
NCHW_SHAPES = {"I": (1, 3, 7, 9), "F": (3, 3, 3, 16), "B": (16, 1, 1), "S": (1, 16, 7, 9)}


def test_lanes_apart_in_the_output():
    """A padded NCHW convolution (its filter with output channels innermost, as `plan.pack`
    relays models' filters): the vector runs along the output channels (the columns carry
    the padding constraint), which the output and the residual hold 63 apart: the
    residual is gathered, the bias read as a vector, the lanes stored one by one."""
    text, = contraction_texts(NCHW_PAD, NCHW_SHAPES, avx2_cpu())
    assert "vector: 8 lanes along co" in text, text
    finish = text.split("Finish each output")[1]
    assert "const float8 v_R = " in finish and "float8_u*)(b_B + (p_co_0))" in finish, finish
    assert "b_S[o + 0], b_S[o + 63], b_S[o + 126]" in finish, finish
    assert "b_R[o + 63] = v_R.s1;" in finish, finish


@needs_device
def test_lanes_apart_run():
    run_case(NCHW_PAD, NCHW_SHAPES, use_disk_cache=False, use_tuning_records=False)
    exe = run_case(NCHW_PAD, NCHW_SHAPES, tiles={"*": {"co": 8, "y": 3}},
                   use_disk_cache=False, use_tuning_records=False, seed=1)
    if exe.hw.kind == "cpu":  # the form under test ran: vector post-ops, lanes stored apart
        assert any("v_R.s1;" in s.text for s in exe.sources)


def test_constants_become_vectors_only_in_min_max_pow():
    src, shapes = CASES["row_clip_pow"]
    text, = contraction_texts(src, shapes, avx2_cpu())
    line = next(x for x in text.splitlines() if "v_R = " in x)
    assert "pow(((float8)(2.0f)), fmin(((float8)(1.5f)), fmax(((float8)(((float)(0)))), " \
        in line or "pow(((float4)(2.0f))" in line, line
    src, shapes = CASES["swish_tanh"]
    text, = contraction_texts(src, shapes, avx2_cpu())
    line = next(x for x in text.splitlines() if "v_R = " in x)
    assert "(float8)(4" not in line and "(float4)(4" not in line, line


def test_vector_safe():
    f = ir.Ref("O", "float32", (4,))
    i = ir.Ref("I", "int32", (4,))
    one = ir.Const(1, "int32")
    assert clexpr.vector_safe(ir.Op("max", (f, one), "float32", (4,)))
    assert not clexpr.vector_safe(ir.Op("gt", (f, one), "bool", (4,)))
    assert not clexpr.vector_safe(ir.Op("select", (f, f, f), "float32", (4,)))
    assert not clexpr.vector_safe(ir.Op("add", (f, i), "float32", (4,)))


def test_gpu_model_text():
    src, shapes = CASES["residual_relu"]
    text, = contraction_texts(src, shapes, HwModel.load("nvidia-h100"))
    # The residual read with vloadN (GPU models take no element-aligned type).
    assert "const float4 v_R = fmax((v + vload4(0, b_S + (o))), 0.0f);" in text, text


@needs_device
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("hw", [None, "nvidia-h100"])
def test_runs_match_reference(name, hw):
    src, shapes = CASES[name]
    extra = {"hw": hw} if hw else {}
    run_case(src, shapes, use_disk_cache=False, use_tuning_records=False, **extra)
    # A tile whose vector covers part of a row: vectors start inside rows.
    names = plan_kernels(tilec.check_program(src, shapes, "float32")).kernels[0].flat.names
    pixels = "x_y" if "x_y" in names else "y"
    run_case(src, shapes, tiles={"*": {pixels: 4, "co": 2}},
             use_disk_cache=False, use_tuning_records=False, seed=1, **extra)


@pytest.mark.skipif(PYPI_POCL is None, reason="no PyPI PoCL device (pocl-binary-distribution)")
@pytest.mark.parametrize("name", sorted(CASES))
def test_runs_on_the_pypi_pocl(name):
    """Its vectors are plain (the element-aligned type for unaligned reads and stores)."""
    src, shapes = CASES[name]
    run_case(src, shapes, device=PYPI_POCL, use_disk_cache=False, use_tuning_records=False)
    if name == "bias_relu":
        run_case(NCHW_PAD, NCHW_SHAPES, device=PYPI_POCL, use_disk_cache=False,
                 use_tuning_records=False)
