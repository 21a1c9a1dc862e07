"""Row-fused kernels compiled and run on the CPU device with poisoned outputs, against the numpy
reference and against the same program compiled without row fusion: one work-item a row (the
CPU model) and a work-group a row with a tree in local memory (a GPU model), rows longer than
a work-group, odd sizes, reductions over leading and middle axes, masked (all -inf) rows."""

from __future__ import annotations

import numpy as np
import pytest

from tilec.compiler import Executable
from tilec.compiler import compile as tile_compile
from tilec.config import Config
from tilec.lang.reference import random_array

from ..device import needs_device
from ..plan.test_rows import SOFTMAX

pytestmark = needs_device


PROGRAMS = {
    "softmax": (SOFTMAX, {"I": (7, 1000)}),
    "softmax_odd_long_rows": (SOFTMAX, {"I": (3, 3001)}),
    # Past 16 elements a thread the GPU form walks the row in memory instead of registers.
    "softmax_rows_past_the_register_share": (SOFTMAX, {"I": (2, 4500)}),
    "softmax_f16": (SOFTMAX, {"I": (6, 77)}),
    "softmax_builtin": ("function (I[X, Y]) -> (O) { O = builtin_softmax(I, X, Y); }",
                        {"I": (5, 33)}),
    "logsoftmax_builtin": ("function (I[X, Y]) -> (O) { O = builtin_logsoftmax(I, X, Y); }",
                           {"I": (9, 130)}),
    "softmax_axis0": ("""function (I[X, Y]) -> (O) {
        M[0, j : 1, Y] = >(I[i, j]);
        E = exp(I - M);
        S[0, j : 1, Y] = +(E[i, j]);
        O = E / S;
    }""", {"I": (37, 6)}),
    "layer_norm": ("""function (X[N, C], G[C], B[C]) -> (Y, M) {
        S[n, 0 : N, 1] = +(X[n, c]);
        M = S / C;
        D = X - M;
        D2 = D * D;
        Q[n, 0 : N, 1] = +(D2[n, c]);
        Y = D / sqrt(Q / C + 0.00001) * G + B;
    }""", {"X": (6, 300), "G": (300,), "B": (300,)}),
    "rms_norm": ("""function (X[N, T, C], G[C]) -> (Y) {
        X2 = X * X;
        Q[n, t, 0 : N, T, 1] = +(X2[n, t, c]);
        Y = X / sqrt(Q / C + 0.000001) * G;
    }""", {"X": (2, 5, 64), "G": (64,)}),
    "instance_norm_middle_axes": ("""function (X[N, H, W, C]) -> (Y) {
        S[n, 0, 0, c : N, 1, 1, C] = +(X[n, h, w, c]);
        M = S / (H * W);
        D = X - M;
        D2 = D * D;
        Q[n, 0, 0, c : N, 1, 1, C] = +(D2[n, h, w, c]);
        Y = D / sqrt(Q / (H * W) + 0.00001);
    }""", {"X": (2, 5, 7, 3)}),
    "max_and_min_rows_int": ("""function (A[R, L]) -> (O) {
        M[r, 0 : R, 1] = >(A[r, l]);
        N[r, 0 : R, 1] = <(A[r, l]);
        O = (A - N) * 100 / (M - N + 1);
    }""", {"A": (4, 50)}),
}


def _arrays(exe, seed=0):
    rng = np.random.default_rng(seed)
    return {n: random_array(rng, exe.program.tensors[n].shape, exe.program.tensors[n].dtype) * 3
            for n in exe.program.inputs}


