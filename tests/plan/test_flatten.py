"""flatten: the seed's golden table, the special cases, and a property test that the flat form
enumerates exactly the original contraction's points."""

from __future__ import annotations

import itertools
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilec.errors import TileCheckError
from tilec.lang import ir
from tilec.plan.flat import FlatContraction
from tilec.plan.flatten import describe, flatten, operand_strides

P = ir.Poly
ix = P.index


def poly(terms: dict[str, int | Fraction], const: int | Fraction = 0) -> ir.Poly:
    return P.make(terms, const)


def contraction(out: tuple[str, tuple[ir.Poly, ...]], *inputs: tuple[str, tuple[ir.Poly, ...]],
                constraints: tuple[tuple[ir.Poly, int], ...] = (), agg: str = "+",
                text: str = "") -> ir.Contraction:
    polys = [*out[1], *(p for _, idx in inputs for p in idx), *(p for p, _ in constraints)]
    names = tuple(sorted({v for p in polys for v in p.indices}))
    return ir.Contraction(
        output=out[0], out_idx=out[1], agg=agg, comb="*" if len(inputs) > 1 else None,
        inputs=tuple(ir.Access(n, idx) for n, idx in inputs),
        constraints=tuple(ir.Constraint(p, b) for p, b in constraints),
        indices=names, text=text)


def tensors(**shapes: tuple[int, ...]) -> dict[str, ir.Tensor]:
    return {n: ir.Tensor(n, s) for n, s in shapes.items()}


def rows(flat: FlatContraction) -> dict[str, tuple[int, tuple[int, ...]]]:
    return {n: (flat.ranges[k], tuple(t.strides[k] for t in flat.tensors))
            for k, n in enumerate(flat.names)}


SEED_TEXT = "O[n, x, y, co : N, X, Y, CO] = +(D[n, x+i-1, y+j-1, ci] * K[i, j, co, ci])"


def seed_conv() -> tuple[ir.Contraction, dict[str, ir.Tensor]]:
    op = contraction(
        ("O", (ix("n"), ix("x"), ix("y"), ix("co"))),
        ("D", (ix("n"), poly({"x": 1, "i": 1}, -1), poly({"y": 1, "j": 1}, -1), ix("ci"))),
        ("K", (ix("i"), ix("j"), ix("co"), ix("ci"))), text=SEED_TEXT)
    return op, tensors(O=(32, 224, 224, 64), D=(32, 224, 224, 64), K=(3, 3, 64, 64))


def test_seed_conv_golden() -> None:
    flat = flatten(*seed_conv())
    assert flat.names == ("ci", "co", "i", "j", "n", "x", "y")
    assert rows(flat) == {
        "ci": (64, (0, 1, 1)), "co": (64, (1, 0, 64)), "i": (3, (0, 14336, 12288)),
        "j": (3, (0, 64, 4096)), "n": (32, (3211264, 3211264, 0)),
        "x": (224, (14336, 14336, 0)), "y": (224, (64, 64, 0))}
    assert [t.offset for t in flat.tensors] == [0, -14400, 0]
    assert [t.name for t in flat.tensors] == ["O", "D", "K"]
    assert flat.mins == (0,) * 7
    assert flat.fused == ()

    def half(coeffs: dict[str, int], rhs: int) -> tuple[tuple[int, ...], int]:
        return tuple(coeffs.get(n, 0) for n in flat.names), rhs

    assert [(c.coeffs, c.rhs) for c in flat.constraints] == [
        half({"i": -1, "x": -1}, -1), half({"i": 1, "x": 1}, 224),
        half({"j": -1, "y": -1}, -1), half({"j": 1, "y": 1}, 224)]
    assert flat.output_covered  # i = 1 reaches every x, j = 1 every y
    assert flat.text == SEED_TEXT and flat.agg == "+" and flat.comb == "*"
    text = describe(flat)
    assert text.startswith(flat.table())
    assert text.splitlines()[-2:] == ["0 <= i + x - 1 < 224", "0 <= j + y - 1 < 224"]


def test_matmul_keeps_nothing_and_fuses_nothing() -> None:
    op = contraction(("C", (ix("i"), ix("j"))), ("A", (ix("i"), ix("k"))),
                     ("B", (ix("k"), ix("j"))))
    flat = flatten(op, tensors(C=(5, 7), A=(5, 3), B=(3, 7)))
    assert rows(flat) == {"i": (5, (7, 3, 0)), "j": (7, (1, 0, 1)), "k": (3, (0, 1, 7))}
    assert flat.constraints == () and flat.fused == () and flat.output_covered
    assert flat.out_indices == (0, 1) and flat.reduce_indices == (2,)
    big = flatten(op, tensors(C=(5, 7), A=(5, 9000), B=(9000, 7)))
    assert big.output_covered  # a long reduction needs no witness search


