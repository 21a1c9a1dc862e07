"""Chains of copies composed into one (`plan.copies`): which pairs compose, and every
composed program against the numpy reference of the original on random inputs, outputs
poisoned (reshape / transpose chains, slices, pads, strided reads, broadcasts)."""

from __future__ import annotations

import numpy as np
import pytest

import tilec
from tilec.config import Config
from tilec.lang.api import check_program
from tilec.plan.copies import compose_copies

from ..device import needs_device

HEADS = """function (X[B, T, C]) -> (O) {
  S[b, t, h, d : B, T, 4, 8] = =(X[b, t, 8*h + d]);
  P[b, h, t, d : B, 4, T, 8] = =(S[b, t, h, d]);
  Q[b, t, h, d : B, T, 4, 8] = =(P[b, h, t, d]);
  O[b, t, 8*h + d : B, T, 32] = =(Q[b, t, h, d]);
}"""
SLICE = """function (X[N, M]) -> (O) {
  T[i, j : 5, M] = =(X[i + 2, j]);
  O[j, i : M, 5] = =(T[i, j]);
}"""
PAD = """function (X[N]) -> (O) {
  T[i + 2 : N + 4] = =(X[i]);
  O[i : N + 4] = =(T[i]);
}"""
STRIDED = """function (X[N, M]) -> (O) {
  T[j, i : M, N] = =(X[i, j]);
  O[k, i : 3, N] = =(T[2*k + 1, i]);
}"""
BROADCAST = """function (X[N]) -> (O) {
  T[i : N] = =(X[i]);
  O[i, j : N, 3] = =(T[i]);
}"""
# A pooled NHWC tail read back as NCHW, then flattened: size-1 axes written and read at 0.
TAIL = """function (X[N, H, W, C]) -> (O) {
  T[0, c, 0, 0 : 1, C, 1, 1] = =(X[0, 0, 0, c]);
  O[0, c : 1, C] = =(T[0, c, 0, 0]);
}"""
# T holds X at row 0 only; O copies every row of T (zeros past row 0).
ROW = """function (X[N]) -> (O) {
  T[0, i : 3, N] = =(X[i]);
  O[r, i : 3, N] = =(T[r, i]);
}"""
# torch's attention split of a fused projection: one copy read by three slices (q, k, v),
# each then split into heads; every slice composes with it and reads X itself.
SPLIT = """function (X[T, C3]) -> (Q, K, V) {
  S[j, t, c : 3, T, 8] = =(X[t, 8*j + c]);
  Q[h, t, d : 2, T, 4] = =(S[0, t, 4*h + d]);
  K[h, d, t : 2, 4, T] = =(S[1, t, 4*h + d]);
  V[h, t, d : 2, T, 4] = =(S[2, t, 4*h + d]);
}"""
CASES = {"heads": (HEADS, {"X": (2, 5, 32)}), "row": (ROW, {"X": (4,)}),
         "slice": (SLICE, {"X": (9, 4)}),
         "pad": (PAD, {"X": (6,)}), "strided": (STRIDED, {"X": (5, 7)}),
         "broadcast": (BROADCAST, {"X": (6,)}), "tail": (TAIL, {"X": (1, 1, 1, 12)})}


@pytest.mark.parametrize("name", sorted(CASES))
def test_composed_to_one_statement(name):
    src, shapes = CASES[name]
    p = check_program(src, shapes, "float32")
    q = compose_copies(p)
    assert len(q.ops) == 1 and q.ops[0].output == "O"
    assert set(q.tensors) == {"X", "O"}


def test_left_alone_when_read_by_another_statement_or_returned():
    src = """function (X[N]) -> (O, P) {
  T[i : N] = =(X[i]);
  O[i : N] = =(T[i]);
  P = T * 2;
}"""
    p = check_program(src, {"X": (4,)}, "float32")
    assert compose_copies(p) is p
    src = """function (X[N]) -> (T, O) {
  T[i : N] = =(X[i]);
  O[i : N] = =(T[i]);
}"""
    p = check_program(src, {"X": (4,)}, "float32")
    assert compose_copies(p) is p


def test_a_constant_axis_composes_only_where_read_at_the_same_constant():
    # Read back at another constant than written: nothing there but zeros.
    src = """function (X[N]) -> (O) {
  T[0, i : 3, N] = =(X[i]);
  O[i : N] = =(T[1, i]);
}"""
    p = check_program(src, {"X": (4,)}, "float32")
    assert compose_copies(p) is p


