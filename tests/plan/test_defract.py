"""reduce and defract: the rewritten contraction enumerates exactly the original's points, one
thread per output element; the rewrites of the programs users write; the errors; `explain`.
No device: the kernel runs of these programs are in test_kernels.py (kernel_cases.py)."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilec.errors import TileCheckError
from tilec.lang import ir
from tilec.lang.api import check_program
from tilec.lang.reference import evaluate_program
from tilec.plan.defract import rewrite, rewritten
from tilec.plan.flat import FlatContraction
from tilec.plan.flatten import flatten
from tilec.plan.fuse import plan_kernels
from tilec.plan.reduce import describe_steps, fmt, render

from ..kernel_cases import CASES, TRANSPOSED_CASES, conv_transpose_nhwc

P = ir.Poly


def contraction_of(src: str, shapes: dict) -> tuple[ir.Program, ir.Contraction]:
    prog = check_program(src, shapes)
    return prog, next(op for op in prog.ops if isinstance(op, ir.Contraction))


def subst_text(step) -> dict[str, str]:  # noqa: ANN001
    return {v: fmt(q) for v, q in step.subst}


# The programs users write ------------------------------------------------------------------------

def test_integral_single_variable_programs_are_untouched() -> None:
    for name, (src, shapes) in CASES.items():
        if name in TRANSPOSED_CASES:
            continue
        prog = check_program(src, shapes)
        for op in prog.ops:
            if isinstance(op, ir.Contraction):
                assert rewrite(op, prog.tensors) == (), name
                assert rewritten(op, prog.tensors) is op


def test_transposed_conv_1d_splits_output_and_taps() -> None:
    prog, op = contraction_of(
        "function (I[X], K[KX]) -> (O) { O[x : 2 * X] = +(I[(x + 1 - k) / 2] * K[k]); }",
        {"I": (5,), "K": (4,)})
    (step,) = rewrite(op, prog.tensors)
    assert step.name == "defract"
    # x_1 (the output's parity) picks the taps; k = 2*k_0 + 1 - x_1 sweeps 2 taps per output.
    assert subst_text(step) == {"x": "2*x_0 + x_1", "k": "2*k_0 - x_1 + 1"}
    assert step.added == (ir.Constraint(P.index("x_1"), 2),)
    new = step.op
    assert new.text == op.text and new.span == op.span and new.indices == ("k_0", "x_0", "x_1")
    assert render(new, prog.tensors) == \
        "O[2*x_0 + x_1 : 10] = +(I[-k_0 + x_0 + x_1] * K[2*k_0 - x_1 + 1]), x_1 < 2"
    flat = flatten(new, prog.tensors)
    assert dict(zip(flat.names, flat.ranges, strict=True)) == {"k_0": 2, "x_0": 5, "x_1": 2}
    plan = plan_kernels(prog)
    assert plan.kernels[0].op == new and plan.kernels[0].out_map == "bijective"


def test_transposed_conv_2d_stride_3_nhwc() -> None:
    prog, op = contraction_of(conv_transpose_nhwc((3, 3), (1, 0, 2, 1), (2, 1)),
                              {"I": (1, 4, 3, 2), "K": (4, 3, 2, 3)})
    assert prog.tensors["O"].shape == (1, 9 + 3 + 1 - 1 - 2 + 2, 6 + 2 + 1 - 0 - 1 + 1, 3)
    (step,) = rewrite(op, prog.tensors)
    subst = subst_text(step)
    assert subst["x0"] == "3*x0_0 + x0_1" and subst["x1"] == "3*x1_0 + x1_1"
    assert set(subst) == {"x0", "x1", "k0", "k1"}  # n, co, ci are not split
    flat = flatten(step.op, prog.tensors)
    ranges = {v: r for v, _, r in flat.index_bounds}
    assert ranges["x0_1"] == ranges["x1_1"] == 3
    assert ranges["k0_0"] == 2 and ranges["k1_0"] == 1  # ceil(4 / 3), ceil(3 / 3) taps


def test_dense_transposed_conv_takes_its_post_ops() -> None:
    src, shapes = TRANSPOSED_CASES["convt2d_s2_bias_relu_fused"]
    (k,) = plan_kernels(check_program(src, shapes)).kernels
    assert k.out_map == "bijective" and [p.output for p in k.post_ops] == ["R"]
    assert k.writes == ("R",) and "x_1" in k.op.indices


def test_repeat_is_written_apart() -> None:
    # Each (n, k) writes its own element (3*n + k, k < 3: mixed radix): no change of basis,
    # the flat output strides (3, 1) address it directly.
    src = "function (I[N]) -> (O) { O[3 * n + k : 3 * N] = =(I[n]), k < 3; }"
    prog, op = contraction_of(src, {"I": (7,)})
    assert rewrite(op, prog.tensors) == ()
    flat = flatten(op, prog.tensors)
    assert dict(zip(flat.names, flat.ranges, strict=True)) == {"k": 3, "n": 7}
    assert plan_kernels(prog).kernels[0].out_map == "bijective"


@pytest.mark.parametrize("src", [
    # k spans 4 points where 3 apart: 3*n + k overlaps, the sum needs the lattice
    "function (I[N]) -> (O) { O[3 * n + k : 3 * N + 1] = +(I[n]), k < 4; }",
    # the last points fall past the output (3*6 + 2 = 20 > 19)
    "function (I[N]) -> (O) { O[3 * n + k : 20] = =(I[n]), k < 3; }",
    # one variable in two output dimensions
    "function (I[N]) -> (O) { O[n + k, n : 9, 7] = =(I[n]), k < 2; }",
    # a / 2 < 1 lets a be 1 (a floor division), where an interval bound would say a = 0
    "function (I[N]) -> (O) { O[a + b : 3] = +(I[a]), b < 2, a / 2 < 1; }",
])
def test_outputs_not_written_apart_are_reduced(src: str) -> None:
    prog, op = contraction_of(src, {"I": (7,)})
    assert rewrite(op, prog.tensors)[0].name == "reduce"


def test_flattening_reshape_is_one_copy() -> None:
    # A reshape of 7 dimensions into one (as ONNX's NLLLoss expansion writes it) is one index
    # as flattened, not a lattice search for each element.
    dims = (3, 5, 6, 6, 5, 3, 4)
    iv = [f"i{k}" for k in range(len(dims))]
    poly = " + ".join(f"{math.prod(dims[k + 1:])}*{v}" for k, v in enumerate(iv))
    src = (f"function (X[{', '.join(f'D{k}' for k in range(7))}]) -> (R) {{ "
           f"R[{poly} : {math.prod(dims)}] = =(X[{', '.join(iv)}]); }}")
    prog, op = contraction_of(src, {"X": dims})
    assert rewrite(op, prog.tensors) == ()
    (k,) = plan_kernels(prog).kernels
    assert k.out_map == "bijective" and k.flat.ranges == (math.prod(dims),)


def test_scatter_form_completes_with_the_short_index() -> None:
    prog, op = contraction_of(
        "function (I[X], K[KX]) -> (O) { O[2 * x + k : 2 * X + 1] = +(I[x] * K[k]); }",
        {"I": (9,), "K": (3,)})
    red, dfr = rewrite(op, prog.tensors)
    assert subst_text(red) == {"x": "(-k + o0)/2"}  # not k = o0 - 2*x, a loop over all of I
    flat = flatten(dfr.op, prog.tensors)
    assert dict(zip(flat.names, flat.ranges, strict=True)) == {"k_0": 2, "o0_0": 10, "o0_1": 2}
    assert plan_kernels(prog).kernels[0].out_map == "injective"  # 20 points for 19 elements


def test_reversed_output_gets_a_positive_stride() -> None:
    prog, op = contraction_of("function (A[N]) -> (O) { O[N - 1 - i : N] = =(A[i]); }",
                              {"A": (7,)})
    (red,) = rewrite(op, prog.tensors)
    assert red.notes == ("o0 = -i",) and render(red.op, prog.tensors) == "O[o0 + 6 : 7] = =(A[-o0])"
    assert plan_kernels(prog).kernels[0].out_map == "bijective"


def test_subpixel_shuffle_is_written_apart() -> None:
    src, shapes = TRANSPOSED_CASES["subpixel_conv"]
    prog = check_program(src, shapes)
    assert rewrite(prog.ops[1], prog.tensors) == ()
    assert plan_kernels(prog).kernels[-1].out_map == "bijective"


def test_overlapping_scatter_reduces_both_spatial_dimensions() -> None:
    prog, op = contraction_of(
        "function (I[X, Y]) -> (O) { O[2*x + a, 2*y + b : 2*X + 1, 2*Y + 1] = +(I[x, y]), "
        "a < 3, b < 3; }", {"I": (4, 5)})
    red, dfr = rewrite(op, prog.tensors)
    assert red.notes == ("o0 = a + 2*x", "o1 = b + 2*y")
    assert subst_text(dfr)["o0"] == "2*o0_0 + o0_1" and "x" not in dfr.op.indices


def test_modulo_chains_plaidml_rejects_are_accepted() -> None:
    # PlaidML's defract needs a variable's moduli to divide each other (2 and 3 do not: "Unable
    # to remove modulo operations"); splitting x by its whole period 6 needs no such chain.
    src = ("function (A[M], B[N]) -> (O) {\n"
           "  O[x : 12] = +(A[(x - i) / 2] * B[(x - j) / 3]), i < 2, j < 3; }")
    prog, op = contraction_of(src, {"A": (6,), "B": (4,)})
    (step,) = rewrite(op, prog.tensors)
    assert subst_text(step)["x"] == "6*x_0 + x_1"
    assert ir.Constraint(P.index("x_1"), 6) in step.added


@pytest.mark.parametrize("name", sorted(TRANSPOSED_CASES))
def test_rewritten_programs_compute_the_same(name: str) -> None:
    """The reference on the rewritten program (generic enumeration) equals the original's."""
    src, shapes = TRANSPOSED_CASES[name]
    prog = check_program(src, shapes)
    ops = tuple(rewritten(op, prog.tensors) if isinstance(op, ir.Contraction) else op
                for op in prog.ops)
    # Written apart (`writes_apart`): each point has its own output element, no rewrite.
    assert (ops == prog.ops) == (name in (
        "repeat", "repeat_no_defract", "subpixel_conv", "upsample2d_nearest"))
    rng = np.random.default_rng(3)
    arrays = {n: rng.uniform(-1, 1, prog.tensors[n].shape).astype(np.float32)
              for n in prog.inputs}
    want = evaluate_program(prog, arrays, path="generic")
    got = evaluate_program(replace(prog, ops=ops), arrays, path="generic")
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


