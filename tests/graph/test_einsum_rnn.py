"""The einsum graph op (`tilec.graph.ops_einsum`) against numpy.einsum on random inputs, run
with the outputs poisoned: transposes, diagonals, sums, batched and broadcast products, outer
products, 1 to 4 operands; a two-operand einsum is one contraction kernel; its errors."""

from __future__ import annotations

import numpy as np
import pytest

from tilec.errors import TileError
from tilec.graph import Graph
from tilec.graph import ops_einsum as E

from ..device import needs_device
from ..graph_refs import close, run

device = needs_device
RNG = np.random.default_rng(47)


def rand(*shape):
    """Random values away from zero, either sign."""
    v = RNG.uniform(0.25, 2.0, shape) * RNG.choice([-1, 1], shape)
    return np.asarray(v, np.float32)


def kinds(exe):
    return [k.kind for k in exe.kernels]


EINSUMS = [
    ("ij,jk->ik", [(37, 53), (53, 29)]),
    ("ij,kj->ik", [(13, 9), (7, 9)]),          # a transposed operand
    ("ji,jk", [(5, 7), (5, 3)]),               # implicit output: ik
    ("bij,bjk->bik", [(3, 5, 7), (3, 7, 4)]),
    ("bij, bkj -> bki", [(2, 5, 7), (2, 3, 7)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 5), (4, 5, 6)]),  # broadcast batch dimensions
    ("ij,ij->ij", [(1, 9), (5, 9)]),           # a size-1 dimension broadcasts
    ("i,j->ij", [(7,), (11,)]),                # outer product
    ("i,i", [(13,), (13,)]),                   # inner product
    ("ij,ij", [(5, 7), (5, 7)]),               # all summed: a scalar
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 8), (2, 3, 7, 8)]),  # attention scores
    ("ij->ji", [(3, 4)]),
    ("ij->i", [(5, 9)]),
    ("ii->i", [(6, 6)]),
    ("ii", [(6, 6)]),                           # trace
    ("...ii->...i", [(3, 5, 5)]),
    ("iij->j", [(4, 4, 3)]),
    ("Ab,bC->CA", [(3, 4), (4, 5)]),           # upper-case labels
    ("ii,ij->j", [(4, 4), (4, 3)]),            # a diagonal inside a product
    ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),
    ("abc,cd,de,ea->b", [(2, 3, 4), (4, 5), (5, 6), (6, 2)]),
    ("i,j,k->ijk", [(2,), (3,), (4,)]),
    ("->", [()]),
    (",i->i", [(), (5,)]),
]


@device
@pytest.mark.parametrize("equation, shapes", EINSUMS, ids=[e for e, _ in EINSUMS])
@pytest.mark.parametrize("passes", [False, True])
def test_einsum(equation, shapes, passes):
    xs = [rand(*s) for s in shapes]
    g = Graph()
    vs = [g.input(f"x{k}", s) for k, s in enumerate(shapes)]
    g.output("y", E.einsum(equation, *vs))
    exe, outs = run(g, {f"x{k}": x for k, x in enumerate(xs)}, passes=passes)
    close(outs["y"], np.einsum(equation, *[x.astype(np.float64) for x in xs]))
    if len(shapes) == 2 and not passes:
        assert kinds(exe) == ["contraction"], exe.tile


@device
def test_einsum_integers_and_constants():
    a = RNG.integers(-5, 6, (4, 6)).astype(np.int32)
    b = RNG.integers(-5, 6, (6, 3)).astype(np.int32)
    g = Graph()
    g.output("y", E.einsum("ij,jk->ik", g.input("a", a.shape, "int32"), g.constant(b)))
    _, outs = run(g, {"a": a}, passes=True)
    np.testing.assert_array_equal(outs["y"], a @ b)


def test_einsum_tile_is_one_contraction():
    g = Graph()
    y = E.einsum("bij,bkj->bik", g.input("a", (2, 3, 4)), g.input("b", (2, 5, 4)))
    g.output("y", y)
    body = [ln for ln in g.to_tile().splitlines() if "=" in ln and not ln.strip().startswith("//")]
    assert len(body) == 1 and "+(" in body[0], g.to_tile()


def test_einsum_pair_order_keeps_intermediates_small():
    """A chain with a large outer product on one side is contracted the cheap way first."""
    g = Graph()
    a, b, c = g.input("a", (100, 2)), g.input("b", (2, 100)), g.input("c", (100, 3))
    y = E.einsum("ij,jk,kl->il", a, b, c)
    shapes = [n.shape for n in g.nodes if n.op == "einsum"]
    assert y.shape == (100, 3) and (2, 3) in shapes and (100, 100) not in shapes


def test_einsum_empty_operand_is_zeros():
    g = Graph()
    y = E.einsum("ij,jk->ik", g.input("a", (3, 0)), g.input("b", (0, 4)))
    assert g.is_constant(y.name) and not g.constants[y.name].any() and y.shape == (3, 4)


@pytest.mark.parametrize("equation, shapes, pattern", [
    ("ij,jk->ik", [(3, 4), (5, 6)], "label 'j' has size 4 and size 5"),
    ("ij,jk", [(3, 4)], "2 operand terms for 1 operands"),
    ("ijk->i", [(3, 4)], "names 3 dimensions"),
    ("ij->ik", [(3, 4)], "output label 'k' is not on any operand"),
    ("ij->ii", [(3, 3)], "repeats a label"),
    ("i1->i", [(3, 3)], "'1' is not a label"),
    ("...ij->ij", [(2, 3, 4)], "does not say where they go"),
    ("i->i->i", [(3,)], "more than one '->'"),
    ("......i->i", [(3,)], "'...' appears twice"),
])
def test_einsum_errors(equation, shapes, pattern):
    g = Graph()
    vs = [g.input(f"x{k}", s) for k, s in enumerate(shapes)]
    with pytest.raises(TileError, match=pattern):
        E.einsum(equation, *vs)


def test_einsum_type_errors():
    g = Graph()
    with pytest.raises(TileError, match="one numeric type"):
        E.einsum("i,i", g.input("a", (3,)), g.input("b", (3,), "int32"))
    with pytest.raises(TileError, match="one numeric type"):
        E.einsum("i->i", g.input("c", (3,), "bool"))
    with pytest.raises(TileError, match="no operands"):
        E.einsum("->")