def test_wide_conv_is_covered() -> None:
    op, ts = seed_conv()
    ts = tensors(O=(2, 8, 8, 512), D=(2, 8, 8, 512), K=(3, 3, 512, 512))
    assert flatten(op, ts).output_covered  # the witness search only looks at i and j


def test_copy_fuses_into_one_index() -> None:
    op = contraction(("O", (ix("i"), ix("j"), ix("k"))), ("A", (ix("i"), ix("j"), ix("k"))))
    flat = flatten(op, tensors(O=(2, 3, 4), A=(2, 3, 4)))
    assert flat.names == ("i_j_k",)
    assert rows(flat) == {"i_j_k": (24, (1, 1))}
    assert flat.fused == (("i_j_k", ("i", "j", "k")),)
    assert flat.output_covered


def test_transposed_copy_fuses_only_what_moves_together() -> None:
    op = contraction(("O", (ix("i"), ix("j"), ix("k"))), ("A", (ix("k"), ix("i"), ix("j"))))
    flat = flatten(op, tensors(O=(2, 3, 4), A=(4, 2, 3)))
    assert rows(flat) == {"i_j": (6, (4, 1)), "k": (4, (1, 6))}


def test_repeated_index_strides_by_row_plus_one() -> None:
    op = contraction(("O", (ix("i"),)), ("A", (ix("i"), ix("i"))))
    flat = flatten(op, tensors(O=(4,), A=(4, 4)))
    assert rows(flat) == {"i": (4, (1, 5))}
    op = contraction(("O", (ix("i"), ix("i"))), ("A", (ix("i"),)))
    assert not flatten(op, tensors(O=(4, 4), A=(4,))).output_covered  # only the diagonal


def test_negative_coefficient() -> None:
    op = contraction(("O", (ix("i"),)), ("A", (poly({"i": -1}, 9),)))
    flat = flatten(op, tensors(O=(10,), A=(10,)))
    assert rows(flat) == {"i": (10, (1, -1))}
    assert [t.offset for t in flat.tensors] == [0, 9]
    assert flat.output_covered


@pytest.mark.parametrize("shape", [(8,), (4, 2)])
def test_fractional_access_needs_defract(shape: tuple[int, ...]) -> None:
    # A[i/2, j] on a 4x2 tensor has an integral stride (1/2 * 2) but still reads between rows.
    idx = (poly({"i": Fraction(1, 2)}),) + ((ix("j"),) if len(shape) == 2 else ())
    op = contraction(("O", (ix("i"),)), ("A", idx), text="O[i] = +(A[i/2])")
    with pytest.raises(TileCheckError, match="defract"):
        flatten(op, tensors(O=(8,), A=shape))


def test_user_constraints_dropped_when_implied_kept_when_cutting() -> None:
    op = contraction(("O", (ix("i"), ix("j"))), ("A", (ix("i"), ix("j"))),
                     constraints=((poly({"i": 1, "j": -1}), 4), (ix("i"), 10)))
    flat = flatten(op, tensors(O=(4, 4), A=(4, 4)))
    # i - j < 4 and i < 10 hold on the whole box; only j <= i cuts it.
    assert [(c.coeffs, c.rhs) for c in flat.constraints] == [((-1, 1), 0)]
    assert flat.fused == ()  # constrained indices never fuse
    assert not flat.output_covered
    assert describe(flat).splitlines()[-2:] == [
        "-i + j <= 0", "output not provably covered: it is initialised before the contraction"]


def test_parallel_constraints_merge_to_the_tightest() -> None:
    op = contraction(("O", (ix("i"), ix("j"))), ("A", (ix("i"), ix("j"))),
                     constraints=((poly({"i": 1, "j": 1}), 5), (poly({"i": 2, "j": 2}), 8)))
    flat = flatten(op, tensors(O=(4, 4), A=(4, 4)))
    # 2i + 2j < 8 is i + j <= 3 at integer points, tighter than i + j <= 4.
    assert [(c.coeffs, c.rhs) for c in flat.constraints] == [((1, 1), 3)]


