"""The shape, indexing and conversion ONNX ops (Shape, Gather, Squeeze, Unsqueeze, Cast, Slice,
Expand, ConstantOfShape, Range, Split, Tile, Pad, ReduceMin / Prod / L2, ArgMax / ArgMin,
GatherElements, DepthToSpace / SpaceToDepth): small models on random non-zero inputs, every
attribute variant, outputs poisoned and compared with onnxruntime; shape arithmetic folded at
load (no kernel); a GPT-style embedding; the modules of ONNX's node cases for these ops (run by
test_onnx.py)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import tilec.onnx.importer as tonnx  # noqa: E402
from tilec.errors import TileError  # noqa: E402

from ..device import needs_device  # noqa: E402
from .test_onnx_elementwise import check, model, rand  # noqa: E402

device = needs_device
RNG = np.random.default_rng(7)
F, F16, I32, I64, B = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32,
                       TensorProto.INT64, TensorProto.BOOL)


def const(name, arr):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr)))


def ints(name, vals):
    return const(name, np.asarray(vals, np.int64))


def one(op, ins, attrs=None, extra=(), x_shape=(3, 4, 5), out=None, opset=17, dtype=F,
        feeds=None):
    """A model of `extra` constant nodes and one `op` node reading x (and the constants)."""
    nodes = [*extra, helper.make_node(op, ins, ["y"], **(attrs or {}))]
    m = model(nodes, [("x", dtype, x_shape)], [("y", out or dtype, None)], opset)
    return check(m, {"x": rand(x_shape, dtype)} if feeds is None else feeds)


# Gather ------------------------------------------------------------------------------------------

@device
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
@pytest.mark.parametrize("itype", [I64, I32])
def test_gather_any_axis_negative_indices(axis, itype):
    n = (3, 4, 5)[axis]
    idx = RNG.integers(-n, n, (2, 3)).astype(np.int64 if itype == I64 else np.int32)
    m = model([helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)],
              [("x", F, (3, 4, 5)), ("i", itype, (2, 3))], [("y", F, None)], 13)
    check(m, {"x": rand((3, 4, 5)), "i": idx})


@device
def test_gather_scalar_index_and_constant_indices():
    one("Gather", ["x", "i"], {"axis": 1}, [ints("i", -2)])
    one("Gather", ["x", "i"], {}, [ints("i", [[0, -1], [2, 1]])], opset=11)


@device
@pytest.mark.parametrize("idx,axis,sliced", [
    (-2, 1, True), (0, 0, True), ([0, 2, 4], 2, True), ([3], -1, True), ([1, 2], 1, True),
    ([2, 0], 1, False), ([0, 0, 1], 2, False), ([[0, 1]], 2, False)])
def test_gather_by_a_constant_regular_index_is_a_slice(idx, axis, sliced):
    """A constant index that picks one position or a run a fixed positive step apart is read
    as a slice (a copy the copies around it compose with), any other stays a gather."""
    exe = one("Gather", ["x", "i"], {"axis": axis}, [ints("i", idx)])
    assert ("gather(" not in exe.last.tile) == sliced


# Squeeze / Unsqueeze -----------------------------------------------------------------------------

@device
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axes", [None, [1], [-1, 0]])
def test_squeeze(opset, axes):
    shape = (2, 1, 3) if axes == [1] else (1, 3, 1)
    if axes is None:
        one("Squeeze", ["x"], x_shape=shape, opset=opset)
    elif opset < 13:
        one("Squeeze", ["x"], {"axes": axes}, x_shape=shape, opset=opset)
    else:
        one("Squeeze", ["x", "a"], extra=[ints("a", axes)], x_shape=shape, opset=opset)


@device
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axes", [[0], [1, -1], [-1], [0, 4, 2]])
def test_unsqueeze(opset, axes):
    if opset < 13:
        one("Unsqueeze", ["x"], {"axes": axes}, x_shape=(2, 3), opset=opset)
    else:
        one("Unsqueeze", ["x", "a"], extra=[ints("a", axes)], x_shape=(2, 3), opset=opset)


# Cast --------------------------------------------------------------------------------------------

@device
@pytest.mark.parametrize("src, to", [(F, I64), (F, I32), (F, B), (F, F16), (I64, F), (B, F),
                                     (I32, B), (F16, F), (I64, I32)])
def test_cast(src, to):
    one("Cast", ["x"], {"to": to}, out=to, dtype=src, opset=13)


@device
def test_cast_like():
    m = model([helper.make_node("CastLike", ["x", "t"], ["y"])],
              [("x", F, (2, 3)), ("t", I64, (1,))], [("y", I64, None)], 15)
    check(m, {"x": rand((2, 3)) * 5, "t": np.array([1], np.int64)})


# Slice -------------------------------------------------------------------------------------------

SLICES = [  # starts, ends, axes, steps
    ([1, 0], [3, -1], None, None), ([0], [100], [2], None), ([-1], [-100], [1], [-1]),
    ([4, 0], [0, 3], [2, 0], [-2, 2]), ([2**62], [-(2**62)], [-1], [-3]),
    ([1, 1, 1], [2**63 - 1] * 3, [0, 1, 2], [1, 2, 3]),
]


@device
@pytest.mark.parametrize("starts, ends, axes, steps", SLICES)
def test_slice_inputs(starts, ends, axes, steps):
    names = ["x", "s", "e"] + (["a"] if axes is not None or steps is not None else [])
    extra = [ints("s", starts), ints("e", ends)]
    if axes is not None or steps is not None:
        extra.append(ints("a", axes if axes is not None else list(range(len(starts)))))
    if steps is not None:
        names.append("t")
        extra.append(ints("t", steps))
    one("Slice", names, extra=extra, opset=13)


@device
def test_slice_attributes_and_graph_inputs():
    one("Slice", ["x"], {"starts": [1, -3], "ends": [3, 100], "axes": [0, 2]}, opset=9)
    m = model([helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])],
              [("x", F, (3, 4, 5)), ("s", I64, (1,)), ("e", I64, (1,)), ("a", I64, (1,)),
               ("t", I64, (1,))], [("y", F, None)], 13)
    check(m, {"x": rand((3, 4, 5)), "s": np.array([3]), "e": np.array([0]),
              "a": np.array([1]), "t": np.array([-2])})


# Expand, Tile, ConstantOfShape, Range ------------------------------------------------------------

@device
@pytest.mark.parametrize("shape", [[2, 1, 1, 5], [4, 1], [3, 4, 5], [1]])
def test_expand(shape):
    one("Expand", ["x", "s"], extra=[ints("s", shape)], x_shape=(3, 1, 5), opset=13)


@device
@pytest.mark.parametrize("reps", [[2, 1, 3], [1, 1, 1], [1, 3, 2]])
def test_tile(reps):
    one("Tile", ["x", "r"], extra=[ints("r", reps)], opset=13)


@device
@pytest.mark.parametrize("value", [None, np.array([1.5], np.float32), np.array([7], np.int64)])
def test_constant_of_shape_adds_to_data(value):
    attrs = {} if value is None else {"value": numpy_helper.from_array(value)}
    dt = I64 if value is not None and value.dtype == np.int64 else F
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["c"], **attrs),
             helper.make_node("Add", ["x", "c"], ["y"])]
    m = model(nodes, [("x", dt, (2, 3))], [("y", dt, None)], 13)
    check(m, {"x": rand((2, 3), dt)})


@device
@pytest.mark.parametrize("start, limit, delta, dt", [(1, 11, 3, np.int64), (5, -3, -2, np.int32),
                                                     (0.5, 3.0, 0.75, np.float32)])
def test_range_is_folded(start, limit, delta, dt):
    nodes = [const("a", np.array(start, dt)), const("b", np.array(limit, dt)),
             const("d", np.array(delta, dt)), helper.make_node("Range", ["a", "b", "d"], ["r"]),
             helper.make_node("Add", ["x", "r"], ["y"])]
    n = len(np.arange(start, limit, delta))
    t = {np.int64: I64, np.int32: I32, np.float32: F}[dt]
    m = model(nodes, [("x", t, (2, n))], [("y", t, None)], 13)
    exe = check(m, {"x": rand((2, n), t)})
    assert len(exe.kernels) == 1


# Split, Pad --------------------------------------------------------------------------------------

@device
@pytest.mark.parametrize("opset, attrs, split, outs", [
    (11, {"axis": 1}, None, 2), (11, {"axis": -1, "split": [1, 3, 1]}, None, 3),
    (13, {"axis": 2}, [2, 3], 2), (13, {}, None, 3), (18, {"axis": 2, "num_outputs": 2}, None, 2),
    (18, {"axis": 1, "num_outputs": 3}, None, 3)])
def test_split(opset, attrs, split, outs):
    ins = ["x"] + (["s"] if split is not None else [])
    extra = [ints("s", split)] if split is not None else []
    names = [f"y{k}" for k in range(outs)]
    nodes = [*extra, helper.make_node("Split", ins, names, **attrs)]
    shape = (3, 4, 5) if attrs.get("axis", 0) != 1 or outs != 3 else (3, 6, 5)
    m = model(nodes, [("x", F, shape)], [(n, F, None) for n in names], opset)
    check(m, {"x": rand(shape)})


PADS = [("constant", [1, 0, 2, 0, 1, 1], None), ("constant", [0, 1, 0, 2, 0, 0], 2.5),
        ("constant", [1, -1, 0, 0, 2, -2], None), ("reflect", [1, 2, 3, 2, 1, 0], None),
        ("edge", [2, 0, 1, 1, 3, 2], None)]


@device
@pytest.mark.parametrize("mode, pads, value", PADS)
@pytest.mark.parametrize("opset", [2, 11, 18])
def test_pad(mode, pads, value, opset):
    if opset == 2:
        attrs = {"mode": mode, "pads": pads, **({"value": value} if value else {})}
        one("Pad", ["x"], attrs, opset=2)
        return
    ins, extra = ["x", "p"], [ints("p", pads)]
    if value is not None:
        ins.append("v")
        extra.append(const("v", np.array(value, np.float32)))
    if opset == 18:  # the same pads given for axes [2, 0, 1] through `axes`
        perm = [2, 0, 1]
        ins += [""] * (3 - len(ins)) + ["a"]
        extra[0] = ints("p", [pads[a] for a in perm] + [pads[3 + a] for a in perm])
        extra.append(ints("a", perm))
    one("Pad", ins, {"mode": mode}, extra, opset=opset)


# reductions, ArgMax / ArgMin ---------------------------------------------------------------------

@device
@pytest.mark.parametrize("op", ["ReduceMin", "ReduceProd", "ReduceL2"])
@pytest.mark.parametrize("opset, axes, keep", [(13, [1], 1), (13, [0, -1], 0), (13, None, 1),
                                               (18, [2], 0), (18, None, 0)])
def test_reductions(op, opset, axes, keep):
    if opset >= 18 and axes is not None:
        one(op, ["x", "a"], {"keepdims": keep}, [ints("a", axes)], opset=opset)
    else:
        one(op, ["x"], {"keepdims": keep, **({"axes": axes} if axes else {})}, opset=opset)


@device
def test_reduce_min_on_integers():
    one("ReduceMin", ["x"], {"axes": [1]}, dtype=I64, opset=13)


@device
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("attrs", [{}, {"axis": 1}, {"axis": -1, "keepdims": 0},
                                   {"axis": 2, "select_last_index": 1},
                                   {"axis": 0, "keepdims": 0, "select_last_index": 1}])
def test_arg_max_min_with_ties(op, attrs):
    x = RNG.choice([-1.5, 0.5, 2.0], (3, 4, 5)).astype(np.float32)  # many ties
    one(op, ["x"], attrs, out=I64, opset=13, feeds={"x": x})


# GatherElements, DepthToSpace, SpaceToDepth ------------------------------------------------------

@device
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis):
    shape, ishape = (3, 4, 5), [2, 3, 4]
    n = shape[axis]
    m = model([helper.make_node("GatherElements", ["x", "i"], ["y"], axis=axis)],
              [("x", F, shape), ("i", I64, ishape)], [("y", F, None)], 13)
    check(m, {"x": rand(shape), "i": RNG.integers(-n, n, ishape)})


@device
@pytest.mark.parametrize("attrs", [{"blocksize": 2}, {"blocksize": 2, "mode": "CRD"},
                                   {"blocksize": 3, "mode": "DCR"}])
def test_depth_to_space(attrs):
    b = attrs["blocksize"]
    one("DepthToSpace", ["x"], attrs, x_shape=(2, 2 * b * b, 3, 2), opset=13)


@device
def test_space_to_depth():
    """(The CRD mode of opset 25, which onnxruntime lacks, runs in ONNX's node cases.)"""
    one("SpaceToDepth", ["x"], {"blocksize": 2}, x_shape=(2, 3, 4, 6), opset=13)


# shape arithmetic folded at load -----------------------------------------------------------------

def _flatten_last_two(opset=13):
    """x [N, C, H, W] -> Reshape to [N, C, H * W] through Shape -> Gather -> Unsqueeze ->
    Concat (and a Mul), as exporters write it."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             ints("i0", 0), ints("i1", 1), ints("i2", 2), ints("i3", 3),
             helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
             helper.make_node("Gather", ["s", "i1"], ["c"], axis=0),
             helper.make_node("Gather", ["s", "i2"], ["h"], axis=0),
             helper.make_node("Gather", ["s", "i3"], ["w"], axis=0),
             helper.make_node("Mul", ["h", "w"], ["hw"]),
             ints("ax", [0]),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
             helper.make_node("Unsqueeze", ["c", "ax"], ["c1"]),
             helper.make_node("Unsqueeze", ["hw", "ax"], ["hw1"]),
             helper.make_node("Concat", ["n1", "c1", "hw1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    return model(nodes, [("x", F, (2, 3, 4, 5))], [("y", F, (2, 3, 20))], opset)


@device
def test_shape_chain_folds_to_a_reshape_only():
    exe = check(_flatten_last_two(), {"x": rand((2, 3, 4, 5))})
    assert [n.op for n in exe.graph.nodes] == ["reshape"]
    assert len(exe.kernels) == 1
    assert "gather" not in exe.tile and "concat" not in exe.tile


def test_shape_chain_builds_no_node_without_passes():
    g = tonnx.to_graph(_flatten_last_two())
    assert [n.op for n in g.nodes] == ["reshape"]


@device
def test_shape_gather_of_a_runtime_shape_slice():
    """Shape with start / end (opset 15), a Slice of it, and ConstantOfShape of the result."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=1, end=-1),
             helper.make_node("ConstantOfShape", ["s"], ["c"],
                              value=numpy_helper.from_array(np.array([2.0], np.float32))),
             helper.make_node("Mul", ["x", "c"], ["y"])]
    m = model(nodes, [("x", F, (3, 4, 1))], [("y", F, None)], 15)
    exe = check(m, {"x": rand((3, 4, 1))})
    assert len(exe.kernels) == 1