# Errors ------------------------------------------------------------------------------------------

def test_non_integral_offset_is_an_error_at_the_statement() -> None:
    prog, op = contraction_of("function (I[X]) -> (O) {\n  O[x : 4] = +(I[2 * x + 1 / 2]);\n}",
                              {"I": (9,)})
    with pytest.raises(TileCheckError, match=r"2\*x \+ 1/2 is never an integer \(a non-integral"
                       r" offset\)") as err:
        plan_kernels(prog)
    assert err.value.line == 2 and "O[x : 4] = +(I[2 * x + 1 / 2])" in str(err.value)


def test_conflicting_offsets_are_an_error() -> None:
    prog, op = contraction_of(
        "function (A[X], B[X]) -> (O) { O[x : 4] = +(A[x / 2] * B[(x + 1) / 2]); }",
        {"A": (4,), "B": (4,)})
    with pytest.raises(TileCheckError, match="fractional offsets conflict"):
        rewrite(op, prog.tensors)


def test_no_defract_keeps_fractions_and_overlaps_as_errors() -> None:
    prog, op = contraction_of(
        "function (I[X]) -> (O) { O[x : 8] = +(I[x / 2]) no_defract; }", {"I": (4,)})
    with pytest.raises(TileCheckError, match="x/2 of I has fractional coefficients, and "
                                             "`no_defract` turns off"):
        plan_kernels(prog)
    prog, op = contraction_of(
        "function (I[X], K[KX]) -> (O) { O[x + k : 8] = +(I[x] * K[k]) no_defract; }",
        {"I": (6,), "K": (3,)})
    with pytest.raises(TileCheckError, match="write the same element of O: `no_defract`"):
        plan_kernels(prog)


