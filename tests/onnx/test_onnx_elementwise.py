"""The elementwise ONNX ops (activations, math, comparisons and logic, Where, variadic Sum / Max /
Min / Mean): small models on random inputs (never zeros, broadcasting shapes, every attribute
variant) run with the outputs poisoned and compared with onnxruntime; the modules of ONNX's own
node cases for these ops (run by test_onnx.py); and the errors for bad attributes, old opsets and
unsupported types."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

import tilec.onnx.importer as tonnx  # noqa: E402
from tilec.errors import TileError  # noqa: E402
from tilec.onnx.elementwise import ELEMENTWISE_CONVERTERS  # noqa: E402

from ..device import needs_device  # noqa: E402
from ..onnx_cases import against_onnxruntime  # noqa: E402

device = needs_device
RNG = np.random.default_rng(31)
F, F16, I32, I64, B = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32,
                       TensorProto.INT64, TensorProto.BOOL)
NP = {F: np.float32, F16: np.float16, I32: np.int32, I64: np.int64, B: np.bool_}


def rand(shape, dtype=F, positive=False, ties=False):
    """Random values away from zero, either sign (`ties`: from a few values, so that
    comparisons meet equal operands)."""
    shape = tuple(shape)
    if dtype == B:
        return np.asarray(RNG.random(shape) < 0.5)
    if dtype in (I32, I64):
        v = RNG.integers(1, 4 if ties else 50, shape)
    elif ties:
        v = RNG.choice([0.5, 1.5, 2.5], shape)
    else:
        v = RNG.uniform(0.25, 3.0, shape)
    if not positive:
        v = v * RNG.choice([-1, 1], shape)
    return np.asarray(v).astype(NP[dtype])


def model(nodes, inputs, outputs, opset=17):
    def info(name, dtype, shape):
        return helper.make_tensor_value_info(name, dtype, shape)

    graph = helper.make_graph(nodes, "m", [info(*i) for i in inputs],
                              [info(*o) for o in outputs])
    # IR version 9 covers opset 20 (Gelu); the installed onnxruntime reads it.
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=9 if opset > 17 else 8)


def check(m, feed, rtol=1e-5, atol=1e-5):
    """tilec (outputs poisoned) against onnxruntime: same types, shapes and values."""
    return against_onnxruntime(m, feed, rtol, atol, scaled_atol=False)


# unary ops and activations ------------------------------------------------------------------------

UNARY = [  # op, attributes, opset, input type, positive inputs only
    ("Exp", {}, 13, F, False), ("Log", {}, 13, F, True), ("Sqrt", {}, 13, F, True),
    ("Neg", {}, 13, F, False), ("Neg", {}, 13, I32, False), ("Neg", {}, 13, I64, False),
    ("Abs", {}, 13, F, False), ("Abs", {}, 13, I64, False), ("Reciprocal", {}, 13, F, False),
    ("Sin", {}, 7, F, False), ("Cos", {}, 7, F, False), ("Erf", {}, 13, F, False),
    ("Erf", {}, 9, F, False), ("Softplus", {}, 17, F, False), ("Mish", {}, 18, F, False),
    ("HardSwish", {}, 14, F, False), ("HardSigmoid", {}, 17, F, False),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 6, F, False),
    ("HardSigmoid", {"alpha": 1.5}, 17, F, False), ("HardSigmoid", {"beta": -0.25}, 17, F, False),
    ("Elu", {}, 6, F, False), ("Elu", {"alpha": 0.5}, 17, F, False),
    ("Selu", {}, 6, F, False), ("Selu", {"alpha": 1.2, "gamma": 2.0}, 17, F, False),
    ("Selu", {"gamma": 0.75}, 17, F, False),
    ("Gelu", {}, 20, F, False), ("Gelu", {"approximate": "none"}, 20, F, False),
    ("Gelu", {"approximate": "tanh"}, 20, F, False),
    ("Exp", {}, 13, F16, False), ("Gelu", {"approximate": "tanh"}, 20, F16, False),
    ("HardSwish", {}, 14, F16, False), ("Abs", {}, 13, F16, False),
]


@device
@pytest.mark.parametrize("op, attrs, opset, dtype, positive", UNARY,
                         ids=[f"{u[0]}-{u[2]}-{NP[u[3]].__name__}-{i}"
                              for i, u in enumerate(UNARY)])
def test_unary_matches_onnxruntime(op, attrs, opset, dtype, positive):
    shape = (2, 3, 5)
    x = rand(shape, dtype, positive)
    if dtype in (F, F16) and not positive and op not in ("Exp", "Reciprocal"):
        x = x * 2  # reach further into the saturating parts (HardSigmoid, Elu, Gelu)
    m = model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", dtype, shape)],
              [("y", dtype, shape)], opset)
    tol = {"rtol": 2e-3, "atol": 2e-3} if dtype == F16 else {}
    check(m, {"x": x}, **tol)


@device
def test_activation_chain_is_one_statement():
    """HardSwish -> Less -> Where (and Neg) fuse into one Tile statement; the comparison is
    bool."""
    shape = (4, 6)
    nodes = [helper.make_node("HardSwish", ["x"], ["h"]),
             helper.make_node("Less", ["h", "t"], ["c"]),
             helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("Where", ["c", "x", "n"], ["y"])]
    m = model(nodes, [("x", F, shape), ("t", F, [6])], [("y", F, shape)], 16)
    exe = check(m, {"x": rand(shape) * 3, "t": rand([6])})
    assert [n.op for n in exe.graph.nodes] == ["fused"]
    body = [ln for ln in exe.tile.splitlines() if ln.strip() and not ln.strip().startswith("//")]
    assert len(body) == 3 and " ? " in body[1] and "min(max(" in body[1], exe.tile
    plain = tonnx.to_graph(m)
    assert [(n.op, n.dtype) for n in plain.nodes if n.op in ("lt", "where")] == \
        [("lt", "bool"), ("where", "float32")]


# Pow and PRelu ------------------------------------------------------------------------------------

@device
@pytest.mark.parametrize("xs, ys, ytype, opset, integral", [
    ((2, 3, 4), (2, 3, 4), F, 13, False),
    ((2, 3, 4), (4,), F, 15, False),
    ((3, 1), (2, 1, 5), F, 12, False),
    ((2, 3, 4), (3, 1), F, 7, True),  # a negative base with integer exponents
    ((2, 3, 4), (4,), I64, 15, True),
    ((3, 4), (), I32, 13, True)])
def test_pow_matches_onnxruntime(xs, ys, ytype, opset, integral):
    x = rand(xs, F, positive=not integral)
    y = RNG.integers(-3, 4, ys).astype(NP[ytype]) if integral else rand(ys) * 1.5
    if integral and ytype == F:
        y = np.where(y == 0, 2, y).astype(np.float32)
    out = tuple(np.broadcast_shapes(xs, ys))
    m = model([helper.make_node("Pow", ["x", "y"], ["z"])], [("x", F, xs), ("y", ytype, ys)],
              [("z", F, out)], opset)
    check(m, {"x": x, "y": y}, rtol=1e-5, atol=1e-5)


@device
@pytest.mark.parametrize("slope_shape, opset", [
    ((5,), 16), ((3, 1), 9), ((1,), 16), ((), 16), ((2, 3, 5), 7), ((1, 3, 1), 16)])
def test_prelu_slope_broadcasts_to_the_input(slope_shape, opset):
    shape = (2, 3, 5)
    m = model([helper.make_node("PRelu", ["x", "s"], ["y"])],
              [("x", F, shape), ("s", F, slope_shape)], [("y", F, shape)], opset)
    check(m, {"x": rand(shape), "s": rand(slope_shape)})


# comparisons, logic and Where ---------------------------------------------------------------------

BROADCASTS = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (3, 1)), ((4,), (2, 3, 1)), ((), (3, 2))]


@device
@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [F, I64], ids=["float32", "int64"])
@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
def test_comparisons_give_bool(op, dtype, shapes):
    a, b = (rand(s, dtype, ties=True) for s in shapes)
    out = tuple(np.broadcast_shapes(*shapes))
    m = model([helper.make_node(op, ["a", "b"], ["y"])],
              [("a", dtype, shapes[0]), ("b", dtype, shapes[1])], [("y", B, out)], 16)
    check(m, {"a": a, "b": b})


@device
@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
def test_logic_ops(shapes):
    out = tuple(np.broadcast_shapes(*shapes))
    nodes = [helper.make_node("And", ["a", "b"], ["y_and"]),
             helper.make_node("Or", ["a", "b"], ["y_or"]),
             helper.make_node("Not", ["a"], ["y_not"]),
             helper.make_node("Equal", ["a", "b"], ["y_eq"])]  # bool operands, opset 11 on
    m = model(nodes, [("a", B, shapes[0]), ("b", B, shapes[1])],
              [("y_and", B, out), ("y_or", B, out), ("y_not", B, shapes[0]), ("y_eq", B, out)],
              13)
    check(m, {"a": rand(shapes[0], B), "b": rand(shapes[1], B)})


@device
@pytest.mark.parametrize("cs, xs, ys, dtype, opset", [
    ((2, 3, 4), (2, 3, 4), (2, 3, 4), F, 16),
    ((3, 1), (2, 1, 4), (4,), F, 9),
    ((4,), (), (2, 3, 1), F, 16),
    ((2, 1, 4), (3, 4), (2, 3, 1), I64, 16),
    ((3, 4), (3, 4), (1,), I32, 16)])
def test_where_broadcasts_its_three_operands(cs, xs, ys, dtype, opset):
    out = tuple(np.broadcast_shapes(cs, xs, ys))
    m = model([helper.make_node("Where", ["c", "x", "y"], ["z"])],
              [("c", B, cs), ("x", dtype, xs), ("y", dtype, ys)], [("z", dtype, out)], opset)
    check(m, {"c": rand(cs, B), "x": rand(xs, dtype), "y": rand(ys, dtype)})


@device
def test_comparisons_and_logic_feed_where():
    """|x| <= 1 and not x > y, as ONNX exporters write a masked select."""
    shape = (3, 5)
    nodes = [helper.make_node("Abs", ["x"], ["ax"]),
             helper.make_node("LessOrEqual", ["ax", "one"], ["small"]),
             helper.make_node("Greater", ["x", "y"], ["gt"]),
             helper.make_node("Not", ["gt"], ["ngt"]),
             helper.make_node("And", ["small", "ngt"], ["c"]),
             helper.make_node("Neg", ["y"], ["ny"]),
             helper.make_node("Where", ["c", "x", "ny"], ["z"])]
    m = model(nodes, [("x", F, shape), ("y", F, [5]), ("one", F, [])], [("z", F, shape)], 16)
    check(m, {"x": rand(shape, ties=True) - np.float32(1), "y": rand([5], ties=True),
              "one": np.asarray(1.5, np.float32)})


# variadic Sum / Max / Min / Mean ------------------------------------------------------------------

@device
@pytest.mark.parametrize("op", ["Sum", "Max", "Min", "Mean"])
@pytest.mark.parametrize("shapes, opset", [
    ([(3, 4)], 13), ([(3, 4), (3, 4)], 6), ([(3, 4), (2, 1, 4), (4,)], 13),
    ([(2, 3, 1), (1, 5), (), (2, 1, 5)], 8)], ids=lambda v: str(v).replace(" ", ""))
def test_variadic_ops_broadcast_their_operands(op, shapes, opset):
    names = [f"x{i}" for i in range(len(shapes))]
    out = tuple(np.broadcast_shapes(*shapes))
    m = model([helper.make_node(op, names, ["y"])],
              [(n, F, s) for n, s in zip(names, shapes, strict=True)], [("y", F, out)], opset)
    check(m, {n: rand(s, ties=op in ("Max", "Min")) for n, s in zip(names, shapes, strict=True)})


@device
@pytest.mark.parametrize("op", ["Max", "Min"])  # integers from opset 12 on
def test_variadic_ops_on_integers(op):
    shapes = [(2, 3), (3,), (2, 1)]
    m = model([helper.make_node(op, ["a", "b", "c"], ["y"])],
              [(n, I64, s) for n, s in zip("abc", shapes, strict=True)], [("y", I64, (2, 3))],
              13)
    check(m, {n: rand(s, I64) for n, s in zip("abc", shapes, strict=True)})


# ONNX's node cases -------------------------------------------------------------------------------

# The node-case modules of these ops, and of the expanded (function body) cases they make
# supported; tests/onnx/test_onnx.py imports them before collecting its node cases, which run
# there.
CASE_MODULES = ("abs", "and_", "cos", "elu", "equal", "erf", "exp", "gelu", "greater",
                "greater_or_equal", "hardsigmoid", "hardswish", "less", "less_or_equal", "log",
                "logsoftmax", "max", "mean", "meanvariancenormalization", "min", "mish", "neg",
                "not_", "or_", "pow", "prelu", "reciprocal", "reduce_log_sum", "reducel1", "selu",
                "sin", "softplus", "sqrt", "sum", "where")
# Node cases of these ops refused on purpose.
REFUSED = {"test_equal_string": "element type STRING is not supported",
           "test_equal_string_broadcast": "element type STRING is not supported",
           "test_pow_types_int32_float32": "Pow of integer operands is not supported",
           "test_pow_types_int32_int32": "Pow of integer operands is not supported",
           "test_pow_types_int64_float32": "Pow of integer operands is not supported",
           "test_pow_types_int64_int64": "Pow of integer operands is not supported"}


def import_case_modules(modules=CASE_MODULES) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case builders warn about their own numpy maths
        for m in modules:
            importlib.import_module(f"onnx.backend.test.case.node.{m}")


def test_node_cases_cover_every_op():
    """Every op has node cases that test_onnx.py runs; the refusals are among them."""
    import onnx.backend.test.case.node as node

    import_case_modules()
    cases = [c for c in node._NodeTestCases
             if {n.op_type for n in c.model.graph.node} & set(ELEMENTWISE_CONVERTERS)]
    supported = [c for c in cases if not tonnx.unsupported_ops(c.model)]
    covered = {n.op_type for c in supported for n in c.model.graph.node}
    assert set(ELEMENTWISE_CONVERTERS) <= covered
    assert set(REFUSED) <= {c.name for c in supported}
    assert len(supported) >= 150


# errors -------------------------------------------------------------------------------------------

def _refused(nodes, inputs, outputs, opset, pattern):
    with pytest.raises(TileError, match=pattern):
        tonnx.load(model(nodes, inputs, outputs, opset))


def test_gelu_refuses_an_unknown_approximation():
    node = helper.make_node("Gelu", ["x"], ["y"], approximate="fast")
    _refused([node], [("x", F, [3])], [("y", F, [3])], 20,
             r"ONNX node 'y' \(Gelu\): attribute approximate='fast' is not valid \(expected "
             r"'none' or 'tanh'\)")


@pytest.mark.parametrize("op, since", [("Gelu", 20), ("Mish", 18), ("HardSwish", 14),
                                       ("LessOrEqual", 12), ("Where", 9), ("Erf", 9)])
def test_ops_newer_than_the_model_opset_are_refused(op, since):
    n = {"Where": 3, "LessOrEqual": 2}.get(op, 1)
    names = ["c", "x", "y"][3 - n:] if op == "Where" else ["x", "y"][:n]
    types = {"c": B}
    node = helper.make_node(op, names, ["z"])
    _refused([node], [(k, types.get(k, F), [3]) for k in names], [("z", F, [3])], since - 1,
             rf"\({op}\): {op} exists from opset {since} on \(the model imports opset "
             rf"{since - 1}\)")


@pytest.mark.parametrize("nodes, inputs, pattern", [
    ([helper.make_node("Pow", ["x", "y"], ["z"])], [("x", I32, [3]), ("y", I32, [3])],
     r"\(Pow\): Pow of integer operands is not supported \(only floating-point ones\)"),
    ([helper.make_node("Exp", ["x"], ["z"])], [("x", I64, [3])],
     r"\(Exp\): Exp of integer operands is not supported"),
    ([helper.make_node("Mean", ["x", "y"], ["z"])], [("x", I32, [3]), ("y", I32, [3])],
     r"\(Mean\): Mean of integer operands"),
    ([helper.make_node("Where", ["x", "x", "y"], ["z"])], [("x", F, [3]), ("y", F, [3])],
     r"\(Where\): the condition must be bool, not float32"),
    ([helper.make_node("And", ["x", "y"], ["z"])], [("x", F, [3]), ("y", B, [3])],
     r"\(And\): operands must be bool, not float32"),
    ([helper.make_node("PRelu", ["x", "y"], ["z"])], [("x", F, [2, 3]), ("y", F, [2, 1, 3])],
     r"\(PRelu\): prelu: the slope \[2, 1, 3\] does not broadcast to the input \[2, 3\]"),
    ([helper.make_node("Less", ["x", "y"], ["z"])], [("x", F, [2, 3]), ("y", F, [2])],
     r"\(Less\): lt: operand shapes \[2, 3\] and \[2\] do not broadcast")])
def test_bad_operands_are_refused(nodes, inputs, pattern):
    _refused(nodes, inputs, [("z", F, None)], 17, "ONNX node 'z' " + pattern)


def test_unsupported_ops_are_still_listed_together():
    nodes = [helper.make_node("Gelu", ["x"], ["a"]), helper.make_node("Sign", ["a"], ["b"]),
             helper.make_node("Round", ["b"], ["c"]), helper.make_node("Where", ["m", "c", "x"],
                                                                       ["y"])]
    _refused(nodes, [("x", F, [3]), ("m", B, [3])], [("y", F, [3])], 20,
             r"^the model uses ONNX ops tilec does not support: Round, Sign \(supported: .*"
             r"Gelu.*Where")
