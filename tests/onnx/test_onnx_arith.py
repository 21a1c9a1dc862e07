"""ONNX Mod, Trilu, Floor and Ceil (`tilec.onnx.arith`): models where they run in a kernel or
fold at load, and their errors.  ONNX's own node cases of them (all element types tilec has,
both sign rules, infinities and NaN) run in test_onnx.py (`CASE_MODULES`)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

import tilec.onnx.importer as tonnx  # noqa: E402
from tilec.errors import TileError  # noqa: E402

from ..device import needs_device  # noqa: E402

CASE_MODULES = ("mod", "trilu", "floor", "ceil")


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "m", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@needs_device
@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [-2, 0, 3])
def test_trilu_of_a_computed_tensor(upper, k):
    rng = np.random.default_rng(3)
    x = rng.uniform(0.5, 2, (2, 5, 7)).astype(np.float32)
    m = _model([helper.make_node("Relu", ["x"], ["r"]),
                helper.make_node("Trilu", ["r", "k"], ["y"], upper=upper)],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 7])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 7])],
               [onnx.numpy_helper.from_array(np.array(k, np.int64), "k")])
    got = tonnx.load(m).run({"x": x}, poison=True)["y"]
    want = np.triu(x, k) if upper else np.tril(x, k)
    np.testing.assert_array_equal(got, want)


@needs_device
def test_causal_mask_of_a_constant_folds():
    """A mask made by Trilu of a constant (a decoder's causal mask) costs no kernel."""
    full = np.full((6, 6), -np.inf, np.float32)
    m = _model([helper.make_node("Trilu", ["c"], ["mask"], upper=1),
                helper.make_node("Add", ["x", "mask"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 6])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 6])],
               [onnx.numpy_helper.from_array(full, "c")])
    exe = tonnx.load(m)
    assert len(exe.kernels) == 1
    x = np.random.default_rng(4).standard_normal((6, 6)).astype(np.float32)
    np.testing.assert_array_equal(exe.run({"x": x}, poison=True)["y"], x + np.triu(full))


def test_errors():
    m = _model([helper.make_node("Trilu", ["x"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5])])
    with pytest.raises(TileError, match="Trilu needs at least 2"):
        tonnx.to_graph(m)
    m = _model([helper.make_node("Mod", ["a", "b"], ["y"], fmod=2)],
               [helper.make_tensor_value_info(n, TensorProto.INT32, [3]) for n in "ab"],
               [helper.make_tensor_value_info("y", TensorProto.INT32, [3])])
    with pytest.raises(TileError, match="fmod=2"):
        tonnx.to_graph(m)
