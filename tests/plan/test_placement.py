"""Concatenations without copies (`tilec.plan.placement`): which chains are found, where
operands are placed, when they are copied instead, and Tile programs with concatenations
compiled and run on the CPU device (outputs poisoned) against the numpy reference."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tilec.compiler import compile as tile_compile
from tilec.config import Config
from tilec.lang.api import check_program
from tilec.lang.reference import random_array
from tilec.plan.fuse import plan_kernels
from tilec.plan.placement import Storage, find_concats, place

from ..device import needs_device


def cat(out: str, parts: list[tuple[str, int]], shape: tuple[int, ...], axis: int) -> str:
    """The Tile chain of a concatenation (as the graph's `concat` lowers it)."""
    idx = [f"i{d}" for d in range(len(shape))]
    dims = ", ".join(map(str, shape))
    lines, prev, off = [], None, 0
    for k, (name, extent) in enumerate(parts):
        target = out if k == len(parts) - 1 else f"{out}_part{k}"
        o = list(idx)
        o[axis] = f"{idx[axis]} + {off}" if off else idx[axis]
        default = f" default {prev}" if prev else ""
        lines.append(f"{target}[{', '.join(o)} : {dims}] = =({name}[{', '.join(idx)}]){default};")
        prev, off = target, off + extent
    return "\n".join(lines)


def shapes_of(text: str) -> dict[str, tuple[int, ...]]:
    """The input shapes written in the function's header (`A[6, 5]`)."""
    head = text[text.index("(") + 1:text.index(")")]
    return {m[1]: tuple(int(x) for x in m[2].split(","))
            for m in re.finditer(r"(\w+)\[([\d, ]+)\]", head)}


def program(text: str, shapes: dict, dtype: str = "float32"):
    return check_program(text, shapes or shapes_of(text), dtype, None)


def run_case(text: str, shapes: dict, *, dtype: str = "float32", seed: int = 0, **config):
    """Compile, run with poisoned outputs, compare with the reference; the executable."""
    exe = tile_compile(text, shapes or shapes_of(text), dtype=dtype, config=Config(**config))
    rng = np.random.default_rng(seed)
    arrays = {n: random_array(rng, exe.program.tensors[n].shape, exe.program.tensors[n].dtype)
              for n in exe.program.inputs}
    outs = exe.run(arrays, poison=True)
    for name, arr in outs.items():
        assert not (arr.dtype.kind == "f" and np.isnan(arr).any()), f"{name} kept poison"
    v = exe.check(exe._inputs(arrays), outs)
    assert v.ok, v.worst
    return exe


def kernels(text: str, shapes: dict, place_concats: bool = True, dtype: str = "float32"):
    return plan_kernels(program(text, shapes, dtype), place_concats=place_concats).kernels


# Two computed operands along axis 1: both written in place, the copies gone.
TWO = f"""function (A[6, 5], B[5, 7], C[6, 3]) -> (O) {{
  X[m, n : 6, 7] = +(A[m, k] * B[k, n]);
  Y = exp(C);
{cat("Cat", [("X", 7), ("Y", 3)], (6, 10), 1)}
  O = Cat * 2.0;
}}"""

# Many operands along axis 0; one is an input and one an output: those two are copied.
MANY = f"""function (A[3, 4], B[2, 4], D[4, 4]) -> (O, Z) {{
  X = A + 1.0;
  Y = B * B;
  Z = sqrt(D * D + 1.0);
  W[i, j : 1, 4] = +(A[k, j]);
{cat("Cat", [("X", 3), ("A", 3), ("Y", 2), ("Z", 4), ("W", 1)], (13, 4), 0)}
  O = Cat - 0.5;
}}"""

# Along the last axis (the placed tensors are strided) and read by a contraction.
LAST_AXIS = f"""function (A[5, 7], B[5, 3], C[5, 2], M[12, 4]) -> (O) {{
  X = tanh(A);
  Y[i, j : 5, 3] = +(B[i, j] * B[i, j]);
  Z = C * 3.0;
{cat("Cat", [("X", 7), ("Y", 3), ("Z", 2)], (5, 12), 1)}
  O[i, n : 5, 4] = +(Cat[i, k] * M[k, n]);
}}"""

# A concatenation of a concatenation: the inner one lives in the outer one's buffer.
NESTED = f"""function (A[2, 3, 4], B[2, 5, 4], C[2, 1, 4]) -> (O) {{
  X = A * 2.0;
  Y = B + 1.0;
  Z = C - 1.0;
{cat("In", [("X", 3), ("Y", 5)], (2, 8, 4), 1)}
{cat("Out", [("Z", 1), ("In", 8)], (2, 9, 4), 1)}
  O = Out * Out;
}}"""


def _dense_block(n: int, layers: int, growth: int, c0: int) -> tuple[str, dict]:
    """DenseNet's pattern in Tile: each layer reads the concatenation of all earlier
    features and adds its own; the block ends with the concatenation of all of them."""
    hw = 5
    args = ", ".join([f"X0[{n}, {c0}, {hw}]"]
                     + [f"S{i}[{c0 + growth * i}, 1]" for i in range(layers)]
                     + [f"K{i}[{growth}, {c0 + growth * i}]" for i in range(layers)])
    lines = ["  F0 = X0 * 1.5;"]
    feats = [("F0", c0)]
    for i in range(layers):
        c = c0 + growth * i
        src = "F0"
        if i:
            lines.append(cat(f"C{i}", feats, (n, c, hw), 1))
            src = f"C{i}"
        lines.append(f"  H{i} = relu({src} * S{i});")
        lines.append(f"  F{i + 1}[b, o, x : {n}, {growth}, {hw}] = "
                     f"+(H{i}[b, c, x] * K{i}[o, c]);")
        feats.append((f"F{i + 1}", growth))
    lines.append(cat("Block", feats, (n, c0 + growth * layers, hw), 1))
    lines.append("  O = Block + 0.25;")
    text = f"function ({args}) -> (O) {{\n" + "\n".join(lines) + "\n}"
    return text, {}


# -- finding and placing ------------------------------------------------------------------------

def test_finds_the_chain_and_its_partition():
    (c,) = find_concats(program(TWO, {}))
    assert (c.output, c.axis, c.parts) == ("Cat", 1, (("X", 0), ("Y", 7)))


def test_a_chain_with_a_gap_or_an_overlap_is_no_concatenation():
    gap = """function (A[2, 3], B[2, 3]) -> (O) {
      T[i, j : 2, 7] = =(A[i, j]);
      O[i, j + 4 : 2, 7] = =(B[i, j]) default T; }"""
    overlap = """function (A[2, 3], B[2, 3]) -> (O) {
      T[i, j : 2, 5] = =(A[i, j]);
      O[i, j + 2 : 2, 5] = =(B[i, j]) default T; }"""
    assert find_concats(program(gap, {})) == []
    assert find_concats(program(overlap, {})) == []


def test_operands_are_placed_at_their_offsets():
    p = place(program(TWO, {}))
    assert p.storage["X"] == Storage("Cat", 0, (10, 1))
    assert p.storage["Y"] == Storage("Cat", 7, (10, 1))
    assert not any(op.output.startswith("Cat") for op in p.ops if op.output != "O")
    assert p.copied == ()


def test_inputs_and_outputs_are_copied_into_their_slice():
    p = place(program(MANY, {}))
    assert sorted(p.copied) == ["A", "Z"]
    assert {n: s.offset for n, s in p.storage.items()} == {
        "X": 0, "Cat_at3": 12, "Y": 24, "Cat_at8": 32, "W": 48}
    copies = [op for op in p.ops if op.output.startswith("Cat_at")]
    assert [op.expr.name for op in copies] == ["A", "Z"]


def test_nested_concatenation_lives_in_the_outer_buffer():
    p = place(program(NESTED, {}))
    assert p.storage["In"] == Storage("Out", 4, (36, 4, 1))
    assert p.storage["X"] == Storage("Out", 4, (36, 4, 1))
    assert p.storage["Y"] == Storage("Out", 16, (36, 4, 1))
    assert p.storage["Z"] == Storage("Out", 0, (36, 4, 1))


def test_growing_concatenations_are_views_of_the_largest():
    text, shapes = _dense_block(2, 4, 3, 4)
    p = place(program(text, shapes))
    assert set(p.views) == {"C1", "C2", "C3"}
    assert all(p.storage[n].root == "Block" for n in ["F0", "F1", "F2", "F3", "F4", "C2"])
    assert p.storage["C3"] == Storage("Block", 0, (80, 5, 1))
    assert p.copied == ()


def test_an_operand_twice_is_placed_once_and_copied_once():
    text = f"""function (A[3, 4]) -> (O) {{
      X = A * A;
    {cat("Cat", [("X", 3), ("X", 3)], (6, 4), 0)}
      O = Cat + 1.0; }}"""
    p = place(program(text, {}))
    assert p.storage["X"].offset == 0 and p.copied == ("X",)


def test_operand_read_at_other_elements_is_copied():
    """`reshape` reads X away from its own element: X keeps its row-major buffer."""
    text = f"""function (A[2, 6], B[2, 2]) -> (O, R) {{
      X = A * 2.0;
      R = reshape(X, 3, 4);
      Y = B + 1.0;
    {cat("Cat", [("X", 6), ("Y", 2)], (2, 8), 1)}
      O = Cat * 1.0; }}"""
    p = place(program(text, {}))
    assert p.copied == ("X",) and "Y" in p.storage


def test_the_copies_are_gone_from_the_kernel_plan():
    text, shapes = _dense_block(1, 4, 3, 4)
    before = kernels(text, shapes, place_concats=False)
    after = kernels(text, shapes)
    # Each concatenation of k operands was k copies (and, compiled, k - 1 initialisations).
    assert len(before) - len(after) == 2 + 3 + 4 + 5
    assert not any("part" in k.name or k.name.startswith(("contract_C", "contract_Block"))
                   for k in after)


# -- compiled and run ---------------------------------------------------------------------------

CASES = {"two": TWO, "many": MANY, "last_axis": LAST_AXIS, "nested": NESTED}


@needs_device
@pytest.mark.parametrize("hw", ["pocl-cpu", "nvidia-h100"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_program(name, hw):
    exe = run_case(CASES[name], {}, hw=hw)
    assert exe.plan.storage  # something was placed


@needs_device
@pytest.mark.parametrize("hw", ["pocl-cpu", "nvidia-h100"])
@pytest.mark.parametrize("n", [1, 2])
def test_dense_block(n, hw):
    text, shapes = _dense_block(n, 4, 3, 5)
    exe = run_case(text, shapes, hw=hw, seed=n, chains=False)  # (counted one a kernel)
    # The three views and five placed features: no copy kernel, one buffer for all.
    assert not any("part" in s.name or s.name.startswith(("contract_C", "init_"))
                   for s in exe.sources)
    # F0 with the first relu; per layer the product and the next relu; O.
    assert len(exe.sources) == 1 + 2 * 4


@needs_device
@pytest.mark.parametrize("dtype", ["int32", "float16"])
def test_other_element_types(dtype):
    text = f"""function (A[4, 3], B[4, 5]) -> (O) {{
      X = A * A;
      Y[i, j : 4, 5] = +(B[i, j] + B[i, j]);
    {cat("Cat", [("Y", 5), ("X", 3)], (4, 8), 1)}
      O = Cat + Cat; }}"""
    exe = run_case(text, {}, dtype=dtype)
    assert set(exe.plan.storage) == {"X", "Y"}


@needs_device
def test_concatenation_read_by_a_row_kernel_keeps_its_buffer():
    """A softmax over the concatenation and of an operand: row kernels address row-major,
    so those tensors are not placed.  The copy of Y into its slice would join Y's row kernel
    (its trailing statements): this concatenation keeps its copies."""
    text = f"""function (A[3, 4], B[3, 5]) -> (O, P) {{
      X = A * 2.0;
      M[r, 0 : 3, 1] = >(B[r, c]); E = exp(B - M);
      S[r, 0 : 3, 1] = +(E[r, c]); Y = E / S;
    {cat("Cat", [("X", 4), ("Y", 5)], (3, 9), 1)}
      MM[r, 0 : 3, 1] = >(Cat[r, c]); EE = exp(Cat - MM);
      SS[r, 0 : 3, 1] = +(EE[r, c]); O = EE / SS;
      P = Cat * 1.0; }}"""
    exe = run_case(text, {})
    assert exe.plan.storage == {}
    assert any(s.kind == "row" for s in exe.sources)


@needs_device
def test_operand_of_a_row_kernel_is_copied():
    """Y is a softmax's result (a row kernel writes it row-major): copied into its slice by
    a statement after a contraction, which no row kernel takes in; X is placed."""
    text = f"""function (A[3, 4], B[3, 5]) -> (O) {{
      M[r, 0 : 3, 1] = >(B[r, c]); E = exp(B - M);
      S[r, 0 : 3, 1] = +(E[r, c]); Y = E / S;
      X[r, c : 3, 4] = +(A[r, c] * A[r, c]);
    {cat("Cat", [("X", 4), ("Y", 5)], (3, 9), 1)}
      O = Cat * 1.0; }}"""
    exe = run_case(text, {})
    assert "Y" not in exe.plan.storage and exe.plan.storage["X"].root == "Cat"


@needs_device
def test_operand_also_read_directly_and_concatenation_an_output():
    text = f"""function (A[2, 3, 4], B[2, 3, 2]) -> (Cat, Q) {{
      X = A * 3.0;
      Y = B - 2.0;
    {cat("Cat", [("X", 4), ("Y", 2)], (2, 3, 6), 2)}
      Q[i, j : 2, 3] = +(X[i, j, k] * Y[i, j, l]);
    }}"""
    exe = run_case(text, {}, hw="nvidia-h100")
    assert exe.plan.storage["Y"] == Storage("Cat", 4, (18, 6, 1))


# Reshapes that keep every element at its offset: a pooled NHWC tail flattened (size-1 axes
# at 0) and a transpose that moves only a size-1 axis (a batch-1 attention's [1, T, C] ->
# [T, 1, C]); the operands' producers write the outputs' buffers, the copies go.
RESHAPES = """function (X[1, 3, 3, 8], K[8, 5]) -> (O, Q) {
  P[n, 0, 0, c : 1, 1, 1, 8] = +(X[n, h, w, c]);
  A = P / 9.0;
  O[n, c : 1, 8] = =(A[n, 0, 0, c]);
  M[n, h, d : 1, 3, 5] = +(X[n, h, w, c] * K[c, d]);
  R = relu(M);
  Q[h, n, d : 3, 1, 5] = =(R[n, h, d]);
}"""
# Not reshapes in place: a real transpose, an operand read twice, a read past an axis's end
# whose flat offsets agree (X[0, k] for k >= 3 is outside X: zeros, not X[1, k - 3]).
NOT_RESHAPES = """function (X[2, 3], Y[4, 6]) -> (T, U, V, W) {
  S = X * 2.0;
  T[j, i : 3, 2] = =(S[i, j]);
  E = exp(Y);
  U[a, b, j : 2, 2, 6] = =(E[2*a + b, j]);
  V = E + 1.0;
  G = X + 1.0;
  W[k : 6] = =(G[0, k]);
}"""


def test_reshapes_are_placed_in_their_outputs():
    p = place(program(RESHAPES, {"X": (1, 3, 3, 8), "K": (8, 5)}))
    assert p.storage["A"] == Storage("O", 0, (8, 8, 8, 1))
    assert p.storage["R"] == Storage("Q", 0, (15, 5, 1))
    assert not any(getattr(op, "output", None) in ("O", "Q") for op in p.ops)
    q = place(program(NOT_RESHAPES, {"X": (2, 3), "Y": (4, 6)}))
    assert not set(q.storage) & {"S", "E", "G"}


@needs_device
def test_reshapes_in_place_against_the_reference():
    exe = run_case(RESHAPES, {"X": (1, 3, 3, 8), "K": (8, 5)}, device="Portable")
    assert len(exe.kernels) == 2
    exe = run_case(NOT_RESHAPES, {"X": (2, 3), "Y": (4, 6)}, device="Portable")