@pytest.mark.parametrize("hw", ["cpu", "gpu"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_row_kernel(name, hw):
    text, shapes = PROGRAMS[name]
    dtype = "int32" if "int" in name else "float16" if "f16" in name else "float32"
    config = Config(hw="pocl-cpu" if hw == "cpu" else "nvidia-h100")
    exe = tile_compile(text, shapes, dtype=dtype, config=config)
    rows = [s for s in exe.sources if s.kind == "row"]
    assert rows, [s.kind for s in exe.sources]
    # A CPU model gives a row to one work-item, a GPU model to a group of threads.
    assert ("one work-item a row" in rows[0].cost) == (hw == "cpu"), rows[0].cost
    arrays = _arrays(exe)
    outs = exe.run(arrays, poison=True)
    v = exe.check(exe._inputs(arrays), outs)
    assert v.ok, v.worst
    plain = tile_compile(text, shapes, dtype=dtype, config=Config(row_fusion=False))
    assert not any(s.kind == "row" for s in plain.sources)
    ref = plain.run(arrays, poison=True)
    # float16: the unfused kernels round the stored intermediates (E) to half, the fused one
    # keeps them in float: they differ by about half's precision.
    rtol, atol = (3e-3, 1e-4) if dtype == "float16" else (1e-5, 1e-6)
    for k, arr in ref.items():
        np.testing.assert_allclose(outs[k], arr, rtol=rtol, atol=atol, err_msg=k)


@pytest.mark.parametrize("hw", ["pocl-cpu", "nvidia-h100"])
def test_softmax_of_masked_rows(hw):
    # A row of -inf (a fully masked attention row) gives NaN in the reference (0/0) and here.
    exe = tile_compile(SOFTMAX, {"I": (4, 40)}, config=Config(hw=hw))
    x = np.random.default_rng(1).uniform(-3, 3, (4, 40)).astype(np.float32)
    x[2] = -np.inf
    x[1, :30] = -np.inf
    out = exe.run({"I": x}, poison=True)["O"]
    assert np.isnan(out[2]).all()
    np.testing.assert_allclose(out[[0, 1, 3]].sum(1), 1.0, rtol=1e-5)
    v = exe.check(exe._inputs({"I": x}), {"O": out})
    assert v.ok, v.worst


def test_softmax_is_one_kernel():
    exe = tile_compile(SOFTMAX, {"I": (64, 100)})
    assert [s.kind for s in exe.sources] == ["row"]


SHAPE_CASES = ["softmax", "softmax_odd_long_rows", "layer_norm", "rms_norm",
               "instance_norm_middle_axes", "max_and_min_rows_int"]


@pytest.mark.parametrize("hw", ["pocl-cpu", "nvidia-h100"])
@pytest.mark.parametrize("name", SHAPE_CASES)
def test_every_row_shape_matches_the_reference(name, hw):
    """Every shape the time model may choose (threads a row, rows a work-group, vector width)
    computes the reference's result: the row counts are not multiples of the rows a group, so
    the last group's spare rows are exercised too."""
    from tilec.codegen.rows import row_source
    from tilec.plan.row_shape import candidates
    from tilec.plan.rows import RowKernel

    text, shapes = PROGRAMS[name]
    dtype = "int32" if "int" in name else "float32"
    exe = tile_compile(text, shapes, dtype=dtype, config=Config(hw=hw))
    kernel = next(k for k in exe.plan.kernels if isinstance(k, RowKernel))
    shapes_tried = candidates(kernel, exe.plan.program, exe.hw)
    assert len(shapes_tried) > 1
    arrays = _arrays(exe, seed=3)
    seen = set()
    for shape in shapes_tried:
        src = row_source(kernel, exe.plan.program, exe.hw, shape=shape)
        assert src.text not in seen  # each shape is its own kernel
        seen.add(src.text)
        sources = [src if s.name == kernel.name else s for s in exe.sources]
        one = Executable(exe.program, exe.plan, sources, exe.runtime, exe.hw, exe.config)
        outs = one.run(arrays, poison=True)
        v = one.check(one._inputs(arrays), outs)
        assert v.ok, (shape, v.worst)


def test_softmax_computes_each_exp_once_on_a_cpu():
    """One work-item a row: the sum's walk stores E in the output and the last walk reads it
    back (`plan.row_shape.stashes`) instead of computing exp again; not in half precision
    (E would be rounded), nor where the last walk does not need it (log-softmax), nor on a
    GPU model's work-group a row."""
    def row_text(src, shapes, hw, dtype="float32"):
        exe = tile_compile(src, shapes, dtype=dtype, config=Config(hw=hw))
        return next(s.text for s in exe.sources if s.kind == "row")

    text = row_text(SOFTMAX, {"I": (8, 1003)}, "pocl-cpu")  # a vector loop and a rest
    assert text.count("kept for the last walk */") == 2, text
    body = text.split("__kernel")[1]
    last = body.split("by an earlier walk")[1]
    assert "exp(" not in last and body.count(" exp((") == 2, text
    for src, shapes, hw, dtype in [
            (SOFTMAX, {"I": (8, 1000)}, "pocl-cpu", "float16"),
            (PROGRAMS["logsoftmax_builtin"][0], {"I": (8, 1000)}, "pocl-cpu", "float32"),
            (SOFTMAX, {"I": (8, 1000)}, "nvidia-h100", "float32")]:
        assert "kept for the last walk" not in row_text(src, shapes, hw, dtype)
