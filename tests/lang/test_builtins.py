"""PlaidML's builtins in the reference (tilec.evaluate) against numpy written from each builtin's
meaning, their type rules, and the errors bad calls get."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tilec
from tilec.errors import TileCheckError, TileWarning
from tilec.lang.builtins import prng_mix

RNG = np.random.default_rng(7)


def f32(*shape):
    return RNG.uniform(-2, 2, size=shape).astype(np.float32)


def test_reshape_row_major_and_symbolic_sizes():
    x = f32(4, 6)
    out = tilec.evaluate("function (X[A, B]) -> (O) { O = reshape(X, 2, A * B / 2); }", X=x)
    np.testing.assert_array_equal(out["O"], x.reshape(2, 12))
    d = np.int32(3)
    out = tilec.evaluate("function (X, D) -> (O) { O = reshape(X, D, 8); }", X=x, D=d)
    np.testing.assert_array_equal(out["O"], x.reshape(3, 8))


def test_reshape_of_an_expression_and_inside_an_expression():
    x = f32(2, 3)
    out = tilec.evaluate("function (X) -> (O) { O = 2.0 * reshape(X + 1.0, 3, 2); }", X=x)
    np.testing.assert_allclose(out["O"], 2 * (x + 1).reshape(3, 2), rtol=1e-6)


def test_index_and_shape():
    x = f32(3, 4, 5)
    out = tilec.evaluate("function (X) -> (I, J, S) { I = index(X, 1); J = index(X, -1); "
                         "S = shape(X); }", X=x)
    np.testing.assert_array_equal(out["I"], np.broadcast_to(np.arange(4)[:, None], (3, 4, 5)))
    np.testing.assert_array_equal(out["J"], np.broadcast_to(np.arange(5), (3, 4, 5)))
    np.testing.assert_array_equal(out["S"], [3, 4, 5])
    assert out["I"].dtype == np.int32 and out["S"].dtype == np.int32


def test_argmax_the_plaidml_way():
    x = f32(4, 7)
    # op.py's ArgMax: the row maximum (kept as a column), each element's column index where
    # it equals the maximum (else Y), the smallest of those.
    text = """function (I[X, Y]) -> (O) {
        M[x, 0 : X, 1] = >(I[x, y]);
        T = index(I, 1);
        IX = (I == M ? T : Y);
        AM[x : X] = <(IX[x, y]);
        O = as_uint(AM, 32);
    }"""
    out = tilec.evaluate(text, I=x)
    np.testing.assert_array_equal(out["O"], np.argmax(x, axis=1))
    assert out["O"].dtype == np.uint32


def test_gather_rows_clamped_and_float_index():
    v = f32(5, 3)
    i = np.array([[0, 4], [2, 9], [-3, 1]], np.int32)
    out = tilec.evaluate("function (V, I) -> (O) { O = gather(V, I); }", V=v, I=i)
    np.testing.assert_array_equal(out["O"], v[np.clip(i, 0, 4)])
    assert out["O"].shape == (3, 2, 3)
    fi = np.array([1.7, 3.2, -0.5], np.float32)  # truncated toward zero
    out = tilec.evaluate("function (V, I) -> (O) { O = gather(V, I); }", V=v, I=fi)
    np.testing.assert_array_equal(out["O"], v[[1, 3, 0]])


def test_scatter_sums_rows_with_equal_index():
    v = f32(4, 3)
    i = np.array([2, 0, 2, 1], np.int32)
    like = f32(3, 3)
    out = tilec.evaluate("function (V, I, L) -> (O) { O = scatter(V, I, L); }", V=v, I=i, L=like)
    want = np.zeros((3, 3), np.float64)
    for r, row in zip(i, v, strict=True):
        want[r] += row
    np.testing.assert_allclose(out["O"], want, rtol=1e-6)


def test_gather_then_scatter_is_the_gradient_pair():
    # PlaidML's gradient of gather is scatter(DY, I, V).
    v, i = f32(6, 2), np.array([5, 1, 5], np.int32)
    out = tilec.evaluate("function (V, I, DY) -> (G, DV) { G = gather(V, I); "
                         "DV = scatter(DY, I, V); }", V=v, I=i, DY=np.ones((3, 2), np.float32))
    np.testing.assert_array_equal(out["DV"][:, 0], [0, 1, 0, 0, 0, 2])


def test_conversions_wrap_and_truncate():
    x = np.array([-1.5, 0.7, 200.9, 300.2], np.float32)
    out = tilec.evaluate("function (X) -> (U, I, S, B, H) { U = as_uint(X, 8); I = as_int(X, 8); "
                         "S = as_int(X, 16); B = as_bool(X); H = as_float(X, 16); }", X=x)
    t = np.trunc(x.astype(np.float64)).astype(np.int64)
    np.testing.assert_array_equal(out["U"], t.astype(np.uint8))
    np.testing.assert_array_equal(out["I"], t.astype(np.int8))
    np.testing.assert_array_equal(out["S"], t.astype(np.int16))
    np.testing.assert_array_equal(out["B"], x != 0)
    assert [out[k].dtype for k in "UISBH"] == [np.uint8, np.int8, np.int16, np.bool_,
                                              np.float16]


def test_narrow_arithmetic_wraps_at_every_operation():
    a = np.array([200, 100, 7], np.uint8)
    b = np.array([100, 200, 9], np.uint8)
    out = tilec.evaluate("function (A, B) -> (S, D, Q) { S = A + B; D = (A + B) / 2; "
                         "Q = A - B; }", A=a, B=b)
    s = (a.astype(np.int64) + b).astype(np.uint8)
    np.testing.assert_array_equal(out["S"], s)
    np.testing.assert_array_equal(out["D"], s // 2)  # the sum wrapped before the division
    np.testing.assert_array_equal(out["Q"], (a.astype(np.int64) - b).astype(np.uint8))


def test_uint32_compares_and_shifts_unsigned():
    a = np.array([0x80000000, 5, 0xFFFFFFFF], np.uint32)
    out = tilec.evaluate("function (A) -> (R, G) { R = A >> 4; G = A > 7; }", A=a)
    np.testing.assert_array_equal(out["R"], a >> 4)
    np.testing.assert_array_equal(out["G"], a > 7)


@pytest.mark.parametrize("fn, want", [
    ("builtin_softmax", lambda x: np.exp(x - x.max(1, keepdims=True))
     / np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True)),
    ("builtin_logsoftmax", lambda x: x - x.max(1, keepdims=True)
     - np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True))),
])
def test_softmax_builtins(fn, want):
    x = f32(3, 5) * 10
    out = tilec.evaluate(f"function (I[X, Y]) -> (O) {{ O = {fn}(I, X, Y); }}", I=x)
    np.testing.assert_allclose(out["O"], want(x.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_inline_builtins_nest_and_keep_user_names():
    # The caller has tensors named like the builtin's temporaries (M, E, S) and index names.
    x = f32(2, 4)
    text = """function (I[X, Y], M, E) -> (O, S) {
        S = M + E;
        O = 2.0 * builtin_softmax(I + 1.0, X, Y) + cmp_lt(I, 0.5);
    }"""
    out = tilec.evaluate(text, I=x, M=np.float32(1), E=np.float32(2))
    sm = np.exp(x - x.max(1, keepdims=True))
    sm /= sm.sum(1, keepdims=True)
    np.testing.assert_allclose(out["O"], 2 * sm + (x < 0.5), rtol=1e-5)
    assert float(out["S"]) == 3.0


def test_binary_crossentropy_reverse_grad_ident_cond():
    p = RNG.uniform(0.05, 0.95, (3, 4)).astype(np.float32)
    t = RNG.uniform(0, 1, (3, 4)).astype(np.float32)
    out = tilec.evaluate("function (P[A, B], T[A, B]) -> (R, G, I, C) { "
                         "R = builtin_binary_crossentropy(P, T, A * B); G = reverse_grad(P, T); "
                         "I = ident(T); C = cond(P > 0.5, P, T); }", P=p, T=t)
    p64, t64 = p.astype(np.float64), t.astype(np.float64)
    np.testing.assert_allclose(out["R"], -t64 * np.log(p64) - (1 - t64) * np.log(1 - p64),
                               rtol=1e-5)
    np.testing.assert_array_equal(out["G"], p)
    np.testing.assert_array_equal(out["I"], t)
    np.testing.assert_array_equal(out["C"], np.where(p > 0.5, p, t))


def test_broadcast_of_sizes():
    a, b = f32(1, 4), f32(3, 4)
    out = tilec.evaluate("function (A[M, K], B[N, K]) -> (O) { R = broadcast(M, N); "
                         "O[r, k : R, K] = +(B[r, k]); }", A=a, B=b)
    np.testing.assert_array_equal(out["O"], b)
    with pytest.raises(TileCheckError, match="broadcast of sizes 2 and 3") as e:
        tilec.evaluate("function (A[M], B[N]) -> (O) { R = broadcast(M, N); O[r : R] = "
                       "+(B[r]); }", A=f32(2), B=f32(3))
    assert e.value.line == 1


def test_prng_is_the_documented_generator():
    state = np.array([[12345, 7], [1, 2], [3, 4]], np.uint32)
    text = """function (S) -> (V, N) {
        P = prng_step(S, 2, 3);
        N = prng_state(P);
        V = prng_value(P);
    }"""
    out = tilec.evaluate(text, S=state)
    e = np.arange(6, dtype=np.uint32) + np.uint32(7)
    h = prng_mix(prng_mix(e) ^ np.uint32(12345))
    np.testing.assert_array_equal(out["V"], ((h >> 8) * 2.0 ** -24).reshape(2, 3))
    assert out["V"].dtype == np.float32 and (out["V"] < 1).all() and (out["V"] >= 0).all()
    want = state.copy()
    want[0, 1] += 6
    np.testing.assert_array_equal(out["N"], want)
    again = tilec.evaluate(text, S=out["N"])
    assert not np.array_equal(again["V"], out["V"])


def test_prng_values_are_uniform():
    out = tilec.evaluate("function (S) -> (V) { P = prng_step(S, 20000); V = prng_value(P); }",
                         S=np.array([99, 0], np.uint32))
    v = out["V"]
    assert abs(v.mean() - 0.5) < 0.01 and abs(v.var() - 1 / 12) < 0.005
    assert np.unique(v).size > 19000


@pytest.mark.parametrize("text, arrays, match, col", [
    ("function (X) -> (O) { O = reshape(X, 5); }", {"X": (2, 3)},
     r"reshape \[2, 3\] to \[5\]: 6 elements do not fill 5", 27),
    ("function (X) -> (O) { O = gather(X, X, X); }", {"X": (2,)}, "gather takes 2 arguments",
     27),
    ("function (X) -> (O) { O = as_int(X, 64); }", {"X": (2,)}, "64-bit types", 37),
    ("function (X) -> (O) { O = as_uint(X, 12); }", {"X": (2,)}, "takes a width of 8, 16, 32",
     38),
    ("function (X) -> (O) { O = builtin_softmax(X, 2); }", {"X": (2, 2)},
     r"builtin_softmax takes 3 arguments \(X, R, C\)", 27),
    ("function (X) -> (O) { O = builtin_softmax(X, 2, 2); }", {"X": (2, 2, 2)},
     "in builtin_softmax: 'X' has 3 dimensions", 27),
    ("function (X) -> (O) { O = index(X, 3); }", {"X": (2, 2)}, "axis 3 is out of range", 36),
    ("function (S) -> (O) { P = prng_step(S, 2); O = P; }", {"S": (3,)},
     "random-number draw", 48),
    ("function (S) -> (O) { P = prng_step(S, 2); O = prng_value(S); }", {"S": (3,)},
     r"prng_value reads a draw", 59),
    ("function (X) -> (O) { O = nosuch(X); }", {"X": (2,)}, "unknown function 'nosuch'", 27),
])
def test_bad_calls_are_located(text, arrays, match, col):
    arrs = {k: np.ones(s, np.uint32 if k == "S" else np.float32) for k, s in arrays.items()}
    with pytest.raises(TileCheckError, match=match) as e:
        tilec.evaluate(text, **arrs)
    assert (e.value.line, e.value.col) == (1, col), str(e.value)


def test_prng_state_must_be_32_bit_with_two_elements():
    with pytest.raises(TileCheckError, match="2 or more elements"):
        tilec.evaluate("function (S) -> (V) { P = prng_step(S, 2); V = prng_value(P); }",
                       S=np.ones(1, np.uint32))
    with pytest.raises(TileCheckError, match="uint32 \\(or int32\\) tensor, not float32"):
        tilec.evaluate("function (S) -> (V) { P = prng_step(S, 2); V = prng_value(P); }",
                       S=np.ones(3, np.float32))


def test_false_unused_assertion_warns_and_true_one_is_silent():
    text = "function (X[A, B]) -> (O) {{ T = assert_ok({}); O = X; }}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tilec.evaluate(text.format("A == 2"), X=f32(2, 3))
    with pytest.warns(TileWarning, match=r"<string>:1:\d+: assert_ok: the condition is false"):
        tilec.evaluate(text.format("A == B"), X=f32(2, 3))


def test_input_used_as_a_size_needs_its_value_when_compiling():
    from tilec.lang.api import check_program

    text = "function (X, D) -> (O) { O = reshape(X, D, 2); }"
    with pytest.raises(TileCheckError, match=r"values=\{'D': N\}") as e:
        check_program(text, {"X": (4,), "D": ()}, {"X": "float32", "D": "int32"})
    assert (e.value.line, e.value.col) == (1, 41)
    p = check_program(text, {"X": (4,), "D": ()}, {"X": "float32", "D": "int32"}, {"D": 2})
    assert p.fixed == {"D": 2} and p.tensors["O"].shape == (2, 2)
    with pytest.raises(TileCheckError, match="only 0-d integer inputs"):
        check_program(text, {"X": (4,), "D": ()}, {"X": "float32", "D": "float32"}, {"D": 2})
    with pytest.raises(TileCheckError, match="not an input"):
        check_program(text, {"X": (4,), "D": ()}, {"X": "float32", "D": "int32"}, {"Q": 2})


def test_erf_reference():
    import math

    x = f32(11)
    out = tilec.evaluate("function (X) -> (O) { O = erf(X); }", X=x)
    np.testing.assert_allclose(out["O"], [math.erf(v) for v in x.astype(np.float64)], rtol=1e-6)
