"""The checker: shapes, size symbols, index polynomials, dtypes, errors with their places; and
`tilec.evaluate` end to end from text against numpy."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import tilec
from tilec.errors import Source, TileCheckError, TileError
from tilec.lang import ir

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RNG = np.random.default_rng(7)


def at(text: str, line: int, col: int) -> str:
    """The source text from 1-based (line, col) to the end of that line."""
    return text.split("\n")[line - 1][col - 1:]


def check(text: str, shapes=None, dtype="float32") -> ir.Program:
    return tilec.check_program(Source(text, "prog.tile"), shapes, dtype)


def shapes_of(program: ir.Program) -> dict[str, tuple[int, ...]]:
    return {name: t.shape for name, t in program.tensors.items()}


def poly(terms: dict[str, Fraction | int], const: Fraction | int = 0) -> ir.Poly:
    return ir.Poly.make(terms, const)


def only_contraction(program: ir.Program) -> ir.Contraction:
    (op,) = [op for op in program.ops if isinstance(op, ir.Contraction)]
    return op


# Inputs, size symbols and output sizes ------------------------------------------------------------

def test_size_symbols_bind_from_inputs_and_outputs_are_listed():
    p = check("function (A[M, K], B[K, N]) -> (C, D) {\n"
              "  C[m, n : M, N] = +(A[m, k] * B[k, n]);\n"
              "  D = C + 1;\n"
              "}", {"A": (3, 5), "B": (5, 2)})
    assert p.inputs == ("A", "B") and p.outputs == ("C", "D")
    assert shapes_of(p) == {"A": (3, 5), "B": (5, 2), "C": (3, 2), "D": (3, 2)}
    c = p.ops[0]
    assert c.indices == ("k", "m", "n")
    assert c.out_idx == (poly({"m": 1}), poly({"n": 1}))
    assert [a.tensor for a in c.inputs] == ["A", "B"]
    assert isinstance(p.ops[1], ir.Elementwise) and p.ops[1].text == "D = C + 1"


def test_scalar_inputs_need_no_shape_and_fixed_dims_are_checked():
    p = check("function (A[3, N], S, T[]) -> (O) {\n  O = A * S + T;\n}", {"A": (3, 4)})
    assert shapes_of(p) == {"A": (3, 4), "S": (), "T": (), "O": (3, 4)}
    p = check("function (S, T[]) -> (O) {\n  O = S - T;\n}", {"S": (), "T": []})
    assert p.tensors["O"].shape == ()


@pytest.mark.parametrize("x, kx, pooled, strided", [(7, 3, 3, 3), (9, 3, 4, 4), (8, 2, 4, 4)])
def test_output_sizes_are_size_expressions(x, kx, pooled, strided):
    p = check("function (I[X], F[KX]) -> (P, S) {\n"
              "  P[x : X / 2] = >(I[2*x + i]), i < 2;\n"
              "  S[x : (X - KX) / 2 + 1] = +(I[2*x + k] * F[k]);\n"
              "}", {"I": (x,), "F": (kx,)})
    assert p.tensors["P"].shape == (pooled,) and p.tensors["S"].shape == (strided,)


@pytest.mark.parametrize("contraction, shape", [
    ("O[i, j] = +(A[i, j]);", (4, 6)),
    ("O[j, i] = +(A[i, j]);", (6, 4)),
    ("O[i] = +(A[i, j]);", (4,)),
    ("O[k] = +(A[0, 2*k]);", (3,)),
    ("O[i, k] = +(A[i, 2*k + 1]);", (4, 3)),
    ("O[x] = +(A[0, x + i]), i < 3, x < 4;", (4,)),
    ("O[i, 0] = +(A[i, j]);", (4, 1)),
    ("O[i + 1] = +(A[i, j]);", (5,)),
    ("O[] = +(A[i, j]);", ()),
])
def test_omitted_output_sizes_are_inferred(contraction, shape):
    p = check(f"function (A[M, N]) -> (O) {{\n  {contraction}\n}}", {"A": (4, 6)})
    assert p.tensors["O"].shape == shape


def test_constraints_defaults_and_options_reach_the_ir():
    p = check("function (A[X], D[X]) -> (O) {\n"
              "  O[x : X] = +(A[x + i - 1]), i < 3, x + i < X - 1 no_defract default D;\n"
              "}", {"A": (8,), "D": (8,)})
    c = only_contraction(p)
    assert [(k.poly, k.bound) for k in c.constraints] == \
        [(poly({"i": 1}), 3), (poly({"x": 1, "i": 1}), 7)]
    assert c.inputs[0].idx == (poly({"x": 1, "i": 1}, -1),)
    assert c.no_defract and c.default == "D"
    assert c.agg == "+" and c.comb is None and c.indices == ("i", "x")


@pytest.mark.parametrize("agg", ["+", "*", ">", "<", "="])
@pytest.mark.parametrize("comb, operands", [
    ("*", "A[i] * B[i]"), ("+", "A[i] + B[i]"), ("==", "A[i] == B[i]"),
    ("?", "A[i] == B[i] ? A[i]"),
])
def test_every_aggregation_and_combination_checks(agg, comb, operands):
    p = check(f"function (A[N], B[N]) -> (O) {{\n  O[i : N] = {agg}({operands});\n}}",
              {"A": (3,), "B": (3,)})
    c = only_contraction(p)
    assert c.agg == agg and c.comb == comb and p.tensors["O"].shape == (3,)


# Index polynomials --------------------------------------------------------------------------------

@pytest.mark.parametrize("index, expected", [
    ("x", poly({"x": 1})),
    ("2*x + i - 1", poly({"x": 2, "i": 1}, -1)),
    ("3 * (x - i) * 2", poly({"x": 6, "i": -6})),
    ("(x + 1) * 2", poly({"x": 2}, 2)),
    ("-x + N", poly({"x": -1}, 9)),
    ("N - 1 - x", poly({"x": -1}, 8)),
    ("x / 2", poly({"x": Fraction(1, 2)})),
    ("(x + 1) / 2", poly({"x": Fraction(1, 2)}, Fraction(1, 2))),
    ("x / 2 / 3", poly({"x": Fraction(1, 6)})),
    ("2 * 3 / 4 * x", poly({"x": Fraction(3, 2)})),
    ("(2*x + 3*i) / 6", poly({"x": Fraction(1, 3), "i": Fraction(1, 2)})),
    ("x - x + i", poly({"i": 1})),
    ("N / 2", poly({}, Fraction(9, 2))),
])
def test_index_polynomials_are_exact(index, expected):
    p = check("function (A[N]) -> (O) {\n"
              f"  O[x, i : 2, 2] = +(A[{index}]);\n"
              "}", {"A": (9,)})
    got = only_contraction(p).inputs[0].idx[0]
    assert got == expected
    assert all(isinstance(v, Fraction) for _, v in got.terms)
    assert isinstance(got.const, Fraction)


# Element types --------------------------------------------------------------------------------

F32, F16, I32 = "float32", "float16", "int32"


@pytest.mark.parametrize("expr, a, b, dtype", [
    ("A + B", F32, F32, F32),
    ("A + B", I32, I32, I32),
    ("A + B", F16, F16, F16),
    ("A + B", F16, F32, F32),
    ("A + 1", I32, I32, I32),
    ("A + 1", F16, F16, F16),
    ("A * 2.5", F16, F16, F16),  # float16 stays float16: literals do not widen tensors
    ("A + 1.5", I32, I32, F32),  # but a float literal makes an int tensor float32
    ("A / 2", I32, I32, I32),
    ("A < B", F32, F32, "bool"),
    ("A == 1", I32, I32, "bool"),
    ("A != B", F16, F16, "bool"),
    ("A && B", F32, F32, "bool"),
    ("!A", I32, I32, "bool"),
    ("(A < B) + 1", F32, F32, I32),
    ("-(A < B)", F32, F32, I32),
    ("A < B ? A : B", F16, F16, F16),
    ("A < 0 ? 0 : 1", F32, F32, I32),
    ("A < 0 ? 0 : 1.5", F32, F32, F32),
    ("A < B ? A : 0.5", I32, I32, F32),
    ("A & B", I32, I32, I32),
    ("A << 2 | B >> 1 ^ ~A", I32, I32, I32),
    ("exp(A)", I32, I32, F32),
    ("exp(A)", F16, F16, F16),
    ("sqrt(A) + tanh(B)", F32, F32, F32),
    ("log(A) * sigmoid(B)", F16, F16, F16),
    ("pow(A, 2)", I32, I32, F32),
    ("abs(A) + relu(B)", I32, I32, I32),
    ("floor(A) + ceil(B)", F32, F32, F32),
    ("max(A, 1.5)", I32, I32, F32),
    ("min(A, B)", I32, F16, F16),
    ("as_float(A, 16)", I32, I32, F16),
    ("as_float(A, 32)", I32, I32, F32),
    ("as_int(A, 32)", F32, F32, I32),
    ("1 + 2", F32, F32, I32),
    ("1 + 2.5", I32, I32, F32),
    ("A * N", F16, F16, F16),
])
def test_elementwise_dtypes(expr, a, b, dtype):
    p = check(f"function (A[N], B[N]) -> (O) {{\n  O = {expr};\n}}", {"A": (3,), "B": (3,)},
              {"A": a, "B": b})
    assert p.tensors["O"].dtype == dtype


def test_contraction_dtypes():
    text = ("function (A[N], B[N]) -> (S, M, C) {\n"
            "  S[i : N] = +(A[i] * B[i]);\n"
            "  M[] = >(A[i]);\n"
            "  C[] = +(A[i] == B[i]);\n"
            "  E[i : N] = =(A[i] == B[i]);\n"
            "}")
    text = text.replace("(S, M, C)", "(S, M, C, E)")
    p = check(text, {"A": (3,), "B": (3,)}, {"A": I32, "B": F16})
    # An `==` combination is boolean (PlaidML's rule: one_hot is bool); summed, bools count
    # as int32.
    assert [p.tensors[n].dtype for n in "SMCE"] == [F16, I32, I32, "bool"]
    p = check(text, {"A": (3,), "B": (3,)}, {"A": "bool", "B": "bool"})
    assert [p.tensors[n].dtype for n in "SMCE"] == [I32, "bool", I32, "bool"]
    p = check(text, {"A": (3,), "B": (3,)}, {"A": "uint8", "B": "int16"})
    assert [p.tensors[n].dtype for n in "SMCE"] == ["int16", "uint8", I32, "bool"]


def test_input_dtypes():
    p = check("function (A[N]) -> (O) {\n  O = A;\n}", {"A": (2,)}, "float64")
    assert p.tensors["A"].dtype == F32
    with pytest.raises(TileCheckError, match="unsupported element type"):
        check("function (A[N]) -> (O) {\n  O = A;\n}", {"A": (2,)}, "int64")


@pytest.mark.parametrize("a, b, expr, shape", [
    ((3, 1), (4,), "A + B", (3, 4)),
    ((2, 3, 1), (3, 4), "A * B", (2, 3, 4)),
    ((5,), (), "A - B", (5,)),
    ((2, 1), (1, 3), "A > B ? A : B", (2, 3)),
    ((4, 1), (4,), "max(A, B)", (4, 4)),
    ((1,), (6,), "A < 0 ? B : 0", (6,)),
])
def test_elementwise_shapes_broadcast_like_numpy(a, b, expr, shape):
    ha = ", ".join(f"a{k}" for k in range(len(a)))
    hb = ", ".join(f"b{k}" for k in range(len(b)))
    p = check(f"function (A[{ha}], B[{hb}]) -> (O) {{\n  O = {expr};\n}}", {"A": a, "B": b})
    assert p.tensors["O"].shape == shape == np.broadcast_shapes(a, b)


def test_opencl_words_as_tensor_and_index_names():
    p = check("function (float[N], kernel[M], half) -> (int, local) {\n"
              "  int[exp, local : N, M] = +(float[exp] * kernel[local]);\n"
              "  local = exp(int) * half;\n"
              "}", {"float": (2,), "kernel": (3,)})
    assert shapes_of(p)["local"] == (2, 3)
    assert only_contraction(p).indices == ("exp", "local")
    assert p.ops[1].expr.op == "mul" and p.ops[1].expr.args[0].op == "exp"


# Errors -------------------------------------------------------------------------------------------

HEADER = "function (A[M, K], B[K, N]) -> (C) {\n"
AB = {"A": (2, 3), "B": (3, 4)}

CHECK_ERRORS = [
    # (id, text, shapes, line, col, the text at (line, col), words in the message)
    ("size symbol bound twice",
     "function (A[M, K],\n          B[K, N]) -> (C) {\n  C = A;\n}", {"A": (2, 3), "B": (4, 5)},
     2, 13, "K, N]", "size symbol K is 3 from dimension 1 of 'A' but 4 from dimension 0 of 'B'"),
    ("fixed size differs",
     "function (A[M, 3],\n          B[K, N]) -> (C) {\n  C = A;\n}", {"A": (2, 4), "B": (3, 4)},
     1, 16, "3],", "fixed to 3"),
    ("rank of the shape given",
     "// matmul\nfunction (A[M, K], B[K, N]) -> (C) {\n  C = A;\n}", {"A": (2, 3, 1), "B": (3, 4)},
     2, 11, "A[M, K]", "2 dimensions in the function header but the shape given, [2, 3, 1]"),
    ("rank of an access",
     HEADER + "  C[m, n : M, N] = +(A[m, k] *\n                    B[k]);\n}", AB,
     3, 21, "B[k]", "'B' has 2 dimensions [3, 4] but 1 indices are given"),
    ("unknown tensor",
     HEADER + "  T = A + 1;\n  C[m : M] = +(Q[m, k]);\n}", AB,
     3, 16, "Q[m, k]", "unknown tensor 'Q' (known tensors: A, B, T)"),
    ("unknown name",
     HEADER + "  C = A *\n      q;\n}", AB, 3, 7, "q;", "unknown name 'q'"),
    ("unknown function",
     HEADER + "  C = exp(A) +\n      softmax(A);\n}", AB, 3, 7, "softmax(", "unknown function"),
    ("arity of a call",
     HEADER + "  C = max(A);\n}", AB, 2, 7, "max(A)", "max takes 2 arguments, 1 given"),
    ("arity of a call, too many",
     HEADER + "  C = 1 + exp(A, B);\n}", AB, 2, 11, "exp(A, B)", "exp takes 1 argument, 2 given"),
    ("output never assigned",
     "function (A[M, K], B[K, N])\n    -> (C, D) {\n  C = A;\n}", AB,
     2, 12, "D) {", "output 'D' is never assigned"),
    ("tensor assigned twice",
     HEADER + "  C = A;\n  C = B;\n}", AB, 3, 3, "C = B", "'C' is already assigned"),
    ("contraction assigns twice",
     HEADER + "  C = A;\n  C[m : M] = +(A[m, k]);\n}", AB, 3, 3, "C[m", "already assigned"),
    ("an input is assigned",
     HEADER + "  A = B;\n  C = A;\n}", AB, 2, 3, "A = B", "'A' is an input"),
    ("a size symbol is assigned",
     HEADER + "  M = A;\n  C = A;\n}", AB, 2, 3, "M = A", "'M' is a size symbol"),
    ("non-linear index",
     HEADER + "  C[i : M] = +(A[i,\n                 i * j]);\n}", AB,
     3, 18, "i * j]", "index polynomials must be linear"),
    ("division by an index",
     HEADER + "  C[i, j : M, K] = +(A[i, j / i]);\n}", AB,
     2, 27, "j / i]", "may only be divided by a constant"),
    ("division by zero in an index",
     HEADER + "  C[i, j : M, K] = +(A[i, j / (K - 3)]);\n}", AB,
     2, 27, "j / (K - 3)", "division by zero"),
    ("a float in an index",
     HEADER + "  C[i : M] = +(A[i, 0.5]);\n}", AB, 2, 21, "0.5]", "integer constants"),
    ("a call in an index",
     HEADER + "  C[i : M] = +(A[i, exp(i)]);\n}", AB, 2, 21, "exp(i)", "index polynomial"),
    ("an index nothing bounds",
     HEADER + "  T = A;\n  C[i, j] = +(A[i, k]);\n}", AB,
     3, 3, "C[i, j]", "nothing determines the range of index 'j'"),
    ("indices bounded only together",
     HEADER + "  C[i] = +(A[i - j, 0]);\n}", AB,
     2, 3, "C[i]", "nothing determines the range of index 'i'"),
    ("shapes that do not broadcast",
     HEADER + "  T = A * 2;\n  C = T + B;\n}", AB,
     3, 7, "T + B", "operand shapes [2, 3] and [3, 4] do not broadcast"),
    ("shapes that do not broadcast in a select",
     HEADER + "  C = A < 0 ?\n    A : B;\n}", AB, 2, 7, "A < 0 ?", "do not broadcast"),
    ("shapes that do not broadcast in a call",
     HEADER + "  C = 1 + max(A, B);\n}", AB, 2, 11, "max(A, B)", "do not broadcast"),
    ("no shape for an input",
     "function (A[M, K],\n          B[K, N]) -> (C) {\n  C = A;\n}", {"A": (2, 3)},
     2, 11, "B[K, N]", "no shape given for input 'B' (expected 2 dimensions: K, N)"),
    ("a shape for a name that is not an input",
     "// header comment\nfunction (A[M, K], B[K, N]) -> (C) {\n  C = A;\n}",
     {**AB, "Z": (1,)}, 2, 1, "function",
     "a shape was given for 'Z', which is not an input of the function (inputs: A, B)"),
    ("bitwise and of floats",
     HEADER + "  C = A &\n      1;\n}", AB, 2, 7, "A &", "'&' needs integer operands, not float32"),
    ("shift of floats",
     HEADER + "  C = 1 << A;\n}", AB, 2, 7, "1 << A", "'<<' needs integer operands"),
    ("bitwise not of floats",
     HEADER + "  T = A;\n  C = 1 + ~T;\n}", AB, 3, 11, "~T", "'~' needs integer operands"),
    ("default of the wrong shape",
     HEADER + "  C[m, n : M, N] = +(A[m, k] * B[k, n])\n      default A;\n}", AB,
     3, 15, "A;", "the default 'A' has shape [2, 3] but 'C' has [2, 4]"),
    ("unknown default",
     HEADER + "  C[m : M] = +(A[m, k]) default Z;\n}", AB, 2, 33, "Z;", "unknown tensor 'Z'"),
    ("unknown size symbol",
     HEADER + "  C[m, n : M, Q] = +(A[m, k]);\n}", AB, 2, 15, "Q]", "unknown size symbol 'Q'"),
    ("a float size",
     HEADER + "  C[m : 2.5] = +(A[m, k]);\n}", AB, 2, 9, "2.5]", "a size must be an integer"),
    ("a size that is not positive",
     HEADER + "  C[m : M - 2] = +(A[m, k]);\n}", AB, 2, 9, "M - 2]", "evaluates to 0"),
    ("more sizes than indices",
     HEADER + "  C[m : M, N] = +(A[m, k]);\n}", AB, 2, 3, "C[m", "1 indices but 2 sizes"),
    ("a bad bit width",
     HEADER + "  C = as_float(A, 8);\n}", AB, 2, 19, "8)", "as_float takes a width"),
]


@pytest.mark.parametrize("text, shapes, line, col, there, words",
                         [c[1:] for c in CHECK_ERRORS], ids=[c[0] for c in CHECK_ERRORS])
def test_check_errors_point_at_the_problem(text, shapes, line, col, there, words):
    with pytest.raises(TileCheckError) as info:
        check(text, shapes)
    err = info.value
    assert (err.line, err.col) == (line, col)
    assert at(text, line, col).startswith(there)
    assert words in err.message
    rendered = str(err)
    assert rendered.startswith(f"prog.tile:{line}:{col}: ")
    source_line = text.split("\n")[line - 1]
    assert f"\n    {source_line}\n    {' ' * (col - 1)}^" in rendered


def test_every_error_is_a_tile_error():
    assert issubclass(TileCheckError, TileError)


# The `// shapes:` comment -------------------------------------------------------------------------

MATMUL = ("// shapes: A=3x5 B=5x2\n"
          "function (A[M, K], B[K, N]) -> (C) {\n"
          "  C[m, n : M, N] = +(A[m, k] * B[k, n]);\n"
          "}\n")


def test_shapes_comment_is_the_default():
    assert shapes_of(tilec.check_program(MATMUL))["C"] == (3, 2)
    assert shapes_of(tilec.check_program(MATMUL, {"A": (1, 4), "B": (4, 6)}))["C"] == (1, 6)
    p = tilec.check_program("// shapes: S= X=2,3\nfunction (S, X[A, B]) -> (O) {\n  O = S + X;\n}")
    assert shapes_of(p) == {"S": (), "X": (2, 3), "O": (2, 3)}


def test_a_bad_shapes_comment_points_into_it():
    text = MATMUL.replace("B=5x2", "B=5xy")
    with pytest.raises(TileError) as info:
        tilec.check_program(Source(text, "m.tile"))
    assert (info.value.line, info.value.col) == (1, 18)
    assert at(text, 1, 18).startswith("B=5xy")
    assert str(info.value).startswith("m.tile:1:18: shapes comment: the shape of B must be")


def test_without_a_shapes_comment_the_inputs_need_shapes():
    with pytest.raises(TileCheckError) as info:
        tilec.check_program(MATMUL.split("\n", 1)[1])
    assert (info.value.line, info.value.col) == (1, 11)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.tile")), ids=lambda p: p.name)
def test_examples_check_with_their_shapes_comment(path):
    text = path.read_text()
    assert text.startswith("// shapes:")
    p = tilec.check_program(Source(text, str(path)))
    assert p.outputs and all(p.tensors[o].dtype == "float32" for o in p.outputs)


def test_example_shapes():
    def load(name: str) -> ir.Program:
        return tilec.check_program(Source((EXAMPLES / name).read_text(), name))

    assert shapes_of(load("matmul.tile"))["C"] == (1024, 1024)
    assert shapes_of(load("conv_relu.tile"))["R"] == (1, 56, 56, 64)
    assert shapes_of(load("maxpool.tile"))["O"] == (1, 28, 28, 64)
    assert shapes_of(load("softmax.tile"))["M"] == (64, 1)


# tilec.evaluate from text, against numpy ----------------------------------------------------------

def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_evaluate_matmul_odd_sizes():
    a, b = rand(5, 7), rand(7, 3)
    (out,) = tilec.evaluate((EXAMPLES / "matmul.tile").read_text(), A=a, B=b).values()
    assert out.shape == (5, 3) and out.dtype == np.float32
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_evaluate_matmul_int32():
    a = RNG.integers(-5, 6, (3, 4)).astype(np.int32)
    b = RNG.integers(-5, 6, (4, 2)).astype(np.int32)
    out = tilec.evaluate((EXAMPLES / "matmul.tile").read_text(), A=a, B=b)["C"]
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, a @ b)


def test_evaluate_conv_relu_small():
    d, k = rand(2, 7, 6, 3), rand(3, 3, 4, 3)
    out = tilec.evaluate((EXAMPLES / "conv_relu.tile").read_text(), D=d, K=k)["R"]
    padded = np.pad(d, ((0, 0), (1, 1), (1, 1), (0, 0)))
    want = np.zeros((2, 7, 6, 4), np.float32)
    for i in range(3):
        for j in range(3):
            want += np.einsum("nxyc,oc->nxyo", padded[:, i:i + 7, j:j + 6], k[i, j])
    np.testing.assert_allclose(out, np.maximum(want, 0), rtol=1e-4, atol=1e-5)


def test_evaluate_softmax():
    x = rand(5, 11) * 4
    y = tilec.evaluate((EXAMPLES / "softmax.tile").read_text(), X=x)["Y"]
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y.sum(axis=1), 1, rtol=1e-5)


@pytest.mark.parametrize("x, y", [(6, 8), (7, 9)])
def test_evaluate_maxpool_halves_sizes(x, y):
    i = rand(2, x, y, 3)
    o = tilec.evaluate((EXAMPLES / "maxpool.tile").read_text(), I=i)["O"]
    want = i[:, :x // 2 * 2, :y // 2 * 2].reshape(2, x // 2, 2, y // 2, 2, 3).max(axis=(2, 4))
    assert o.shape == (2, x // 2, y // 2, 3)
    np.testing.assert_array_equal(o, want)


def test_evaluate_several_outputs_and_a_broadcast():
    text = ("function (A[M, N], B[N], S) -> (C, D, E) {\n"
            "  C = A * B + S;                 // [M, N] * [N] + scalar\n"
            "  D[m : M] = +(C[m, n]);\n"
            "  E = D > 0 ? D : -D;\n"
            "}\n")
    a, b, s = rand(4, 5), rand(5), np.float32(0.25)
    out = tilec.evaluate(text, A=a, B=b, S=s)
    assert list(out) == ["C", "D", "E"]
    np.testing.assert_allclose(out["C"], a * b + s, rtol=1e-6)
    np.testing.assert_allclose(out["D"], (a * b + s).sum(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["E"], np.abs(out["D"]), rtol=1e-6)


def test_evaluate_strided_conv_with_size_expression():
    text = ("function (I[X], F[KX]) -> (O) {\n"
            "  O[x : (X - KX) / 2 + 1] = +(I[2*x + k] * F[k]);\n"
            "}\n")
    i, f = rand(11), rand(3)
    o = tilec.evaluate(text, I=i, F=f)["O"]
    want = np.array([i[2 * x:2 * x + 3] @ f for x in range(5)])
    np.testing.assert_allclose(o, want, rtol=1e-5, atol=1e-6)
