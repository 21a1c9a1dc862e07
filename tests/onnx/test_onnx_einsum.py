"""ONNX Einsum: small models on random non-zero inputs (odd sizes, explicit and implicit
outputs, '...', diagonals, 1 to 3 operands, int32 and float16), run with the outputs poisoned and
compared with onnxruntime; a two-operand Einsum is one contraction kernel; the refusals name the
node and the attribute.  ONNX's own node cases run in test_onnx.py (`CASE_MODULES`)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

import tilec.onnx.importer as tonnx  # noqa: E402
from tilec.errors import TileError  # noqa: E402

from ..device import needs_device  # noqa: E402
from ..onnx_cases import against_onnxruntime  # noqa: E402

device = needs_device
RNG = np.random.default_rng(59)

# ONNX's node-case module of Einsum; test_onnx.py imports it before collecting its node cases.
CASE_MODULES = ("einsum",)
# Its cases refused on purpose: bfloat16 has no storage in tilec.
REFUSED = {f"test_einsum_{n}_bfloat16": "element type BFLOAT16 is not supported"
           for n in ("batch_matmul", "sum", "transpose")}

_TYPES = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16,
          np.int32: TensorProto.INT32, np.int64: TensorProto.INT64}


def rand(shape, dtype=np.float32):
    shape = tuple(shape)
    if np.dtype(dtype).kind == "i":
        return RNG.integers(-4, 5, shape).astype(dtype)
    return (RNG.uniform(0.25, 2.0, shape) * RNG.choice([-1, 1], shape)).astype(dtype)


def einsum_model(equation, shapes, dtype=np.float32, opset=12):
    t = _TYPES[dtype]
    names = [f"x{k}" for k in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], equation=equation, name="E")
    graph = helper.make_graph([node], "m", [helper.make_tensor_value_info(n, t, s)
                                            for n, s in zip(names, shapes, strict=True)],
                              [helper.make_tensor_value_info("y", t, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


def check(m, feed, rtol=1e-4, atol=1e-5):
    """tilec (outputs poisoned) against onnxruntime: same types, shapes and values."""
    return against_onnxruntime(m, feed, rtol, atol, scaled_atol=True)


CASES = [
    ("ij,jk->ik", [(37, 53), (53, 29)]),
    ("bij,bkj->bik", [(3, 5, 7), (3, 11, 7)]),
    ("...ij,...jk->...ik", [(2, 1, 5, 4), (2, 3, 4, 6)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 8), (2, 3, 7, 8)]),
    ("i,j", [(7,), (5,)]),
    ("ij,ij", [(9, 13), (9, 13)]),
    ("ij->ji", [(7, 3)]),
    ("...ii->...i", [(2, 3, 5, 5)]),
    ("ii", [(6, 6)]),
    ("ijk->kj", [(3, 4, 5)]),
    ("ij,jk,kl->li", [(3, 4), (4, 5), (5, 2)]),
]


@device
@pytest.mark.parametrize("equation, shapes", CASES, ids=[e for e, _ in CASES])
def test_einsum(equation, shapes):
    feed = {f"x{k}": rand(s) for k, s in enumerate(shapes)}
    exe = check(einsum_model(equation, shapes), feed)
    if len(shapes) == 2:  # one product (a CPU model may copy an operand into its lanes)
        kinds = [k.kind for k in exe.kernels if not k.name.endswith("_t")]
        assert kinds == ["contraction"], exe.tile


@device
@pytest.mark.parametrize("dtype", [np.float16, np.int32, np.int64])
def test_einsum_types(dtype):
    shapes = [(5, 7), (7, 3)]
    feed = {f"x{k}": rand(s, dtype) for k, s in enumerate(shapes)}
    check(einsum_model("ij,jk->ik", shapes, dtype), feed, rtol=2e-3 if dtype == np.float16
          else 1e-4)


@pytest.mark.parametrize("equation, shapes, pattern", [
    ("ij,jk->ik", [(3, 4), (5, 6)], "attribute equation: .*label 'j' has size 4 and size 5"),
    ("ij->ix", [(3, 4)], "attribute equation: .*output label 'x' is not on any operand"),
    ("ij,jk", [(3, 4)], "attribute equation: .*2 operand terms for 1 operands"),
])
def test_einsum_errors(equation, shapes, pattern):
    with pytest.raises(TileError, match=r"ONNX node 'E' \(Einsum\): " + pattern):
        tonnx.to_graph(einsum_model(equation, shapes))


def test_einsum_needs_opset_12():
    with pytest.raises(TileError, match="Einsum exists from opset 12 on"):
        tonnx.to_graph(einsum_model("ij->ji", [(3, 4)], opset=11))


def test_einsum_needs_equation():
    m = einsum_model("ij->ji", [(3, 4)])
    del m.graph.node[0].attribute[:]
    with pytest.raises(TileError, match="the attribute equation is required"):
        tonnx.to_graph(m)
