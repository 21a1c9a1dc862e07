"""The numpy reference against hand-written numpy, on random data."""

from __future__ import annotations

import re
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilec import check_program
from tilec.errors import TileCheckError
from tilec.lang import ir
from tilec.lang.reference import evaluate_program, index_bounds
from tilec.lang.reference_paths import plan_fast

RNG = np.random.default_rng(1234)


# Builders ----------------------------------------------------------------------------------------

def poly(text: str) -> ir.Poly:
    """An affine polynomial from text like `2*x + i - 1`, `x/2`, `3*n + k`, `0`."""
    total = ir.Poly.constant(0)
    for sign, term in re.findall(r"([+-]?)\s*([^+-]+)", text.replace(" ", "")):
        coef, name = Fraction(1), None
        for factor in term.split("*"):
            num, _, den = factor.partition("/")
            if num.isdigit():
                coef *= int(num)
            else:
                name = num
            if den:
                coef /= int(den)
        if sign == "-":
            coef = -coef
        total = total + (ir.Poly.make({name: coef}) if name else ir.Poly.constant(coef))
    return total


def acc(tensor: str, *idx: str) -> ir.Access:
    return ir.Access(tensor, tuple(poly(i) for i in idx))


def contraction(out: ir.Access, agg: str, inputs: list[ir.Access], comb: str | None = None,
                constraints: tuple[tuple[str, int], ...] = (),
                default: str | None = None) -> ir.Contraction:
    cons = tuple(ir.Constraint(poly(p), b) for p, b in constraints)
    polys = [*out.idx, *(p for a in inputs for p in a.idx), *(c.poly for c in cons)]
    names = tuple(sorted({k for p in polys for k in p.indices}))
    return ir.Contraction(out.tensor, out.idx, agg, comb, tuple(inputs), cons, names,
                          default=default)


def program(inputs: dict[str, tuple], outputs: list[str], ops: list[ir.Statement],
            shapes: dict[str, tuple]) -> ir.Program:
    """`inputs`/`shapes` map names to a shape, or to (shape, dtype)."""
    tensors = {}
    for name, spec in {**inputs, **shapes}.items():
        shape, dtype = (spec if len(spec) == 2 and isinstance(spec[1], str)
                        else (spec, "float32"))
        tensors[name] = ir.Tensor(name, tuple(shape), dtype)
    return ir.Program(tuple(inputs), tuple(outputs), tensors, tuple(ops))


def ref(t: ir.Tensor) -> ir.Ref:
    return ir.Ref(t.name, t.dtype, t.shape)


def op(name: str, *args: ir.Expr, dtype: str = "float32", shape: tuple = ()) -> ir.Op:
    return ir.Op(name, tuple(args), dtype, shape)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def run(prog: ir.Program, arrays: dict, path: str = "auto") -> list[np.ndarray]:
    out = evaluate_program(prog, arrays, path=path)
    assert list(out) == list(prog.outputs)
    for name, arr in out.items():
        t = prog.tensors[name]
        assert arr.shape == t.shape and arr.dtype == np.dtype(t.dtype), name
    return list(out.values())


def close(a: np.ndarray, b: np.ndarray, tol: float = 1e-5) -> None:
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


# Programs, each checked on both paths ------------------------------------------------------------

def conv_program(n: int, x: int, ci: int, co: int) -> ir.Program:
    c = contraction(acc("O", "n", "x", "y", "co"), "+",
                    [acc("D", "n", "x+i-1", "y+j-1", "ci"), acc("K", "i", "j", "co", "ci")],
                    "*")
    o = ir.Tensor("O", (n, x, x, co))
    relu = ir.Elementwise("R", op("select", op("gt", ref(o), ir.Const(0, "int32"), dtype="bool",
                                                shape=o.shape),
                                  ref(o), ir.Const(0, "int32"), shape=o.shape))
    return program({"D": (n, x, x, ci), "K": (3, 3, co, ci)}, ["R"], [c, relu],
                   {"O": o.shape, "R": o.shape})