def test_single_valued_indices_fold_into_offsets() -> None:
    op = contraction(("O", (ix("j"),)), ("A", (ix("i"), ix("j"))),
                     constraints=((poly({"i": 1}, -2), 1),))
    flat = flatten(op, tensors(O=(4,), A=(3, 4)))
    assert rows(flat) == {"j": (4, (1, 1))}
    assert [t.offset for t in flat.tensors] == [0, 8]
    assert ("i", 2, 1) in flat.index_bounds
    op = contraction(("O", (ix("j"),)), ("K", (P.constant(1), ix("j"))))
    flat = flatten(op, tensors(O=(4,), K=(3, 4)))
    assert rows(flat) == {"j": (4, (1, 1))} and flat.tensors[1].offset == 4


def test_constant_index_out_of_range() -> None:
    op = contraction(("O", (ix("j"),)), ("K", (P.constant(3), ix("j"))))
    with pytest.raises(TileCheckError, match="outside 0 .. 2"):
        flatten(op, tensors(O=(4,), K=(3, 4)))


def test_scalar_output() -> None:
    op = contraction(("O", ()), ("A", (ix("i"), ix("j"))), agg=">")
    flat = flatten(op, tensors(O=(), A=(3, 5)))
    assert rows(flat) == {"i": (3, (0, 5)), "j": (5, (0, 1))}  # reduction indices never fuse
    assert all(s == 0 for s in flat.output.strides) and flat.out_indices == ()
    assert flat.output_covered and flat.agg == ">"


def test_strided_conv() -> None:
    op = contraction(("O", (ix("x"),)), ("D", (poly({"x": 2, "i": 1}),)), ("K", (ix("i"),)))
    flat = flatten(op, tensors(O=(4,), D=(9,), K=(3,)))
    assert rows(flat) == {"i": (3, (0, 1, 1)), "x": (4, (1, 2, 0))}
    assert flat.constraints == ()
    op = contraction(("O", (ix("x"), ix("c"))), ("D", (poly({"x": 2, "i": 1}, -1), ix("c"))),
                     ("K", (ix("i"),)))
    flat = flatten(op, tensors(O=(4, 3), D=(8, 3), K=(3,)))
    assert rows(flat)["x"] == (4, (3, 6, 0)) and flat.tensors[1].offset == -3
    assert flat.output_covered  # i = 1 keeps 2x + i - 1 inside for every x


def test_unbounded_index_is_an_error() -> None:
    text = "O[i : 4] = +(A[i] * B[j - k])"
    op = contraction(("O", (ix("i"),)), ("A", (ix("i"),)), ("B", (poly({"j": 1, "k": -1}),)),
                     text=text)
    with pytest.raises(TileCheckError, match="index 'j' is unbounded") as err:
        flatten(op, tensors(O=(4,), A=(4,), B=(5,)))
    assert text in str(err.value)
    op = contraction(("O", (ix("i"),)), ("A", (ix("i"),)))
    op = ir.Contraction(**{**op.__dict__, "indices": ("i", "z")})
    with pytest.raises(TileCheckError, match="index 'z' is unbounded"):
        flatten(op, tensors(O=(4,), A=(4,)))


def test_empty_range_is_an_error() -> None:
    op = contraction(("O", (ix("i"),)), ("A", (ix("i"),)), constraints=((poly({"i": 1}, -5), 1),))
    with pytest.raises(TileCheckError, match="index 'i' has an empty range"):
        flatten(op, tensors(O=(4,), A=(4,)))
    op = contraction(("O", (ix("i"),)), ("A", (poly({"i": 2}, -1),)),
                     constraints=((poly({"i": 2}, -1), 1),))
    with pytest.raises(TileCheckError, match="empty range"):  # 2i == 1 has no integer root
        flatten(op, tensors(O=(4,), A=(4,)))


def test_operand_strides_bias_on_conv() -> None:
    op, ts = seed_conv()
    flat = flatten(op, ts)
    strides, offset = operand_strides(op.out_idx, flat, (64,), ts["O"].shape)
    assert dict(zip(flat.names, strides, strict=True)) == {
        "ci": 0, "co": 1, "i": 0, "j": 0, "n": 0, "x": 0, "y": 0}
    assert offset == 0
    same = operand_strides(op.out_idx, flat, ts["O"].shape, ts["O"].shape)
    assert same == (flat.output.strides, flat.output.offset)
    with pytest.raises(ValueError, match="broadcast"):
        operand_strides(op.out_idx, flat, (3,), ts["O"].shape)