def test_unbounded_index_is_reported_before_rewriting() -> None:
    prog = check_program("function (I[X]) -> (O) {\n  O[x + k - j : 8] = +(I[x]), k < 3;\n}",
                         {"I": (6,)})
    loose = replace(prog.ops[0], constraints=())  # check.py would have caught this one
    with pytest.raises(TileCheckError, match="index 'j' is unbounded: no access or "
                                             "constraint limits it in `O") as err:
        rewrite(loose, prog.tensors, source=prog.source)
    assert err.value.line == 2


# explain -----------------------------------------------------------------------------------------

def test_explain_shows_the_table_before_and_after_each_rewrite() -> None:
    from tilec.cli.explain import explain

    src = "function (I[X], K[KX]) -> (O) { O[2 * x + k : 2 * X + 1] = +(I[x] * K[k]); }"
    text = explain(src, {"I": (9,), "K": (3,)}, "float32", "pocl-cpu", None, {}, 1, None)
    block = text[text.index("Rewrites before flattening:"):text.index("Range")]
    assert "as written:" in block and "after reduce" in block and "after defract" in block
    assert "o0 = k + 2*x" in block and "x = (-k + o0)/2" in block
    assert "o0 = 2*o0_0 + o0_1" in block and "0 <= o0_1 < 2" in block
    assert "as Tile: O[2*o0_0 + o0_1 : 19] = +(I[-k_0 + o0_0] * K[2*k_0 + o0_1]), " \
           "o0_1 < 2" in block
    plain = explain(CASES["matmul_odd"][0], CASES["matmul_odd"][1], "float32", "pocl-cpu",
                    None, {}, 1, None)
    assert "Rewrites" not in plain


