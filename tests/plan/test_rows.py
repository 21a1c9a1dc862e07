"""Which statement chains become row-fused kernels (`plan.rows`): found from index spaces."""

from __future__ import annotations

from tilec.lang.api import check_program
from tilec.plan.fuse import plan_kernels
from tilec.plan.rows import RowKernel

SOFTMAX = """function (I[X, Y]) -> (O) {
    M[i, 0 : X, 1] = >(I[i, j]);
    E = exp(I - M);
    S[i, 0 : X, 1] = +(E[i, j]);
    O = E / S;
}"""

LAYERNORM = """function (X[N, C], G[C], B[C]) -> (Y) {
    S[n, 0 : N, 1] = +(X[n, c]);
    M = S / C;
    D = X - M;
    Q[n, 0 : N, 1] = +(D[n, c] * D[n, c]);
    V = Q / C;
    Y = D / sqrt(V + 0.00001) * G + B;
}"""


def kinds(text, shapes, rows=True):
    plan = plan_kernels(check_program(text, shapes), rows=rows)
    return [type(k).__name__ for k in plan.kernels], plan


def test_softmax_is_one_row_kernel_storing_only_the_output():
    names, plan = kinds(SOFTMAX, {"I": (4, 9)})
    assert names == ["RowKernel"]
    k = plan.kernels[0]
    assert k.axes == (1,) and k.rows == 4 and k.length == 9 and k.writes == ("O",)
    names, _ = kinds(SOFTMAX, {"I": (4, 9)}, rows=False)
    assert "RowKernel" not in names and len(names) == 4


def test_softmax_on_the_first_axis():
    text = SOFTMAX.replace("M[i, 0 : X, 1] = >(I[i, j])", "M[0, j : 1, Y] = >(I[i, j])") \
        .replace("S[i, 0 : X, 1] = +(E[i, j])", "S[0, j : 1, Y] = +(E[i, j])")
    names, plan = kinds(text, {"I": (4, 9)})
    assert names == ["RowKernel"] and plan.kernels[0].axes == (0,)


def test_layer_norm_with_a_product_reduction_is_split_where_the_form_ends():
    # Q = +(D * D) has two operands: not a row reduction, so the chain ends before it; the
    # first part (S, M, D) has no full statement reading a row result except D: kept.
    names, plan = kinds(LAYERNORM, {"X": (3, 8), "G": (8,), "B": (8,)})
    assert names[0] == "RowKernel"
    assert [o.output for o in plan.kernels[0].ops] == ["S", "M", "D"]


def test_layer_norm_written_with_a_square_is_one_kernel():
    text = LAYERNORM.replace("Q[n, 0 : N, 1] = +(D[n, c] * D[n, c]);",
                             "D2 = D * D;\n    Q[n, 0 : N, 1] = +(D2[n, c]);")
    names, plan = kinds(text, {"X": (3, 8), "G": (8,), "B": (8,)})
    assert names == ["RowKernel"]
    assert plan.kernels[0].writes == ("Y",)


def test_a_lone_reduction_stays_a_contraction():
    names, _ = kinds("function (I[X, Y]) -> (S) { S[i, 0 : X, 1] = +(I[i, j]); }", {"I": (4, 9)})
    assert names == ["ContractionKernel"]


def test_intermediates_read_later_are_written():
    text = SOFTMAX.replace("-> (O)", "-> (O, Z)").replace("O = E / S;", "O = E / S;\n"
                                                         "    Z[i : X] = +(E[i, j]);")
    names, plan = kinds(text, {"I": (4, 9)})
    row = next(k for k in plan.kernels if isinstance(k, RowKernel))
    assert "E" in row.writes and "O" in row.writes


def test_leading_elementwise_statements_join_the_row_kernel():
    text = """function (X[N, C], G[C]) -> (Y) {
        X2 = X * X;
        Q[n, 0 : N, 1] = +(X2[n, c]);
        Y = X / sqrt(Q / C + 0.000001) * G;
    }"""
    names, plan = kinds(text, {"X": (3, 8), "G": (8,)})
    assert names == ["RowKernel"]
    assert [o.output for o in plan.kernels[0].ops] == ["X2", "Q", "Y"]
    assert plan.kernels[0].writes == ("Y",)