def np_conv(d: np.ndarray, k: np.ndarray, stride: int = 1, dil: int = 1, pad: int = 0):
    d = np.pad(d.astype(np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    ki, kj = k.shape[:2]
    ox = (d.shape[1] - dil * (ki - 1) - 1) // stride + 1
    oy = (d.shape[2] - dil * (kj - 1) - 1) // stride + 1
    out = np.zeros((d.shape[0], ox, oy, k.shape[2]))
    for i in range(ki):
        for j in range(kj):
            win = d[:, dil * i: dil * i + stride * (ox - 1) + 1: stride,
                    dil * j: dil * j + stride * (oy - 1) + 1: stride, :]
            out += np.einsum("nxyc,oc->nxyo", win, k[i, j].astype(np.float64))
    return out


def case_matmul():
    c = contraction(acc("C", "m", "n"), "+", [acc("A", "m", "k"), acc("B", "k", "n")], "*")
    p = program({"A": (37, 53), "B": (53, 29)}, ["C"], [c], {"C": (37, 29)})
    a, b = rand(37, 53), rand(53, 29)
    return p, {"A": a, "B": b}, [a.astype(np.float64) @ b]


def case_same_conv():
    d, k = rand(2, 7, 7, 3), rand(3, 3, 4, 3)
    return conv_program(2, 7, 3, 4), {"D": d, "K": k}, [np.maximum(np_conv(d, k, pad=1), 0)]


def case_valid_conv():
    c = contraction(acc("O", "n", "x", "y", "co"), "+",
                    [acc("D", "n", "x+i", "y+j", "ci"), acc("K", "i", "j", "co", "ci")], "*")
    p = program({"D": (2, 8, 9, 3), "K": (3, 2, 5, 3)}, ["O"], [c], {"O": (2, 6, 8, 5)})
    d, k = rand(2, 8, 9, 3), rand(3, 2, 5, 3)
    return p, {"D": d, "K": k}, [np_conv(d, k)]


def case_strided_conv():
    c = contraction(acc("O", "n", "x", "y", "co"), "+",
                    [acc("D", "n", "2*x+i", "2*y+j", "ci"), acc("K", "i", "j", "co", "ci")], "*")
    p = program({"D": (1, 9, 10, 2), "K": (3, 3, 4, 2)}, ["O"], [c], {"O": (1, 4, 4, 4)})
    d, k = rand(1, 9, 10, 2), rand(3, 3, 4, 2)
    return p, {"D": d, "K": k}, [np_conv(d, k, stride=2)]


def case_dilated_conv():
    c = contraction(acc("O", "n", "x", "y", "co"), "+",
                    [acc("D", "n", "x+2*i", "y+2*j", "ci"), acc("K", "i", "j", "co", "ci")], "*")
    p = program({"D": (2, 9, 8, 3), "K": (3, 3, 2, 3)}, ["O"], [c], {"O": (2, 5, 4, 2)})
    d, k = rand(2, 9, 8, 3), rand(3, 3, 2, 3)
    return p, {"D": d, "K": k}, [np_conv(d, k, dil=2)]


def case_depthwise():
    c = contraction(acc("O", "n", "x", "y", "c"), "+",
                    [acc("D", "n", "x+i-1", "y+j-1", "c"), acc("K", "i", "j", "c")], "*")
    p = program({"D": (2, 6, 5, 4), "K": (3, 3, 4)}, ["O"], [c], {"O": (2, 6, 5, 4)})
    d, k = rand(2, 6, 5, 4), rand(3, 3, 4)
    want = np.zeros((2, 6, 5, 4))
    dp = np.pad(d.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    for i in range(3):
        for j in range(3):
            want += dp[:, i:i + 6, j:j + 5, :] * k[i, j]
    return p, {"D": d, "K": k}, [want]


def case_maxpool():
    c = contraction(acc("O", "n", "x", "y", "c"), ">", [acc("I", "n", "2*x+i", "2*y+j", "c")],
                    constraints=(("i", 2), ("j", 2)))
    p = program({"I": (2, 8, 6, 3)}, ["O"], [c], {"O": (2, 4, 3, 3)})
    x = rand(2, 8, 6, 3)
    return p, {"I": x}, [x.reshape(2, 4, 2, 3, 2, 3).max(axis=(2, 4))]


def case_avgpool():
    c = contraction(acc("S", "n", "x", "y", "c"), "+", [acc("I", "n", "2*x+i", "2*y+j", "c")],
                    constraints=(("i", 2), ("j", 2)))
    s = ir.Tensor("S", (2, 4, 3, 3))
    e = ir.Elementwise("O", op("div", ref(s), ir.Const(4, "int32"), shape=s.shape))
    p = program({"I": (2, 8, 6, 3)}, ["O"], [c, e], {"S": s.shape, "O": s.shape})
    x = rand(2, 8, 6, 3)
    return p, {"I": x}, [x.reshape(2, 4, 2, 3, 2, 3).mean(axis=(2, 4))]


def case_softmax():
    x, m, e, n = (ir.Tensor("X", (5, 7)), ir.Tensor("M", (5, 1)), ir.Tensor("E", (5, 7)),
                  ir.Tensor("N", (5, 1)))
    ops = [contraction(acc("M", "i", "0"), ">", [acc("X", "i", "j")]),
           ir.Elementwise("E", op("exp", op("sub", ref(x), ref(m), shape=(5, 7)), shape=(5, 7))),
           contraction(acc("N", "i", "0"), "+", [acc("E", "i", "j")]),
           ir.Elementwise("Y", op("div", ref(e), ref(n), shape=(5, 7)))]
    p = program({"X": (5, 7)}, ["Y"], ops, {"M": (5, 1), "E": (5, 7), "N": (5, 1), "Y": (5, 7)})
    xv = rand(5, 7)
    ev = np.exp(xv - xv.max(axis=1, keepdims=True))
    return p, {"X": xv}, [ev / ev.sum(axis=1, keepdims=True)]


def case_transpose():
    c = contraction(acc("O", "j", "k", "i"), "=", [acc("A", "i", "j", "k")])
    p = program({"A": (3, 4, 5)}, ["O"], [c], {"O": (4, 5, 3)})
    a = rand(3, 4, 5)
    return p, {"A": a}, [a.transpose(1, 2, 0)]


def case_aggregations():
    aggs = {"+": np.sum, "*": np.prod, ">": np.max, "<": np.min}
    ops = [contraction(acc(f"O{k}", "i"), a, [acc("A", "j", "i")]) for k, a in enumerate(aggs)]
    p = program({"A": (4, 6)}, [f"O{k}" for k in range(4)], ops,
                {f"O{k}": (6,) for k in range(4)})
    a = rand(4, 6) + 0.5
    return p, {"A": a}, [f(a.astype(np.float64), axis=0) for f in aggs.values()]


def case_int_aggregations():
    aggs = {"+": np.sum, "*": np.prod, ">": np.max, "<": np.min}
    ops = [contraction(acc(f"O{k}", "i"), a, [acc("A", "i", "j")]) for k, a in enumerate(aggs)]
    p = program({"A": ((5, 3), "int32")}, [f"O{k}" for k in range(4)], ops,
                {f"O{k}": ((5,), "int32") for k in range(4)})
    a = RNG.integers(-9, 9, (5, 3)).astype(np.int32)
    return p, {"A": a}, [f(a, axis=1).astype(np.int32) for f in aggs.values()]


def case_scalar_and_trace():
    ops = [contraction(acc("S"), "+", [acc("A", "i", "j")]),
           contraction(acc("T"), "+", [acc("A", "i", "i")]),
           contraction(acc("D", "i"), "=", [acc("A", "i", "i")]),
           contraction(acc("G", "i", "i"), "=", [acc("V", "i")])]
    p = program({"A": (6, 6), "V": (4,)}, ["S", "T", "D", "G"], ops,
                {"S": (), "T": (), "D": (6,), "G": (4, 4)})
    a, v = rand(6, 6), rand(4)
    return p, {"A": a, "V": v}, [a.astype(np.float64).sum(), np.trace(a.astype(np.float64)),
                                 np.diag(a), np.diag(v)]


def case_broadcast_elementwise():
    a, b, c, d = (ir.Tensor("A", (3, 4)), ir.Tensor("B", (4,)), ir.Tensor("C", (3, 1)),
                  ir.Tensor("D", (1, 4)))
    ops = [ir.Elementwise("X", op("add", ref(a), ref(b), shape=(3, 4))),
           ir.Elementwise("Y", op("mul", ref(c), ref(d), shape=(3, 4))),
           ir.Elementwise("Z", op("max", op("tanh", ref(b), shape=(4,)), ref(c), shape=(3, 4)))]
    p = program({"A": (3, 4), "B": (4,), "C": (3, 1), "D": (1, 4)}, ["X", "Y", "Z"], ops,
                {"X": (3, 4), "Y": (3, 4), "Z": (3, 4)})
    av, bv, cv, dv = rand(3, 4), rand(4), rand(3, 1), rand(1, 4)
    return p, {"A": av, "B": bv, "C": cv, "D": dv}, [av + bv, cv * dv,
                                                     np.maximum(np.tanh(bv), cv)]


def case_triangular():
    # j <= i written as the Tile constraint 0 <= i - j < 5 (the bound is the row count).
    c = contraction(acc("O", "i"), "+", [acc("A", "i", "j")], constraints=(("i-j", 5),))
    p = program({"A": (5, 5)}, ["O"], [c], {"O": (5,)})
    a = rand(5, 5)
    return p, {"A": a}, [np.tril(a.astype(np.float64)).sum(axis=1)]


def case_default():
    # Writes only the interior of a 6x6 output: the border comes from the default tensor.
    c = contraction(acc("O", "i+1", "j+1"), ">", [acc("A", "i", "j")], default="B")
    p = program({"A": (4, 4), "B": (6, 6)}, ["O", "P"],
                [c, contraction(acc("P", "i+1", "j+1"), "<", [acc("A", "i", "j")])],
                {"O": (6, 6), "P": (6, 6)})
    a, b = rand(4, 4), rand(6, 6)
    want, want_p = b.copy(), np.zeros((6, 6), np.float32)
    want[1:5, 1:5] = a
    want_p[1:5, 1:5] = a
    return p, {"A": a, "B": b}, [want, want_p]


def case_comb_eq():
    ops = [contraction(acc("E", "i", "j"), "+", [acc("A", "i"), acc("B", "j")], "=="),
           contraction(acc("M", "i"), ">", [acc("X", "i", "j")]),
           contraction(acc("AM", "i"), ">", [acc("X", "i", "j"), acc("M", "i"), acc("IX", "j")],
                       "?"),
           contraction(acc("S", "i", "j"), "+", [acc("X", "i", "j"), acc("A", "i")], "+")]
    p = program({"A": ((5,), "int32"), "B": ((3,), "int32"), "X": (5, 6), "IX": ((6,), "int32")},
                ["E", "AM", "S"], ops, {"E": ((5, 3), "int32"), "M": (5,),
                                        "AM": ((5,), "int32"), "S": (5, 6)})
    a, b = RNG.integers(0, 3, 5).astype(np.int32), RNG.integers(0, 3, 3).astype(np.int32)
    x = rand(5, 6)
    return p, {"A": a, "B": b, "X": x, "IX": np.arange(6, dtype=np.int32)}, [
        (a[:, None] == b[None, :]).astype(np.int32), x.argmax(axis=1), x + a[:, None]]


def case_repeat_and_fraction():
    ops = [contraction(acc("R", "3*n+k"), "=", [acc("I", "n")], constraints=(("k", 3),)),
           contraction(acc("U", "x"), "+", [acc("I", "x/2")]),
           contraction(acc("V", "x"), "+", [acc("I", "x")], constraints=(("x/2", 2),))]
    p = program({"I": (4,)}, ["R", "U", "V"], ops, {"R": (12,), "U": (7,), "V": (4,)})
    i = rand(4)
    u = np.zeros(7, np.float32)
    u[0::2] = i
    return p, {"I": i}, [np.repeat(i, 3), u, i]


def case_negative_and_multiplicity():
    # Flip via a negative coefficient, and an index only a constraint reads (it counts points).
    ops = [contraction(acc("F", "i"), "=", [acc("A", "4-i")]),
           contraction(acc("M", "i"), "+", [acc("A", "i")], constraints=(("k", 3),)),
           contraction(acc("B", "i", "k"), "=", [acc("A", "i")], constraints=(("k", 2),))]
    p = program({"A": (5,)}, ["F", "M", "B"], ops, {"F": (5,), "M": (5,), "B": (5, 2)})
    a = rand(5)
    return p, {"A": a}, [a[::-1], 3 * a, np.stack([a, a], axis=1)]


def case_constant_accesses():
    ops = [contraction(acc("Z"), "+", [acc("S0")]),
           contraction(acc("W", "2"), "=", [acc("A", "1")]),
           contraction(acc("Y", "i"), "+", [acc("S0"), acc("A", "i")], "*")]
    p = program({"S0": (), "A": (3,)}, ["Z", "W", "Y"], ops, {"Z": (), "W": (4,), "Y": (3,)})
    a, s0 = rand(3), rand()
    return p, {"S0": s0, "A": a}, [s0, np.array([0, 0, a[1], 0]), s0 * a]


CASES = [case_matmul, case_same_conv, case_valid_conv, case_strided_conv, case_dilated_conv,
         case_depthwise, case_maxpool, case_avgpool, case_softmax, case_transpose,
         case_aggregations, case_int_aggregations, case_scalar_and_trace,
         case_broadcast_elementwise, case_triangular, case_default, case_comb_eq,
         case_repeat_and_fraction, case_negative_and_multiplicity, case_constant_accesses]


@pytest.mark.parametrize("path", ["auto", "generic"])
@pytest.mark.parametrize("case", CASES, ids=lambda f: f.__name__[5:])
def test_program(case, path):
    prog, arrays, want = case()
    got = run(prog, arrays, path)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        close(g, w)


@pytest.mark.parametrize("case", [case_matmul, case_same_conv, case_strided_conv, case_maxpool,
                                  case_triangular, case_softmax, case_scalar_and_trace])
def test_fast_path_is_taken(case):
    prog, _, _ = case()
    for o in prog.ops:
        if isinstance(o, ir.Contraction):
            assert plan_fast(o, prog.tensors, index_bounds(o, prog.tensors)) is not None


STRIDED = """function (K[KH, KW, CI, CO], V[N]) -> (P, T, R, B, S, C, G) {
  P[po, k0, k1, ci, pi : 3, KH, KW, CI, 4] = =(K[k0, k1, ci, 4*po + pi]);
  T[co, ci, k0, k1 : CO, CI, KH, KW] = =(K[k0, k1, ci, co]);
  R[i : N] = =(V[N - 1 - i]);
  B[i, j : N, 3] = =(V[i]);
  S[i : 3] = =(V[2*i + 1]);
  C[i : N] = =(V[i]), i < 4;
  G[i : N + 2] = =(V[i]);
}"""


def test_copies_as_one_strided_view():
    # Panels, transposes, reversals, broadcasts and strided slices take the strided copy and
    # agree with the generic path; a constraint, or an output the input does not cover,
    # does not take it.
    from tilec.lang.reference_copy import strided_copy

    prog = check_program(STRIDED, {"K": (3, 2, 5, 12), "V": (7,)}, "float32")
    rng = np.random.default_rng(4)
    arrays = {"K": rng.standard_normal((3, 2, 5, 12)).astype(np.float32),
              "V": rng.standard_normal(7).astype(np.float32)}
    taken = {o.output: strided_copy(o, prog.tensors, arrays, index_bounds(o, prog.tensors))
             is not None for o in prog.ops}
    assert taken == {"P": True, "T": True, "R": True, "B": True, "S": True, "C": False,
                     "G": False}
    got = evaluate_program(prog, arrays)
    want = evaluate_program(prog, arrays, path="generic")
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
        assert got[k].flags.c_contiguous and got[k].flags.writeable
    np.testing.assert_array_equal(got["R"], arrays["V"][::-1])
    np.testing.assert_array_equal(got["P"][1, :, :, :, 2], arrays["K"][..., 6])


def test_conv_coupled_indices_are_the_kernel_window():
    prog = conv_program(1, 5, 2, 2)
    c = prog.ops[0]
    bounds = index_bounds(c, prog.tensors)
    assert bounds == {"ci": (0, 1), "co": (0, 1), "i": (0, 2), "j": (0, 2), "n": (0, 0),
                      "x": (0, 4), "y": (0, 4)}
    assert plan_fast(c, prog.tensors, bounds).coupled == ("i", "j")


def test_index_bounds():
    prog, _, _ = case_strided_conv()
    b = index_bounds(prog.ops[0], prog.tensors)
    assert b["i"] == (0, 2) and b["x"] == (0, 3) and b["ci"] == (0, 1)
    tri, _, _ = case_triangular()
    assert index_bounds(tri.ops[0], tri.tensors) == {"i": (0, 4), "j": (0, 4)}


def test_unbounded_index_is_an_error():
    c = contraction(acc("O", "i"), "+", [acc("A", "i+k")])
    prog = program({"A": (4,)}, ["O"], [c], {"O": (4,)})
    # k is bounded through i+k; an index only in a one-sided constraint would not be:
    assert index_bounds(c, prog.tensors)["k"] == (-3, 3)
    bad = contraction(acc("O", "i"), "+", [acc("A", "i")], constraints=(("k+m", 5),))
    with pytest.raises(TileCheckError, match="unbounded"):
        evaluate_program(program({"A": (4,)}, ["O"], [bad], {"O": (4,)}), {"A": rand(4)})


def test_an_empty_range_does_not_depend_on_the_index_names():
    """Regression: propagation stops at the first empty interval, and index_bounds then called
    an index it had not reached yet unbounded when its name sorted before the empty one (B[a]:
    an error the checker does not give) and gave the statement its default when it sorted after
    (B[z]).  Now the default for both, as check.py decides (compiling refuses the empty range)."""
    for name in ("a", "z"):
        src = f"function (A[N], B[M]) -> (O) {{ O[i : 3] = +(A[i + 10] * B[{name}]); }}"
        prog = check_program(src, {"A": (5,), "B": (4,)})  # the checker accepts both
        assert index_bounds(prog.ops[0], prog.tensors) == {"i": (0, -1), name: (0, -1)}
        (o,) = run(prog, {"A": rand(5), "B": rand(4)})
        np.testing.assert_array_equal(o, np.zeros(3, np.float32))
    # An index that nothing determines stays an error whatever its name (it was one for "a"
    # only: for "z" the empty range was met first).
    for name in ("a", "z"):
        bad = contraction(acc("O", "i"), "+", [acc("A", "i+10")], constraints=((f"{name}+m", 5),))
        tensors = program({"A": (4,)}, ["O"], [bad], {"O": (3,)}).tensors
        with pytest.raises(TileCheckError, match="unbounded"):
            index_bounds(bad, tensors)


def test_input_shape_errors_name_the_dimension():
    prog, arrays, _ = case_matmul()
    with pytest.raises(TileCheckError, match=r"B: dimension 1 has size 30, expected 29"):
        evaluate_program(prog, {**arrays, "B": rand(53, 30)})
    with pytest.raises(TileCheckError, match="rank"):
        evaluate_program(prog, {**arrays, "A": rand(37)})
    with pytest.raises(TileCheckError, match="no array given for input B"):
        evaluate_program(prog, {"A": arrays["A"]})


def test_inputs_cast_to_declared_dtype():
    c = contraction(acc("O", "i"), "+", [acc("A", "i", "j")])
    prog = program({"A": ((3, 4), "int32")}, ["O"], [c], {"O": ((3,), "int32")})
    (o,) = run(prog, {"A": np.full((3, 4), 2.7)})
    np.testing.assert_array_equal(o, [8, 8, 8])


def test_elementwise_ops():
    a, b = ir.Tensor("A", (6,), "int32"), ir.Tensor("B", (6,), "int32")
    f = ir.Tensor("F", (6,), "float32")
    s = (6,)
    exprs = {
        "div": op("div", ref(a), ref(b), dtype="int32", shape=s),
        "shl": op("shl", ref(a), ir.Const(2, "int32"), dtype="int32", shape=s),
        "bits": op("bitxor", op("bitand", ref(a), ref(b), dtype="int32", shape=s),
                   op("bitnot", ref(a), dtype="int32", shape=s), dtype="int32", shape=s),
        "cmp": op("and", op("lt", ref(a), ref(b), dtype="bool", shape=s),
                  op("not", op("eq", ref(a), ir.Const(0, "int32"), dtype="bool", shape=s),
                     dtype="bool", shape=s), dtype="bool", shape=s),
        "asint": op("as_int", ref(f), ir.Const(32, "int32"), dtype="int32", shape=s),
        "half": op("as_float", ref(f), ir.Const(16, "int32"), dtype="float16", shape=s),
        "sig": op("sigmoid", op("abs", ref(f), shape=s), shape=s),
        "pw": op("pow", op("relu", ref(f), shape=s), ir.Const(2, "int32"), shape=s),
        "fl": op("sub", op("ceil", ref(f), shape=s), op("floor", ref(f), shape=s), shape=s),
        "sel": op("select", op("ge", ref(f), ir.Const(0.5, "float32"), dtype="bool", shape=s),
                  op("sqrt", op("exp", ref(f), shape=s), shape=s),
                  op("log", op("max", ref(f), ir.Const(1, "int32"), shape=s), shape=s),
                  shape=s),
    }
    dtypes = {"div": "int32", "shl": "int32", "bits": "int32", "cmp": "bool", "asint": "int32",
              "half": "float16"}
    ops = [ir.Elementwise(k, e) for k, e in exprs.items()]
    shapes = {k: (s, dtypes.get(k, "float32")) for k in exprs}
    prog = program({"A": (s, "int32"), "B": (s, "int32"), "F": s}, list(exprs), ops, shapes)
    av = np.array([7, -7, 7, -7, 0, 5], np.int32)
    bv = np.array([2, 2, -2, -2, 3, 9], np.int32)
    fv = np.array([1.5, -1.5, 2.7, -2.7, 0.25, 3.0], np.float32)
    got = dict(zip(exprs, run(prog, {"A": av, "B": bv, "F": fv}), strict=True))
    np.testing.assert_array_equal(got["div"], [3, -3, -3, 3, 0, 0])
    np.testing.assert_array_equal(got["shl"], av * 4)
    np.testing.assert_array_equal(got["bits"], (av & bv) ^ ~av)
    np.testing.assert_array_equal(got["cmp"], (av < bv) & (av != 0))
    np.testing.assert_array_equal(got["asint"], [1, -1, 2, -2, 0, 3])
    np.testing.assert_array_equal(got["half"], fv.astype(np.float16))
    close(got["sig"], 1 / (1 + np.exp(-np.abs(fv))))
    close(got["pw"], np.maximum(fv, 0) ** 2)
    close(got["fl"], np.ceil(fv) - np.floor(fv))
    close(got["sel"], np.where(fv >= 0.5, np.sqrt(np.exp(fv)), np.log(np.maximum(fv, 1))))


# Random einsum-like contractions -----------------------------------------------------------------

@st.composite
def einsums(draw):
    letters = "ijkl"
    sizes = {k: draw(st.integers(1, 4)) for k in letters}
    n_in = draw(st.integers(1, 2))
    ins = [draw(st.lists(st.sampled_from(letters), min_size=1, max_size=3)) for _ in range(n_in)]
    used = sorted({k for s in ins for k in s})
    out = draw(st.lists(st.sampled_from(used), max_size=3, unique=True))
    agg = draw(st.sampled_from(["+", "*"])) if n_in == 1 else "+"
    comb = "*" if n_in == 2 else None
    seed = draw(st.integers(0, 2**16))
    return sizes, ins, out, agg, comb, seed


@settings(max_examples=60, deadline=None)
@given(einsums())
def test_random_einsum(spec):
    sizes, ins, out, agg, comb, seed = spec
    rng = np.random.default_rng(seed)
    names = [f"T{n}" for n in range(len(ins))]
    arrays = {n: rng.uniform(0.5, 1.5, [sizes[k] for k in s]).astype(np.float32)
              for n, s in zip(names, ins, strict=True)}
    c = contraction(acc("O", *out), agg, [acc(n, *s) for n, s in zip(names, ins, strict=True)],
                    comb)
    prog = program({n: a.shape for n, a in arrays.items()}, ["O"], [c],
                   {"O": tuple(sizes[k] for k in out)})
    spec_text = ",".join("".join(s) for s in ins) + "->" + "".join(out)
    ops64 = [arrays[n].astype(np.float64) for n in names]
    if agg == "+":
        want = np.einsum(spec_text, *ops64)
    else:  # product over the reduced indices, taken on the diagonal of repeated ones
        distinct = "".join(dict.fromkeys(ins[0]))
        diag = np.einsum(f"{''.join(ins[0])}->{distinct}", ops64[0])
        red = tuple(i for i, k in enumerate(distinct) if k not in out)
        kept = [k for k in distinct if k in out]
        want = np.einsum(f"{''.join(kept)}->{''.join(out)}", diag.prod(axis=red))
    for path in ("auto", "generic"):
        (got,) = run(prog, arrays, path)
        close(got, want, 1e-4)


def test_fast_and_generic_agree_on_mixed_programs():
    rng = np.random.default_rng(7)
    ops = [contraction(acc("O", "x", "c"), ">", [acc("I", "x-k+2", "c"), acc("W", "k", "c")],
                       "*", constraints=(("x+k", 9),)),
           contraction(acc("P", "2*x+k"), "+", [acc("I", "x", "c")], constraints=(("k", 2),)),
           contraction(acc("Q", "c", "x"), "<", [acc("I", "x", "c"), acc("W", "x-3", "c")], "+")]
    prog = program({"I": (7, 3), "W": (4, 3)}, ["O", "P", "Q"], ops,
                   {"O": (7, 3), "P": (14,), "Q": (3, 7)})
    arrays = {"I": rng.standard_normal((7, 3)), "W": rng.standard_normal((4, 3))}
    fast_out = run(prog, arrays, "fast")
    for f, g in zip(fast_out, run(prog, arrays, "generic"), strict=True):
        close(f, g)
    assert plan_fast(ops[0], prog.tensors, index_bounds(ops[0], prog.tensors)) is not None


# Random affine contractions against a brute-force enumeration -----------------------------------

HALVES = [Fraction(1), Fraction(-1), Fraction(2), Fraction(-2), Fraction(1, 2)]


@st.composite
def affine_contractions(draw):
    names = "ijk"[:draw(st.integers(1, 3))]

    def rand_poly(max_terms: int) -> ir.Poly:
        used = draw(st.lists(st.sampled_from(names), max_size=max_terms, unique=True))
        return ir.Poly.make({k: draw(st.sampled_from(HALVES)) for k in used},
                            draw(st.integers(-2, 2)))

    def rand_access(tensor: str, rank: int) -> tuple[ir.Access, tuple[int, ...]]:
        shape = tuple(draw(st.integers(1, 4)) for _ in range(rank))
        return ir.Access(tensor, tuple(rand_poly(2) for _ in shape)), shape

    n_in = draw(st.integers(1, 2))
    ins = [rand_access(f"T{n}", draw(st.integers(1, 2))) for n in range(n_in)]
    out, out_shape = rand_access("O", draw(st.integers(0, 2)))
    cons = tuple(ir.Constraint(rand_poly(2), draw(st.integers(1, 5)))
                 for _ in range(draw(st.integers(0, 1))))
    agg = draw(st.sampled_from(["+", "*", ">", "<"]))
    comb = draw(st.sampled_from(["*", "+"])) if n_in == 2 else None
    polys = [*out.idx, *(p for a, _ in ins for p in a.idx), *(c.poly for c in cons)]
    indices = tuple(sorted({k for p in polys for k in p.indices}))
    c = ir.Contraction("O", out.idx, agg, comb, tuple(a for a, _ in ins), cons, indices)
    shapes = {a.tensor: s for a, s in ins}
    return program(shapes, ["O"], [c], {"O": out_shape}), draw(st.integers(0, 2**16))


def brute_force(c: ir.Contraction, prog: ir.Program, arrays: dict, box: int) -> tuple:
    """Every valid point of [-box, box]^n, then a plain Python aggregation over them."""
    side = [2 * box + 1] * len(c.indices)
    grid = np.indices(side).reshape(len(c.indices), -1) - box if side else np.zeros((0, 1), int)
    env = dict(zip(c.indices, grid, strict=True))
    n = grid.shape[1]
    ok = np.ones(n, bool)
    elems = []
    for a in [ir.Access(c.output, c.out_idx), *c.inputs]:
        dims = []
        for p, size in zip(a.idx, prog.tensors[a.tensor].shape, strict=True):
            v2 = np.broadcast_to(2 * p.evaluate(env), (n,))  # coefficients are halves
            ok &= (v2 % 2 == 0) & (v2 >= 0) & (v2 < 2 * size)
            dims.append((v2 // 2).astype(int))
        elems.append(dims)
    for k in c.constraints:
        v2 = np.broadcast_to(2 * k.poly.evaluate(env), (n,))
        ok &= (v2 >= 0) & (v2 < 2 * k.bound)
    points = np.flatnonzero(ok)
    result: dict[tuple, float] = {}
    for pt in points:
        vals = [float(arrays[a.tensor][tuple(int(d[pt]) for d in e)])
                for a, e in zip(c.inputs, elems[1:], strict=True)]
        v = vals[0] if c.comb is None else (vals[0] * vals[1] if c.comb == "*"
                                            else vals[0] + vals[1])
        key = tuple(int(d[pt]) for d in elems[0])
        if key not in result:
            result[key] = v
        elif c.agg == "+":
            result[key] += v
        elif c.agg == "*":
            result[key] *= v
        else:
            result[key] = (max if c.agg == ">" else min)(result[key], v)
    want = np.zeros(prog.tensors[c.output].shape)
    for key, v in result.items():
        want[key] = v
    return want, grid[:, points]


@settings(max_examples=150, deadline=None)
@given(affine_contractions())
def test_random_affine_contractions(case):
    prog, seed = case
    c = prog.ops[0]
    try:
        bounds = index_bounds(c, prog.tensors)
    except TileCheckError:
        return  # an index no access or constraint limits on both sides
    if any(lo < -12 or hi > 12 for lo, hi in bounds.values()):
        return
    rng = np.random.default_rng(seed)
    arrays = {n: rng.uniform(0.5, 1.5, prog.tensors[n].shape).astype(np.float32)
              for n in prog.inputs}
    want, points = brute_force(c, prog, arrays, 16)
    for row, k in zip(points, c.indices, strict=True):  # the bounds are sound
        assert row.size == 0 or (bounds[k][0] <= row.min() and row.max() <= bounds[k][1])
    for path in ("auto", "generic"):
        (got,) = run(prog, arrays, path)
        close(got, want, 1e-4)