def test_explain_says_why_an_output_written_apart_needs_no_rewrite() -> None:
    from tilec.cli.explain import explain

    src, shapes = TRANSPOSED_CASES["repeat"]
    text = explain(src, shapes, "float32", "pocl-cpu", None, {}, 1, None)
    assert "Rewrites before flattening: none; each index point writes an output element " \
        "of its own" in text


def test_describe_steps_without_rewrites_is_the_table() -> None:
    prog, op = contraction_of(*CASES["matmul_odd"])
    text = describe_steps(op, (), prog.tensors)
    assert text.splitlines()[0] == "as written:" and "C | m" in text


# The proof: same points, one thread per element --------------------------------------------------

NAMES = ("i", "j", "k")
LO, HI = -3, 6  # every generated variable is confined to [LO, HI] by its own constraint


@st.composite
def random_contraction(draw):  # noqa: ANN201 - hypothesis composite
    names = NAMES[:draw(st.integers(1, 3))]
    box = {}
    cons = []
    for n in names:  # n + c < b keeps n in [-c, b - 1 - c], inside [LO, HI]
        c, b = draw(st.sampled_from([0, 0, 0, 1, 3])), draw(st.integers(1, 6))
        box[n] = (-c, b - 1 - c)
        cons.append((P.make({n: 1}, c), b))

    def poly(frac: bool, most: int) -> tuple[ir.Poly, int]:
        """A polynomial that mostly lands inside its dimension, and that dimension's size."""
        used = draw(st.lists(st.sampled_from(names), min_size=1, max_size=most, unique=True))
        coeffs = {n: draw(st.sampled_from([1, 1, 1, 2, 3, -1, -2])) for n in used}
        lo = sum(min(c * box[n][0], c * box[n][1]) for n, c in coeffs.items())
        hi = sum(max(c * box[n][0], c * box[n][1]) for n, c in coeffs.items())
        den = draw(st.sampled_from([1, 2, 2, 3])) if frac else 1
        const = -lo + draw(st.integers(-1, den))
        size = (hi - lo) // den + draw(st.integers(0, 2))
        return P.make(coeffs, const).scale(Fraction(1, den)), max(size, 1)

    def access(frac: bool, rank: tuple[int, int], most: int):  # noqa: ANN202
        dims = [poly(frac and draw(st.booleans()), most) for _ in range(draw(st.integers(*rank)))]
        return tuple(p for p, _ in dims), tuple(n for _, n in dims)

    out = access(draw(st.integers(0, 3)) == 0, (1, 2), 3)
    accs = [access(True, (0, 2), 2) for _ in range(draw(st.integers(1, 2)))]
    if draw(st.integers(0, 3)) == 0:
        p, size = poly(draw(st.booleans()), 3)
        cons.append((p, size))
    op = ir.Contraction(
        output="O", out_idx=out[0], agg="+", comb="*" if len(accs) > 1 else None,
        inputs=tuple(ir.Access(n, a[0]) for n, a in zip("AB", accs, strict=False)),
        constraints=tuple(ir.Constraint(p, b) for p, b in cons), indices=names, text="T")
    ts = {"O": ir.Tensor("O", out[1])}
    ts.update({n: ir.Tensor(n, a[1]) for n, a in zip("AB", accs, strict=False)})
    return op, ts


