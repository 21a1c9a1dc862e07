"""Shape arithmetic evaluated when a model is loaded.

A node whose operands are all known when the graph is built (initializers, Constant nodes,
inputs whose values are given because they decide shapes, and the results of nodes folded
before) is computed now by ONNX's reference evaluator, in the model's own types (int64 shape
vectors stay int64), and becomes a constant of the graph: no kernel computes it.  `Shape` and
`Size` are always known, since every shape is static in a built graph.  So a
Shape -> Gather -> Unsqueeze -> Concat -> Reshape chain leaves only the reshape."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graph.builder import Graph, Value

# Ops evaluated at load time when all their operands are known.
FOLDABLE = frozenset({
    "Constant", "Shape", "Size", "Gather", "Squeeze", "Unsqueeze", "Concat", "Cast", "CastLike",
    "Slice", "Reshape", "Expand", "ConstantOfShape", "Range", "Add", "Sub", "Mul", "Div", "Neg",
    "Abs", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or",
    "Where", "Min", "Max", "Sum", "Identity", "Flatten", "Transpose", "Tile", "Split",
    "ReduceProd", "ReduceSum", "ReduceMin", "ReduceMax", "Sqrt", "Pad", "GatherElements",
    "ArgMax", "ArgMin", "Mod", "Trilu", "Floor", "Ceil"})
# Larger operands are left to the kernels (and to the constant_folding pass).
MAX_ELEMENTS = 1 << 20


def graph_constant(g: Graph, array: np.ndarray, name: str) -> Value:
    """A graph constant of a known array.  The 64-bit "to the end" sentinels of slices
    (INT64_MAX, INT64_MIN and their neighbours, past +-2^62) become int32's extremes (as shape
    operands they are read unchanged); any other integer beyond int32 is left for
    `Graph.constant` to refuse, not changed."""
    a = np.asarray(array)
    if a.dtype.kind in "iu" and a.size:
        info = np.iinfo(np.int32)
        big = np.abs(a.astype(np.float64)) >= 2.0**62
        if big.any():
            a = np.where(big, np.where(a > 0, info.max, info.min), a).astype(a.dtype)
    return g.constant(a, name)


def _evaluate(node: Any, opset: int, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    from onnx import TypeProto, helper
    from onnx.reference import ReferenceEvaluator

    ins = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for k, v in feeds.items()]
    outs = [helper.make_value_info(o, TypeProto()) for o in node.output if o]
    model = helper.make_model(helper.make_graph([node], "fold", ins, outs),
                              opset_imports=[helper.make_opsetid("", opset)])
    return [np.asarray(r) for r in ReferenceEvaluator(model).run(None, feeds)]


def try_fold(node: Any, opset: int, env: dict[str, Value],
             known: dict[str, np.ndarray]) -> list[np.ndarray] | None:
    """The node's outputs when they can be computed now, else None."""
    op = node.op_type
    if node.domain not in ("", "ai.onnx") or op not in FOLDABLE:
        return None
    names = [i for i in node.input if i]
    if op in ("Shape", "Size"):
        if not names or names[0] not in env:
            return None
        shape = np.asarray(env[names[0]].shape, np.int64)
        if op == "Size":
            return [np.asarray(int(np.prod(shape)), np.int64)]
        from onnx import helper

        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        end = attrs.get("end")
        return [shape[int(attrs.get("start", 0)):None if end is None else int(end)]]
    if not all(i in known for i in names):
        return None
    if sum(known[i].size for i in names) > MAX_ELEMENTS:
        return None
    try:
        outs = _evaluate(node, opset, {i: known[i] for i in names})
    except Exception:  # the converter reports what is wrong with the node
        return None
    if any(o.dtype.kind not in "biuf" for o in outs):
        return None
    return outs


__all__ = ["FOLDABLE", "graph_constant", "try_fold"]
