"""PlaidML's builtins compiled: every program runs on the CPU device with its outputs poisoned
first and is compared with the numpy reference on random inputs (indices out of range
included: they are clamped on both sides)."""

from __future__ import annotations

import numpy as np
import pytest

from tilec.compiler import compile as tile_compile
from tilec.errors import TileError
from tilec.lang.reference import NP_DTYPES, random_array

from ..device import needs_device

pytestmark = needs_device

PROGRAMS = {
    # name: (text, shapes, dtypes)
    "reshape_then_contract": (
        "function (X[A, B], W[K, N]) -> (O) { R = reshape(X, A * B / 4, 4); "
        "O[i, n : A * B / 4, N] = +(R[i, k] * W[k, n]); }",
        {"X": (6, 2), "W": (4, 3)}, {}),
    "reshape_of_a_contraction_fused_with_elementwise": (
        "function (X[A, B]) -> (O) { S[a, b : A, B] = +(X[a, b]); "
        "O = exp(reshape(S, B, A)) + 1.0; }",
        {"X": (3, 5)}, {}),
    "index_broadcast_into_a_wider_kernel": (
        "function (X[A, B, C], Y[B, 1]) -> (O) { J = index(Y, 0); O = X * J + index(X, 2); }",
        {"X": (2, 3, 4), "Y": (3, 1)}, {}),
    "shape": ("function (X) -> (S, T) { S = shape(X); T = 2 * shape(X); }",
              {"X": (3, 1, 7, 2)}, {}),
    "argmax": (
        "function (I[X, Y]) -> (O) { M[x, 0 : X, 1] = >(I[x, y]); T = index(I, 1); "
        "IX = (I == M ? T : Y); AM[x : X] = <(IX[x, y]); O = as_uint(AM, 32); }",
        {"I": (5, 9)}, {}),
    "gather_int_index": ("function (V, I) -> (O) { O = gather(V, I); }",
                         {"V": (4, 2, 3), "I": (3, 5)}, {"I": "int32"}),
    "gather_float_index_1d": ("function (V, I) -> (O) { O = gather(V, I * 2.0); }",
                              {"V": (6,), "I": (7,)}, {}),
    "gather_uint_index_of_computed_values": (
        "function (V[N, M], I) -> (O) { W = V * 3.0; O = gather(W, I) + 1.0; }",
        {"V": (5, 4), "I": (2, 3)}, {"I": "uint32"}),
    "scatter": ("function (V, I, L) -> (O) { O = scatter(V, I, L); }",
                {"V": (6, 3), "I": (6,), "L": (4, 3)}, {"I": "int32"}),
    "softmax_logsoftmax": (
        "function (I[X, Y]) -> (S, L) { S = builtin_softmax(I, X, Y); "
        "L = builtin_logsoftmax(I * 4.0, X, Y); }", {"I": (7, 33)}, {}),
    "narrow_types": (
        "function (A, B) -> (S, P, D, N) { S = A + B; P = as_int(A, 16) * 300; "
        "D = (A - B) / 3; N = ~A; }",
        {"A": (4, 5), "B": (4, 5)}, {"A": "uint8", "B": "uint8"}),
    "int8_int16_mixed": (
        "function (A, B) -> (S, M, R) { S = A * B; M = max(A, B); R = relu(A) << 3; }",
        {"A": (9,), "B": (9,)}, {"A": "int8", "B": "int16"}),
    "uint32_ops": (
        "function (A[M, N], B) -> (Q, R, G, X, C) { Q = A / B; R = A >> 3; G = A > B; "
        "X = A ^ B; C[i : M] = >(A[i, j]); }",
        {"A": (4, 6), "B": (4, 6)}, {"A": "uint32", "B": "uint32"}),
    "narrow_contraction": (
        "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }",
        {"A": (3, 40), "B": (40, 2)}, {"A": "int8", "B": "int8"}),
    "conversions": (
        "function (X) -> (U, I, B, H) { Y = X * 100.0; U = as_uint(abs(Y), 8); "
        "I = as_int(Y, 8); B = as_bool(X, 1); H = as_float(Y, 16); }",
        {"X": (3, 7)}, {}),
    "one_hot_is_bool": (
        "function (Idx[I0], Count[C]) -> (O) { O[i, c : I0, C] = =(Idx[i] == Count[c]); }",
        {"Idx": (5,), "Count": (4,)}, {"Idx": "int32", "Count": "int32"}),
    "prng_dropout_with_broadcast_mask": (
        "function (S, X[A, B, C]) -> (O, N) { P = prng_step(S, A, 1, C); N = prng_state(P); "
        "O = (prng_value(P) < 0.5 ? X * 2.0 : 0.0); }",
        {"S": (3, 4), "X": (4, 5, 6)}, {"S": "uint32"}),
    "prng_int32_state": (
        "function (S) -> (V, N) { P = prng_step(S, 33); V = prng_value(P); N = prng_state(P); }",
        {"S": (2,)}, {"S": "int32"}),
}


def _run(text, shapes, dtypes, seed=0):
    dt = {n: dtypes.get(n, "float32") for n in shapes}
    exe = tile_compile(text, shapes, dtype=dt)
    rng = np.random.default_rng(seed)
    arrays = {n: random_array(rng, shapes[n], dt[n]) for n in shapes}
    outs = exe.run(arrays, poison=True)
    v = exe.check(exe._inputs(arrays), outs)
    assert v.ok, v.worst
    for name, arr in outs.items():
        assert arr.dtype == NP_DTYPES[exe.program.tensors[name].dtype], name
    return exe, arrays, outs


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_builtin_program(name):
    _run(*PROGRAMS[name])


def test_gather_reads_a_tensor_computed_in_memory():
    # W is computed elementwise with V's shape; gather reads W at other rows, so W must not be
    # a value of the gathering kernel: two kernels, W written.
    exe, _, _ = _run(*PROGRAMS["gather_uint_index_of_computed_values"])
    assert len(exe.sources) == 2 and any(a.tensor == "W" and a.role == "out"
                                         for a in exe.sources[0].args)


def test_prng_kernel_matches_reference_bit_for_bit():
    text, shapes, dtypes = PROGRAMS["prng_int32_state"]
    exe, arrays, outs = _run(text, shapes, dtypes)
    from tilec.lang.reference import evaluate_program

    ref = evaluate_program(exe.program, exe._inputs(arrays))
    np.testing.assert_array_equal(outs["V"], ref["V"])
    np.testing.assert_array_equal(outs["N"], ref["N"])


def test_value_bound_input_is_checked_at_run_time():
    text = "function (X, D) -> (O) { O = reshape(X, D, 3); }"
    exe = tile_compile(text, {"X": (2, 3), "D": ()}, dtype={"X": "float32", "D": "int32"},
                       values={"D": 2})
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = exe.run({"X": x, "D": np.int32(2)}, poison=True)
    np.testing.assert_array_equal(out["O"], x.reshape(2, 3))
    with pytest.raises(TileError, match="compiled with D = 2"):
        exe.run({"X": x, "D": np.int32(3)})


def test_erf():
    _run("function (X) -> (O) { O = erf(X * 3.0) + erf(2); }", {"X": (5, 7)}, {})