def brute_force(op: ir.Contraction, ts: dict[str, ir.Tensor]) -> Counter:
    """(output element, input elements) of every point, by Tile's rules: an access reads only
    where its polynomial is an integer inside the tensor; `p < b` means 0 <= p < b."""
    axes = [np.arange(LO, HI + 1)] * len(op.indices)
    grid = np.meshgrid(*axes, indexing="ij")
    env = {n: g.ravel() for n, g in zip(op.indices, grid, strict=True)}
    count = (HI - LO + 1) ** len(op.indices)
    ok = np.ones(count, dtype=bool)

    def scaled(p: ir.Poly) -> tuple[np.ndarray, int]:
        den = int(np.lcm.reduce([c.denominator for _, c in p.terms] + [p.const.denominator]))
        val = np.full(count, int(p.const * den), dtype=np.int64)
        for v, c in p.terms:
            val = val + int(c * den) * env[v]
        return val, den

    def address(idx: tuple[ir.Poly, ...], shape: tuple[int, ...]) -> np.ndarray:
        nonlocal ok
        addr = np.zeros(count, dtype=np.int64)
        for p, size, stride in zip(idx, shape, ir.Tensor("", shape).strides, strict=True):
            val, den = scaled(p)
            ok &= (val % den == 0) & (val >= 0) & (val < den * size)
            addr += (val // den) * stride
        return addr

    cols = [address(op.out_idx, ts["O"].shape)]
    cols += [address(a.idx, ts[a.tensor].shape) for a in op.inputs]
    for c in op.constraints:
        val, den = scaled(c.poly)
        ok &= (val >= 0) & (val < den * c.bound)
    return Counter(map(tuple, np.stack(cols, axis=1)[ok].tolist()))


def flat_points(flat: FlatContraction) -> Counter:
    points: Counter = Counter()
    for k in itertools.product(*(range(r) for r in flat.ranges)):
        if all(c.holds(k) for c in flat.constraints):
            points[tuple(t.offset + sum(s * x for s, x in zip(t.strides, k, strict=True))
                         for t in flat.tensors)] += 1
    return points


def threads_are_distinct(flat: FlatContraction) -> bool:
    """Every output point the kernel stores from (its box, cut by the constraints on output
    indices alone) writes a different element."""
    outs = flat.out_indices
    own = [c for c in flat.constraints if all(c.coeffs[k] == 0 for k in flat.reduce_indices)]
    seen: set[int] = set()
    for vals in itertools.product(*(range(flat.ranges[k]) for k in outs)):
        point = [0] * len(flat.ranges)
        for k, v in zip(outs, vals, strict=True):
            point[k] = v
        if all(c.holds(tuple(point)) for c in own):
            addr = flat.output.offset + sum(flat.output.strides[k] * v
                                            for k, v in zip(outs, vals, strict=True))
            if addr in seen:
                return False
            seen.add(addr)
    return True


@settings(max_examples=400, deadline=None)
@given(random_contraction())
def test_rewrite_enumerates_the_original_points(case) -> None:  # noqa: ANN001
    op, ts = case
    expected = brute_force(op, ts)
    try:
        new = rewritten(op, ts)
        flat = flatten(new, ts)
    except TileCheckError as e:
        assert any(m in e.message for m in (
            "never an integer", "conflict", "empty range", "no index point", "outside")), \
            e.message
        assert not expected
        return
    assert all(p.const.denominator == 1 and all(c.denominator == 1 for _, c in p.terms)
               for p in [*new.out_idx, *(q for a in new.inputs for q in a.idx)])
    assert flat_points(flat) == expected
    assert threads_are_distinct(flat)