def test_operand_strides_and_fusion() -> None:
    op = contraction(("O", (ix("i"), ix("j"))), ("A", (ix("i"), ix("j"))))
    ts = tensors(O=(3, 4), A=(3, 4))
    fused = flatten(op, ts)
    with pytest.raises(ValueError, match="fused"):
        operand_strides(op.out_idx, fused, (4,), (3, 4))
    assert operand_strides(op.out_idx, fused, (3, 4), (3, 4)) == ((1,), 0)
    apart = flatten(op, ts, broadcast_shapes=[(4,)])
    assert apart.names == ("i", "j")
    assert operand_strides(op.out_idx, apart, (4,), (3, 4)) == ((0, 1), 0)
    assert operand_strides(op.out_idx, apart, (3, 1), (3, 4)) == ((1, 0), 0)


def _parsed(text: str, shapes: dict[str, tuple[int, ...]]) -> ir.Program:
    try:
        from tilec.lang.check import check
        from tilec.lang.parse import parse
    except ImportError:  # the front end is written alongside; these tests wait for it
        pytest.skip("tilec.lang.parse / tilec.lang.check not available")
    return check(parse(text), shapes)


def test_parsed_seed_matches_the_hand_built_one() -> None:
    prog = _parsed("function (D[N, X, Y, CI], K[I, J, CO, CI]) -> (R) {\n"
                   f"  {SEED_TEXT};\n  R = (O > 0 ? O : 0);\n}}",
                   {"D": (32, 224, 224, 64), "K": (3, 3, 64, 64)})
    op = prog.ops[0]
    assert isinstance(op, ir.Contraction)
    assert flatten(op, prog.tensors) == flatten(*seed_conv())


def test_errors_point_at_the_statement() -> None:
    prog = _parsed("function (I[N]) -> (O) {\n  O[i : N] = +(I[i]), i - 5 < 1;\n}", {"I": (4,)})
    with pytest.raises(TileCheckError, match="index 'i' has an empty range") as err:
        flatten(prog.ops[0], prog.tensors, source=prog.source)
    assert err.value.line == 2 and "    ^" in str(err.value)
    with pytest.raises(TileCheckError, match=r"\(line 2, column 3\)"):
        flatten(prog.ops[0], prog.tensors)


# The proof: the flat form enumerates exactly the original points ---------------------------------

NAMES = ("i", "j", "k")
BOX = range(-8, 9)  # every generated variable is confined to |v| <= 7 by its own constraint


@st.composite
def random_contraction(draw):  # noqa: ANN201 - hypothesis composite
    names = NAMES[:draw(st.integers(1, 3))]

    def single() -> ir.Poly:  # one index, as most real accesses are
        coef = draw(st.sampled_from([1, 1, 1, -1, 2]))
        return P.make({draw(st.sampled_from(names)): coef},
                      draw(st.integers(0, 4) if coef < 0 else st.integers(-1, 1)))

    def mixed() -> ir.Poly:  # conv-like sums and differences of indices
        used = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
        coeffs = {n: draw(st.sampled_from([-2, -1, 1, 1, 2])) for n in used}
        return P.make(coeffs, draw(st.integers(-2, 2)))

    def access(kinds: list) -> tuple[tuple[ir.Poly, ...], tuple[int, ...]]:
        rank = draw(st.integers(0, 2))
        idx = tuple(draw(st.sampled_from(kinds))() for _ in range(rank))
        return idx, tuple(draw(st.integers(1, 4)) for _ in range(rank))

    def constant() -> ir.Poly:
        return P.constant(draw(st.integers(0, 1)))

    out = access([single, single, single, mixed])
    if draw(st.booleans()):  # a plain output O[i, j, ..], where fusion and coverage happen
        used = draw(st.lists(st.sampled_from(names), max_size=3, unique=True))
        out = tuple(ix(n) for n in used), tuple(draw(st.integers(1, 4)) for _ in used)
    def operand() -> tuple[tuple[ir.Poly, ...], tuple[int, ...]]:
        kind = draw(st.integers(0, 2))
        if kind == 0:
            return out
        if kind == 1:  # broadcast-like: some of the output's dims, in order
            keep = [d for d in range(len(out[0])) if draw(st.booleans())]
            return tuple(out[0][d] for d in keep), tuple(out[1][d] for d in keep)
        return access([single, single, mixed, constant])

    accs = [operand() for _ in range(draw(st.integers(1, 2)))]
    alone = {p.indices[0] for idx, _ in [out, *accs] for p in idx if len(p.indices) == 1}
    cons = []
    for n in names:  # an index alone in no access gets a bound of its own (which may cut)
        if n not in alone or draw(st.integers(0, 3)) == 0:
            coef = draw(st.sampled_from([1, -1, 2]))
            cons.append((P.make({n: coef}, draw(st.integers(-2, 2))), draw(st.integers(1, 6))))
    for _ in range(draw(st.integers(0, 2))):
        p = mixed()
        if draw(st.booleans()):
            p = p.scale(Fraction(1, draw(st.integers(2, 3))))
        cons.append((p, draw(st.integers(1, 6))))
    op = ir.Contraction(
        output="O", out_idx=out[0], agg="+", comb="*" if len(accs) > 1 else None,
        inputs=tuple(ir.Access(n, a[0]) for n, a in zip("AB", accs, strict=False)),
        constraints=tuple(ir.Constraint(p, b) for p, b in cons), indices=names)
    ts = {"O": ir.Tensor("O", out[1])}
    ts.update({n: ir.Tensor(n, a[1]) for n, a in zip("AB", accs, strict=False)})
    # A post-op operand broadcast against the output: a suffix of its shape, some dims set to 1.
    lead = draw(st.integers(0, len(out[1])))
    bshape = tuple(1 if draw(st.booleans()) else s for s in out[1][lead:])
    return op, ts, bshape