# a GPT-style embedding ---------------------------------------------------------------------------

@device
def test_gpt_style_embedding():
    """token ids -> Gather from the embedding matrix -> + positional embedding (Range of the
    sequence length from Shape, Gather) -> LayerNormalization."""
    vocab, dim, seq = 50, 16, 7
    wte = RNG.standard_normal((vocab, dim)).astype(np.float32)
    wpe = RNG.standard_normal((32, dim)).astype(np.float32)
    gamma = RNG.uniform(0.5, 1.5, dim).astype(np.float32)
    beta = RNG.uniform(-0.5, 0.5, dim).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in
             ((wte, "wte"), (wpe, "wpe"), (gamma, "g"), (beta, "b"))]
    nodes = [helper.make_node("Gather", ["wte", "ids"], ["tok"]),
             helper.make_node("Shape", ["ids"], ["s"]),
             ints("one", 1), ints("zero", 0), ints("step", 1),
             helper.make_node("Gather", ["s", "one"], ["t"]),
             helper.make_node("Range", ["zero", "t", "step"], ["pos"]),
             ints("ax", [0]),
             helper.make_node("Unsqueeze", ["pos", "ax"], ["pos2"]),
             helper.make_node("Gather", ["wpe", "pos2"], ["pe"]),
             helper.make_node("Add", ["tok", "pe"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "g", "b"], ["y"], axis=-1,
                              epsilon=1e-5)]
    graph = helper.make_graph(nodes, "gpt", [helper.make_tensor_value_info("ids", I64,
                                                                           (2, seq))],
                              [helper.make_tensor_value_info("y", F, None)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    ids = RNG.integers(0, vocab, (2, seq))
    exe = check(m, {"ids": ids}, rtol=1e-4, atol=1e-4)
    # The positions are folded: the position embedding is a gather of constants, folded too.
    assert "pos" not in {n.op for n in exe.graph.nodes}
    assert "gather" in {n.op for n in exe.graph.nodes}


# errors ------------------------------------------------------------------------------------------

def test_unsupported_ops_still_listed_together():
    m = model([helper.make_node("NonZero", ["x"], ["n"]),
               helper.make_node("TopK", ["x", "k"], ["v", "i"]),
               helper.make_node("Shape", ["x"], ["y"])],
              [("x", F, (3,)), ("k", I64, (1,))], [("y", I64, None)], 13)
    with pytest.raises(TileError, match=r"does not support: NonZero, TopK \(supported:"):
        tonnx.load(m)


def test_pad_wrap_mode_is_refused():
    m = model([ints("p", [1, 1]), helper.make_node("Pad", ["x", "p"], ["y"], mode="wrap")],
              [("x", F, (3,))], [("y", F, None)], 19)
    with pytest.raises(TileError, match=r"\(Pad\): attribute mode='wrap' is not supported"):
        tonnx.load(m)


# ONNX's node cases -------------------------------------------------------------------------------

# The node-case modules of these ops; tests/onnx/test_onnx.py imports them before collecting its
# node cases, which run there.
CASE_MODULES = ("shape", "gather", "squeeze", "unsqueeze", "cast", "slice", "expand",
                "constantofshape", "rangeop", "split", "tile", "pad", "reducemin", "reduceprod",
                "reducel2", "argmax", "argmin", "gatherelements", "depthtospace",
                "spacetodepth", "size", "castlike",
                # expanded (function body) cases these ops make supported
                "blackmanwindow", "causal_conv_with_state", "celu", "center_crop_pad",
                "hammingwindow", "hannwindow", "negativeloglikelihoodloss",
                "reduce_log_sum_exp", "rotaryembedding", "swish", "shrink", "softsign",
                "thresholdedrelu", "flexattention")
# Node cases of these ops refused on purpose: element types tilec has no storage for (bfloat16,
# float8, 2- and 4-bit, strings), pads or a Range limit computed from data at run time (the
# window functions' and CenterCropPad's function bodies), and Pad's wrap mode.
_TYPE_REFUSED = """
test_cast_BFLOAT16_to_FLOAT BFLOAT16
test_cast_FLOAT16_to_FLOAT4E2M1 FLOAT4E2M1
test_cast_FLOAT16_to_FLOAT8E4M3FN FLOAT8E4M3FN
test_cast_FLOAT16_to_FLOAT8E4M3FNUZ FLOAT8E4M3FNUZ
test_cast_FLOAT16_to_FLOAT8E5M2 FLOAT8E5M2
test_cast_FLOAT16_to_FLOAT8E5M2FNUZ FLOAT8E5M2FNUZ
test_cast_FLOAT16_to_INT2 INT2
test_cast_FLOAT16_to_INT4 INT4
test_cast_FLOAT16_to_UINT2 UINT2
test_cast_FLOAT16_to_UINT4 UINT4
test_cast_FLOAT4E2M1_to_FLOAT FLOAT4E2M1
test_cast_FLOAT4E2M1_to_FLOAT16 FLOAT4E2M1
test_cast_FLOAT8E4M3FNUZ_to_FLOAT FLOAT8E4M3FNUZ
test_cast_FLOAT8E4M3FNUZ_to_FLOAT16 FLOAT8E4M3FNUZ
test_cast_FLOAT8E4M3FN_to_FLOAT FLOAT8E4M3FN
test_cast_FLOAT8E4M3FN_to_FLOAT16 FLOAT8E4M3FN
test_cast_FLOAT8E5M2FNUZ_to_FLOAT FLOAT8E5M2FNUZ
test_cast_FLOAT8E5M2FNUZ_to_FLOAT16 FLOAT8E5M2FNUZ
test_cast_FLOAT8E5M2_to_FLOAT FLOAT8E5M2
test_cast_FLOAT8E5M2_to_FLOAT16 FLOAT8E5M2
test_cast_FLOAT_to_BFLOAT16 BFLOAT16
test_cast_FLOAT_to_FLOAT4E2M1 FLOAT4E2M1
test_cast_FLOAT_to_FLOAT8E4M3FN FLOAT8E4M3FN
test_cast_FLOAT_to_FLOAT8E4M3FNUZ FLOAT8E4M3FNUZ
test_cast_FLOAT_to_FLOAT8E5M2 FLOAT8E5M2
test_cast_FLOAT_to_FLOAT8E5M2FNUZ FLOAT8E5M2FNUZ
test_cast_FLOAT_to_INT2 INT2
test_cast_FLOAT_to_INT4 INT4
test_cast_FLOAT_to_UINT2 UINT2
test_cast_FLOAT_to_UINT4 UINT4
test_cast_INT2_to_FLOAT INT2
test_cast_INT2_to_FLOAT16 INT2
test_cast_INT2_to_INT8 INT2
test_cast_INT4_to_FLOAT INT4
test_cast_INT4_to_FLOAT16 INT4
test_cast_INT4_to_INT8 INT4
test_cast_UINT2_to_FLOAT UINT2
test_cast_UINT2_to_FLOAT16 UINT2
test_cast_UINT2_to_UINT8 UINT2
test_cast_UINT4_to_FLOAT UINT4
test_cast_UINT4_to_FLOAT16 UINT4
test_cast_UINT4_to_UINT8 UINT4
test_cast_e8m0_FLOAT16_to_FLOAT8E8M0 FLOAT8E8M0
test_cast_e8m0_FLOAT8E8M0_to_FLOAT FLOAT8E8M0
test_cast_e8m0_FLOAT8E8M0_to_FLOAT16 FLOAT8E8M0
test_cast_e8m0_FLOAT_to_FLOAT8E8M0 FLOAT8E8M0
test_cast_no_saturate_FLOAT16_to_FLOAT8E4M3FN FLOAT8E4M3FN
test_cast_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ FLOAT8E4M3FNUZ
test_cast_no_saturate_FLOAT16_to_FLOAT8E5M2 FLOAT8E5M2
test_cast_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ FLOAT8E5M2FNUZ
test_cast_no_saturate_FLOAT_to_FLOAT8E4M3FN FLOAT8E4M3FN
test_cast_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ FLOAT8E4M3FNUZ
test_cast_no_saturate_FLOAT_to_FLOAT8E5M2 FLOAT8E5M2
test_cast_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ FLOAT8E5M2FNUZ
test_castlike_BFLOAT16_to_FLOAT BFLOAT16
test_castlike_BFLOAT16_to_FLOAT_expanded BFLOAT16
test_castlike_FLOAT16_to_FLOAT4E2M1 FLOAT4E2M1
test_castlike_FLOAT16_to_FLOAT4E2M1_expanded FLOAT4E2M1
test_castlike_FLOAT16_to_FLOAT8E4M3FN FLOAT8E4M3FN
test_castlike_FLOAT16_to_FLOAT8E4M3FNUZ FLOAT8E4M3FNUZ
test_castlike_FLOAT16_to_FLOAT8E4M3FNUZ_expanded FLOAT8E4M3FNUZ
test_castlike_FLOAT16_to_FLOAT8E4M3FN_expanded FLOAT8E4M3FN
test_castlike_FLOAT16_to_FLOAT8E5M2 FLOAT8E5M2
test_castlike_FLOAT16_to_FLOAT8E5M2FNUZ FLOAT8E5M2FNUZ
test_castlike_FLOAT16_to_FLOAT8E5M2FNUZ_expanded FLOAT8E5M2FNUZ
test_castlike_FLOAT16_to_FLOAT8E5M2_expanded FLOAT8E5M2
test_castlike_FLOAT16_to_INT2 INT2
test_castlike_FLOAT16_to_INT2_expanded INT2
test_castlike_FLOAT16_to_INT4 INT4
test_castlike_FLOAT16_to_INT4_expanded INT4
test_castlike_FLOAT16_to_UINT2 UINT2
test_castlike_FLOAT16_to_UINT2_expanded UINT2
test_castlike_FLOAT16_to_UINT4 UINT4
test_castlike_FLOAT16_to_UINT4_expanded UINT4
test_castlike_FLOAT4E2M1_to_FLOAT FLOAT4E2M1
test_castlike_FLOAT4E2M1_to_FLOAT16 FLOAT4E2M1
test_castlike_FLOAT4E2M1_to_FLOAT16_expanded FLOAT4E2M1
test_castlike_FLOAT4E2M1_to_FLOAT_expanded FLOAT4E2M1
test_castlike_FLOAT8E4M3FNUZ_to_FLOAT FLOAT8E4M3FNUZ
test_castlike_FLOAT8E4M3FNUZ_to_FLOAT16 FLOAT8E4M3FNUZ
test_castlike_FLOAT8E4M3FNUZ_to_FLOAT16_expanded FLOAT8E4M3FNUZ
test_castlike_FLOAT8E4M3FNUZ_to_FLOAT_expanded FLOAT8E4M3FNUZ
test_castlike_FLOAT8E4M3FN_to_FLOAT FLOAT8E4M3FN
test_castlike_FLOAT8E4M3FN_to_FLOAT16 FLOAT8E4M3FN
test_castlike_FLOAT8E4M3FN_to_FLOAT16_expanded FLOAT8E4M3FN
test_castlike_FLOAT8E4M3FN_to_FLOAT_expanded FLOAT8E4M3FN
test_castlike_FLOAT8E5M2FNUZ_to_FLOAT FLOAT8E5M2FNUZ
test_castlike_FLOAT8E5M2FNUZ_to_FLOAT16 FLOAT8E5M2FNUZ
test_castlike_FLOAT8E5M2FNUZ_to_FLOAT16_expanded FLOAT8E5M2FNUZ
test_castlike_FLOAT8E5M2FNUZ_to_FLOAT_expanded FLOAT8E5M2FNUZ
test_castlike_FLOAT8E5M2_to_FLOAT FLOAT8E5M2
test_castlike_FLOAT8E5M2_to_FLOAT16 FLOAT8E5M2
test_castlike_FLOAT8E5M2_to_FLOAT16_expanded FLOAT8E5M2
test_castlike_FLOAT8E5M2_to_FLOAT_expanded FLOAT8E5M2
test_castlike_FLOAT_to_BFLOAT16 BFLOAT16
test_castlike_FLOAT_to_BFLOAT16_expanded BFLOAT16
test_castlike_FLOAT_to_FLOAT4E2M1 FLOAT4E2M1
test_castlike_FLOAT_to_FLOAT4E2M1_expanded FLOAT4E2M1
test_castlike_FLOAT_to_FLOAT8E4M3FN FLOAT8E4M3FN
test_castlike_FLOAT_to_FLOAT8E4M3FNUZ FLOAT8E4M3FNUZ
test_castlike_FLOAT_to_FLOAT8E4M3FNUZ_expanded FLOAT8E4M3FNUZ
test_castlike_FLOAT_to_FLOAT8E4M3FN_expanded FLOAT8E4M3FN
test_castlike_FLOAT_to_FLOAT8E5M2 FLOAT8E5M2
test_castlike_FLOAT_to_FLOAT8E5M2FNUZ FLOAT8E5M2FNUZ
test_castlike_FLOAT_to_FLOAT8E5M2FNUZ_expanded FLOAT8E5M2FNUZ
test_castlike_FLOAT_to_FLOAT8E5M2_expanded FLOAT8E5M2
test_castlike_FLOAT_to_INT2 INT2
test_castlike_FLOAT_to_INT2_expanded INT2
test_castlike_FLOAT_to_INT4 INT4
test_castlike_FLOAT_to_INT4_expanded INT4
test_castlike_FLOAT_to_UINT2 UINT2
test_castlike_FLOAT_to_UINT2_expanded UINT2
test_castlike_FLOAT_to_UINT4 UINT4
test_castlike_FLOAT_to_UINT4_expanded UINT4
test_castlike_INT2_to_FLOAT INT2
test_castlike_INT2_to_FLOAT16 INT2
test_castlike_INT2_to_FLOAT16_expanded INT2
test_castlike_INT2_to_FLOAT_expanded INT2
test_castlike_INT2_to_INT8 INT2
test_castlike_INT2_to_INT8_expanded INT2
test_castlike_INT4_to_FLOAT INT4
test_castlike_INT4_to_FLOAT16 INT4
test_castlike_INT4_to_FLOAT16_expanded INT4
test_castlike_INT4_to_FLOAT_expanded INT4
test_castlike_INT4_to_INT8 INT4
test_castlike_INT4_to_INT8_expanded INT4
test_castlike_UINT2_to_FLOAT UINT2
test_castlike_UINT2_to_FLOAT16 UINT2
test_castlike_UINT2_to_FLOAT16_expanded UINT2
test_castlike_UINT2_to_FLOAT_expanded UINT2
test_castlike_UINT2_to_UINT8 UINT2
test_castlike_UINT2_to_UINT8_expanded UINT2
test_castlike_UINT4_to_FLOAT UINT4
test_castlike_UINT4_to_FLOAT16 UINT4
test_castlike_UINT4_to_FLOAT16_expanded UINT4
test_castlike_UINT4_to_FLOAT_expanded UINT4
test_castlike_UINT4_to_UINT8 UINT4
test_castlike_UINT4_to_UINT8_expanded UINT4
test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FN FLOAT8E4M3FN
test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ FLOAT8E4M3FNUZ
test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ_expanded FLOAT8E4M3FNUZ
test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FN_expanded FLOAT8E4M3FN
test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2 FLOAT8E5M2
test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ FLOAT8E5M2FNUZ
test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ_expanded FLOAT8E5M2FNUZ
test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2_expanded FLOAT8E5M2
test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FN FLOAT8E4M3FN
test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ FLOAT8E4M3FNUZ
test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ_expanded FLOAT8E4M3FNUZ
test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FN_expanded FLOAT8E4M3FN
test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2 FLOAT8E5M2
test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ FLOAT8E5M2FNUZ
test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ_expanded FLOAT8E5M2FNUZ
test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2_expanded FLOAT8E5M2
test_celu_bfloat16_expanded BFLOAT16
test_range_bfloat16_type_positive_delta BFLOAT16
"""
REFUSED = {
    **{n: f"element type {t} is not supported"
       for n, t in (line.split() for line in _TYPE_REFUSED.split("\n") if line)},
    "test_blackmanwindow_expanded": "the limit must be a constant",
    "test_blackmanwindow_symmetric_expanded": "the limit must be a constant",
    "test_center_crop_pad_crop_and_pad_expanded": "the pads must be a constant",
    "test_center_crop_pad_crop_axes_chw_expanded": "the pads must be a constant",
    "test_center_crop_pad_crop_axes_hwc_expanded": "the pads must be a constant",
    "test_center_crop_pad_crop_expanded": "the pads must be a constant",
    "test_center_crop_pad_crop_negative_axes_hwc_expanded": "the pads must be a constant",
    "test_center_crop_pad_pad_expanded": "the pads must be a constant",
    "test_hammingwindow_expanded": "the limit must be a constant",
    "test_hammingwindow_symmetric_expanded": "the limit must be a constant",
    "test_hannwindow_expanded": "the limit must be a constant",
    "test_hannwindow_symmetric_expanded": "the limit must be a constant",
    "test_wrap_pad": "attribute mode='wrap' is not supported",
}


def test_int64_data_past_int32_is_refused_not_clamped():
    # Only slices' "to the end" sentinels (past 2^62) are brought into int32; a value such as
    # 2^40 used as data is refused, never changed.
    import tilec.onnx

    c = numpy_helper.from_array(np.array([2**40, 3], np.int64), "C")
    g = helper.make_graph([helper.make_node("Add", ["X", "C"], ["Y"])], "g",
                          [helper.make_tensor_value_info("X", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("Y", TensorProto.INT64, [2])], [c])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(TileError, match="does not fit in int32"):
        tilec.onnx.load(m)(X=np.array([1, 2], np.int64))