def test_a_copy_read_by_several_copies_composes_into_each():
    p = check_program(SPLIT, {"X": (6, 24)}, "float32")
    q = compose_copies(p)
    assert [op.output for op in q.ops] == ["Q", "K", "V"]
    assert all(op.inputs[0].tensor == "X" for op in q.ops) and "S" not in q.tensors
    # One of the readers not a copy: the copy stays for all of them.
    mixed = SPLIT.replace("V[h, t, d : 2, T, 4] = =(S[2, t, 4*h + d]);", "V = S * 2;")
    p = check_program(mixed, {"X": (6, 24)}, "float32")
    assert compose_copies(p) is p


# torch's batch-first attention at batch 1: the input read sequence-first, then projected.
BATCH_FIRST = """function (X[B, T, C], W[C, N]) -> (O) {
  S[t, b, c : T, B, C] = =(X[b, t, c]);
  O[t, b, n : T, B, N] = +(S[t, b, c] * W[c, n]);
}"""


def test_a_copy_that_only_moves_unit_axes_is_read_through_by_contractions():
    p = check_program(BATCH_FIRST, {"X": (1, 6, 8), "W": (8, 5)}, "float32")
    q = compose_copies(p)
    assert [op.output for op in q.ops] == ["O"] and "S" not in q.tensors
    assert q.ops[0].inputs[0].tensor == "X"
    # A batch of 2 moves a real axis (another memory order): the copy stays.
    p = check_program(BATCH_FIRST, {"X": (2, 6, 8), "W": (8, 5)}, "float32")
    assert compose_copies(p) is p
    # An elementwise reader needs the copy's shape.
    src = BATCH_FIRST.replace("-> (O)", "-> (O, E)").replace("}", "  E = S * 2;\n}")
    p = check_program(src, {"X": (1, 6, 8), "W": (8, 5)}, "float32")
    assert [op.output for op in compose_copies(p).ops] == ["S", "O", "E"]


# Attention's value product, its heads then put side by side ([B, H, T, D] -> [B, T, H*D]).
HEADS_OUT = """function (P[B, H, T, S], V[B, H, S, D]) -> (O) {
  A[b, h, t, d : B, H, T, D] = +(P[b, h, t, s] * V[b, h, s, d]);
  O[b, t, 4*h + d : B, T, 8] = =(A[b, h, t, d]);
}"""


def test_a_product_writes_where_the_copy_reading_it_puts_its_output():
    shapes = {"P": (1, 2, 3, 5), "V": (1, 2, 5, 4)}
    p = check_program(HEADS_OUT, shapes, "float32")
    assert compose_copies(p) is p  # only where asked (no attention kernel to match)
    q = compose_copies(p, into_products=True)
    assert [op.output for op in q.ops] == ["O"] and "A" not in q.tensors
    assert q.ops[0].agg == "+" and not q.ops[0].constraints  # the operands bound every index
    # A copy that moves the product's fastest index (d) elsewhere: the product keeps its output.
    moved = HEADS_OUT.replace("O[b, t, 4*h + d : B, T, 8]", "O[b, d, 3*h + t : B, D, 6]")
    p = check_program(moved, shapes, "float32")
    assert compose_copies(p, into_products=True) is p


@needs_device
@pytest.mark.parametrize("src,shapes", [
    (HEADS_OUT, {"P": (1, 2, 3, 5), "V": (1, 2, 5, 4)}),  # the product writes through its copy
    (BATCH_FIRST, {"X": (1, 6, 8), "W": (8, 5)}),  # the product reads through a unit-axis move
])
def test_a_product_composed_with_its_copy_gives_the_reference_results(src, shapes):
    rng = np.random.default_rng(14)
    arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    exe = tilec.compile(src, shapes, config=Config(attention_fusion=False))
    assert len(exe.kernels) == 1
    got = exe.run(arrays, poison=True)
    np.testing.assert_allclose(got["O"], tilec.evaluate(src, **arrays)["O"], rtol=1e-5,
                               atol=1e-5)


@needs_device
def test_a_split_read_in_place_gives_the_reference_results():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((6, 24)).astype(np.float32)
    exe = tilec.compile(SPLIT, {"X": (6, 24)})
    got = exe.run({"X": x}, poison=True)
    want = tilec.evaluate(SPLIT, X=x)
    for name in ("Q", "K", "V"):
        np.testing.assert_array_equal(got[name], want[name])


@needs_device
@pytest.mark.parametrize("name", sorted(CASES))
def test_same_results_as_the_reference(name):
    src, shapes = CASES[name]
    rng = np.random.default_rng(11)
    arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    exe = tilec.compile(src, shapes)
    # One copy kernel (the pad's output also has an initialising kernel: not every element
    # of O is written).
    assert [s.kind for s in exe.sources if s.kind != "init"] == ["contraction"]
    got = exe.run(arrays, poison=True)
    want = tilec.evaluate(src, **arrays)
    np.testing.assert_array_equal(got["O"], want["O"])