def brute_force(op: ir.Contraction, ts: dict[str, ir.Tensor],
                bshape: tuple[int, ...]) -> Counter:
    grid = np.meshgrid(*[np.array(BOX)] * len(op.indices), indexing="ij")
    env = {n: g.ravel() for n, g in zip(op.indices, grid, strict=True)}
    count = len(BOX) ** len(op.indices)
    ok = np.ones(count, dtype=bool)

    def scaled(p: ir.Poly) -> tuple[np.ndarray, int]:
        den = np.lcm.reduce([c.denominator for _, c in p.terms] + [p.const.denominator])
        val = np.full(count, int(p.const * den), dtype=np.int64)
        for v, c in p.terms:
            val = val + int(c * den) * env[v]
        return val, int(den)

    def address(idx: tuple[ir.Poly, ...], shape: tuple[int, ...]) -> np.ndarray:
        nonlocal ok
        addr = np.zeros(count, dtype=np.int64)
        for p, size, stride in zip(idx, shape, ir.Tensor("", shape).strides, strict=True):
            val, _ = scaled(p)
            ok &= (val >= 0) & (val < size)
            addr += val * stride
        return addr

    cols = [address(op.out_idx, ts["O"].shape)]
    cols += [address(a.idx, ts[a.tensor].shape) for a in op.inputs]
    for c in op.constraints:
        val, den = scaled(c.poly)
        ok &= (val >= 0) & (val < den * c.bound)
    out_shape = ts["O"].shape
    lead = len(out_shape) - len(bshape)
    b = np.zeros(count, dtype=np.int64)
    for d, (s, stride) in enumerate(zip(bshape, ir.Tensor("", bshape).strides, strict=True)):
        if s != 1:
            b += scaled(op.out_idx[lead + d])[0] * stride
    cols.append(b)
    return Counter(map(tuple, np.stack(cols, axis=1)[ok].tolist()))


def flat_points(flat: FlatContraction, bstrides: tuple[int, ...], boff: int) -> Counter:
    points: Counter = Counter()
    for k in itertools.product(*(range(r) for r in flat.ranges)):
        if all(c.holds(k) for c in flat.constraints):
            offs = [t.offset + sum(s * x for s, x in zip(t.strides, k, strict=True))
                    for t in flat.tensors]
            offs.append(boff + sum(s * x for s, x in zip(bstrides, k, strict=True)))
            points[tuple(offs)] += 1
    return points


@settings(max_examples=600, deadline=None)
@given(random_contraction())
def test_flat_form_enumerates_the_original_points(case) -> None:  # noqa: ANN001
    op, ts, bshape = case
    expected = brute_force(op, ts, bshape)
    try:
        flat = flatten(op, ts, broadcast_shapes=[bshape])
    except TileCheckError as e:
        assert "empty range" in e.message or "no index point" in e.message \
            or "outside" in e.message, e.message
        assert not expected
        return
    assert all(0 <= r for r in flat.ranges) and list(flat.names) == sorted(flat.names)
    bstrides, boff = operand_strides(op.out_idx, flat, bshape, ts["O"].shape)
    assert flat_points(flat, bstrides, boff) == expected
    if flat.output_covered:
        assert {p[0] for p in expected} == set(range(ts["O"].size))
    # Without the post-op shape, fusion may make the read non-affine, but never wrong.
    plain = flatten(op, ts)
    try:
        bstrides, boff = operand_strides(op.out_idx, plain, bshape, ts["O"].shape)
    except ValueError:
        return
    assert flat_points(plain, bstrides, boff) == expected
