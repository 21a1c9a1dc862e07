"""Tile as PlaidML's op library writes it: inputs without a dimension list (any shape), named
sizes (`Pad0 = 0;`), size expressions with max/min wherever an integer may stand, and the
trigonometric and rounding builtins.  Each is checked against numpy through the reference, and
compiled on the CPU device with poisoned outputs."""

from __future__ import annotations

import numpy as np
import pytest

import tilec

from ..device import needs_device


def _rng():
    return np.random.default_rng(11)



def _compiled(src: str, **arrays: np.ndarray) -> dict[str, np.ndarray]:
    exe = tilec.compile(src, {k: a.shape for k, a in arrays.items()})
    return exe.run(arrays, poison=True)


ANY_SHAPE = "function (A, B) -> (O) { O = A * 2 + B; }"


@pytest.mark.parametrize("shapes", [((3, 4), (4,)), ((2, 3, 5), (2, 3, 5)), ((), (6,))])
def test_inputs_without_dimensions_take_any_shape(shapes):
    rng = _rng()
    a = rng.uniform(-1, 1, shapes[0]).astype(np.float32)
    b = rng.uniform(-1, 1, shapes[1]).astype(np.float32)
    out = tilec.evaluate(ANY_SHAPE, A=a, B=b)["O"]
    np.testing.assert_allclose(out, a * 2 + b, rtol=1e-6)


@needs_device
def test_inputs_without_dimensions_compiled():
    rng = _rng()
    a = rng.uniform(-1, 1, (5, 7)).astype(np.float32)
    b = rng.uniform(-1, 1, (7,)).astype(np.float32)
    np.testing.assert_allclose(_compiled(ANY_SHAPE, A=a, B=b)["O"], a * 2 + b, rtol=1e-6)


def test_empty_dimension_list_stays_a_scalar():
    with pytest.raises(tilec.TileError, match=r"input 'S' has 0 dimensions"):
        tilec.check_program("function (S[], A[N]) -> (O) { O = A * S; }",
                            {"S": (3,), "A": (3,)})


NAMED_SIZE = """function (I[N]) -> (O) {
  P = 0;
  Q = max(0, N - 5) / 2;
  O[x : N - 2 * Q] = +(I[x - P + Q]);
}"""


def test_named_sizes_are_constants_in_index_polynomials():
    """`P = 0;` is a size, not a free index: before, O summed all of I into every element."""
    rng = _rng()
    i = rng.uniform(-1, 1, 9).astype(np.float32)
    q = max(0, 9 - 5) // 2
    np.testing.assert_allclose(tilec.evaluate(NAMED_SIZE, I=i)["O"], i[q:9 - q], rtol=1e-6)


@needs_device
def test_named_sizes_compiled():
    rng = _rng()
    i = rng.uniform(-1, 1, 9).astype(np.float32)
    np.testing.assert_allclose(_compiled(NAMED_SIZE, I=i)["O"], i[2:7], rtol=1e-6)


SAME_POOL = """function (I[N, L0, C]) -> (O) {
  O[n, x0, c : N, (L0 + 2 - 1) / 2, C] = >(I[n, 2*x0 + k0 - (max(0, ((L0 + 2 - 1) / 2 - 1) * 2 + 3 - L0)) / 2, c]), k0 < 3;
}"""  # noqa: E501 - as PlaidML writes SAME padding


@pytest.mark.parametrize("length", [7, 8])
def test_same_padding_with_max_in_an_index(length):
    rng = _rng()
    i = rng.uniform(-1, 1, (2, length, 3)).astype(np.float32)
    out_len = (length + 1) // 2
    pad = max(0, (out_len - 1) * 2 + 3 - length) // 2
    padded = np.full((2, length + 6, 3), -np.inf, np.float32)
    padded[:, pad:pad + length] = i
    want = np.stack([padded[:, 2 * x:2 * x + 3].max(axis=1) for x in range(out_len)], axis=1)
    np.testing.assert_allclose(tilec.evaluate(SAME_POOL, I=i)["O"], want, rtol=1e-6)


@needs_device
def test_same_padding_compiled():
    rng = _rng()
    i = rng.uniform(-1, 1, (2, 8, 3)).astype(np.float32)
    ref = tilec.evaluate(SAME_POOL, I=i)["O"]
    np.testing.assert_allclose(_compiled(SAME_POOL, I=i)["O"], ref, rtol=1e-6)


def test_min_in_an_output_size_and_a_constraint():
    src = "function (I[N]) -> (O) { O[x : min(N, 4)] = +(I[x + k]), k < min(2, N); }"
    i = _rng().uniform(-1, 1, 6).astype(np.float32)
    np.testing.assert_allclose(tilec.evaluate(src, I=i)["O"], i[0:4] + i[1:5], rtol=1e-6)


@pytest.mark.parametrize("src, message", [
    ("function (I[N]) -> (O) { O[x : max(N)] = =(I[x]); }", r"1:32: max takes 2 arguments"),
    ("function (I[N]) -> (O) { O[x : N] = =(I[max(x, 1)]); }", r"1:41: an index polynomial"),
    ("function (I[N]) -> (O) { P = 1; P = 2; O[x : N] = =(I[x]); }", r"'P' is a size symbol"),
])
def test_size_expression_errors_are_located(src, message):
    with pytest.raises(tilec.TileError, match=message):
        tilec.check_program(src, {"I": (5,)})


TRIG = ("function (A) -> (O) { O = sin(A) + cos(A) * tan(A) + asin(A / 2) + acos(A / 2) "
        "+ atan(A) + sinh(A) + cosh(A) + round(A * 3); }")


def _trig(a):
    r = a * 3
    rounded = np.sign(r) * np.floor(np.abs(r) + 0.5)  # halves away from zero
    return (np.sin(a) + np.cos(a) * np.tan(a) + np.arcsin(a / 2) + np.arccos(a / 2)
            + np.arctan(a) + np.sinh(a) + np.cosh(a) + rounded)


def _trig_input():
    a = _rng().uniform(-1, 1, (4, 6)).astype(np.float32)
    a[0, 0], a[0, 1] = 0.5 / 3, -1.5 / 3  # halves after * 3
    return a


def test_trigonometric_and_round_builtins():
    a = _trig_input()
    np.testing.assert_allclose(tilec.evaluate(TRIG, A=a)["O"], _trig(a.astype(np.float64)),
                               rtol=1e-5, atol=1e-5)


@needs_device
def test_trigonometric_and_round_compiled():
    a = _trig_input()
    np.testing.assert_allclose(_compiled(TRIG, A=a)["O"], _trig(a.astype(np.float64)),
                               rtol=1e-4, atol=1e-4)
