"""ONNX's normalisations and softmaxes (LayerNormalization with its Mean and InvStdDev,
RMSNormalization, InstanceNormalization, GroupNormalization opsets 18 and 21, LogSoftmax and
Softmax at every axis, old and new opsets): small models on random non-zero inputs, odd sizes
and rows longer than 256, run with the outputs poisoned and compared with onnxruntime; layer
norm, RMS norm, softmax and log-softmax each compile to one row-fused kernel; the refusals.
ONNX's own node cases of these ops run in test_onnx.py (`CASE_MODULES`)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

import tilec.onnx.importer as tonnx  # noqa: E402
from tilec.errors import TileError  # noqa: E402
from tilec.onnx.norms import NORM_CONVERTERS  # noqa: E402

from ..device import needs_device  # noqa: E402
from ..graph_refs import kinds  # noqa: E402
from ..onnx_cases import against_onnxruntime  # noqa: E402

device = needs_device
RNG = np.random.default_rng(53)
F, F16 = TensorProto.FLOAT, TensorProto.FLOAT16

# ONNX's node-case modules of these ops; test_onnx.py imports them before collecting its node
# cases.  Their expanded (function body) cases need Cast / Shape and stay unsupported.
CASE_MODULES = ("layernormalization", "rmsnormalization", "instance_normalization",
                "groupnormalization", "logsoftmax")


def rand(shape, dtype=np.float32):
    """Random values away from zero, either sign, around an offset."""
    shape = tuple(shape)
    v = RNG.uniform(0.25, 3.0, shape) * RNG.choice([-1, 1], shape) + 0.5
    return v.astype(dtype)


def model(nodes, inputs, outputs, opset=17, inits=()):
    def info(name, dtype, shape):
        return helper.make_tensor_value_info(name, dtype, shape)

    graph = helper.make_graph(nodes, "m", [info(*i) for i in inputs],
                              [info(*o) for o in outputs], list(inits))
    ir = 11 if opset >= 23 else 10 if opset >= 21 else 9 if opset > 17 else 8
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=ir)


def check(m, feed, rtol=1e-4, atol=1e-5):
    """tilec (outputs poisoned) against onnxruntime: same types, shapes and values."""
    return against_onnxruntime(m, feed, rtol, atol, scaled_atol=True)


# LayerNormalization ------------------------------------------------------------------------------

@device
@pytest.mark.parametrize("shape, axis", [((5, 300), -1), ((3, 7), 1), ((2, 3, 257), -1),
                                         ((4, 6, 13), 1), ((3, 5, 7), -3), ((1, 1000), -1),
                                         ((2, 3, 4, 5), 2)])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm(shape, axis, bias):
    norm = shape[axis % len(shape):]
    node = helper.make_node("LayerNormalization", ["x", "s"] + (["b"] if bias else []), ["y"],
                            axis=axis, epsilon=1e-3)
    inputs = [("x", F, shape), ("s", F, norm)] + ([("b", F, norm[-1:])] if bias else [])
    feed = {"x": rand(shape), "s": rand(norm)}
    if bias:
        feed["b"] = rand(norm[-1:])
    exe = check(model([node], inputs, [("y", F, shape)]), feed)
    assert kinds(exe) == ["row"], exe.tile


@device
@pytest.mark.parametrize("shape, axis", [((4, 300), -1), ((2, 3, 5), 1), ((3, 7), 0)])
def test_layer_norm_mean_and_inv_std_dev(shape, axis):
    """The optional outputs come from the same row kernel."""
    ax = axis % len(shape)
    stat = shape[:ax] + (1,) * (len(shape) - ax)
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"],
                            axis=axis)
    norm = shape[ax:]
    m = model([node], [("x", F, shape), ("s", F, norm), ("b", F, norm)],
              [("y", F, shape), ("mean", F, stat), ("inv", F, stat)])
    exe = check(m, {"x": rand(shape), "s": rand(norm), "b": rand(norm)})
    assert kinds(exe) == ["row"]


@device
def test_layer_norm_only_inv_std_dev_and_initializers():
    shape = (6, 301)
    s, b = rand(shape[-1:]), rand(shape[-1:])
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "", "inv"])
    inits = [helper.make_tensor("s", F, s.shape, s), helper.make_tensor("b", F, b.shape, b)]
    m = model([node], [("x", F, shape)], [("y", F, shape), ("inv", F, (6, 1))], inits=inits)
    exe = check(m, {"x": rand(shape)})
    assert kinds(exe) == ["row"]


@device
def test_layer_norm_float16():
    shape = (3, 300)
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"])
    m = model([node], [("x", F16, shape), ("s", F16, shape[1:]), ("b", F16, shape[1:])],
              [("y", F16, shape)])
    check(m, {"x": rand(shape, np.float16), "s": rand(shape[1:], np.float16),
              "b": rand(shape[1:], np.float16)}, rtol=1e-2, atol=1e-2)


# RMSNormalization --------------------------------------------------------------------------------

def _ort_has(op, opset):
    ort = pytest.importorskip("onnxruntime")
    m = model([helper.make_node(op, ["x", "s"], ["y"])], [("x", F, (2, 3)), ("s", F, (3,))],
              [("y", F, (2, 3))], opset)
    try:
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - any refusal means: this onnxruntime lacks the op
        return False
    return True


def np_rms_norm(x, axis, eps, s):
    axes = tuple(range(axis % x.ndim, x.ndim))
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + eps) * s


@device
@pytest.mark.parametrize("shape, axis", [((5, 300), -1), ((3, 7), 0), ((2, 3, 257), 1),
                                         ((1, 1000), -1)])
def test_rms_norm(shape, axis):
    norm = shape[axis % len(shape):]
    x, s = rand(shape), rand(norm)
    node = helper.make_node("RMSNormalization", ["x", "s"], ["y"], axis=axis, epsilon=1e-4)
    m = model([node], [("x", F, shape), ("s", F, norm)], [("y", F, shape)], 23)
    if _ort_has("RMSNormalization", 23):
        exe = check(m, {"x": x, "s": s})
    else:
        exe = tonnx.load(m)
        got = exe.run({"x": x, "s": s}, poison=True)["y"]
        np.testing.assert_allclose(got, np_rms_norm(x, axis, 1e-4, s), rtol=1e-4, atol=1e-5)
    assert kinds(exe) == ["row"]


# InstanceNormalization, GroupNormalization -------------------------------------------------------

@device
@pytest.mark.parametrize("shape", [(2, 3, 7, 9), (1, 4, 300), (3, 2, 5, 3, 2), (2, 5, 17, 19)])
@pytest.mark.parametrize("const", [False, True])
def test_instance_norm(shape, const):
    c = shape[1]
    s, b = rand((c,)), rand((c,))
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-4)
    if const:
        inits = [helper.make_tensor("s", F, s.shape, s), helper.make_tensor("b", F, b.shape, b)]
        m = model([node], [("x", F, shape)], [("y", F, shape)], inits=inits)
        exe = check(m, {"x": rand(shape)})
        assert kinds(exe) == ["row"]
    else:
        m = model([node], [("x", F, shape), ("s", F, (c,)), ("b", F, (c,))],
                  [("y", F, shape)])
        check(m, {"x": rand(shape), "s": s, "b": b})


@device
@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("shape, groups", [((2, 6, 7, 9), 3), ((1, 4, 300), 2), ((3, 5, 4), 5),
                                           ((2, 8, 3), 1), ((2, 4, 3, 2, 5), 2)])
def test_group_norm(shape, groups, opset):
    n = groups if opset < 21 else shape[1]
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=groups,
                            epsilon=1e-3)
    m = model([node], [("x", F, shape), ("s", F, (n,)), ("b", F, (n,))], [("y", F, shape)],
              opset)
    if not _ort_has_group_norm(opset):
        pytest.skip(f"this onnxruntime has no GroupNormalization-{opset}")
    exe = check(m, {"x": rand(shape), "s": rand((n,)), "b": rand((n,))})
    assert kinds(exe).count("row") == 1


def _ort_has_group_norm(opset):
    ort = pytest.importorskip("onnxruntime")
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=1)
    m = model([node], [("x", F, (1, 2, 3)), ("s", F, (1 if opset < 21 else 2,)),
                       ("b", F, (1 if opset < 21 else 2,))], [("y", F, (1, 2, 3))], opset)
    try:
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - any refusal means: this onnxruntime lacks the op
        return False
    return True


# LogSoftmax, Softmax -----------------------------------------------------------------------------

AXES = [((5, 300), None), ((3, 7), 0), ((2, 3, 257), 1), ((2, 3, 257), -1), ((4, 6, 13), 2),
        ((4, 6, 13), -3), ((1, 1000), 1), ((3, 1, 5), 1)]


@device
@pytest.mark.parametrize("op", ["LogSoftmax", "Softmax"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("shape, axis", AXES)
def test_softmaxes(op, opset, shape, axis):
    """Opset 11 sees the input as 2-D (axis 1 by default), opset 13 takes one axis (-1 by
    default); large values check that the maximum comes out first."""
    attrs = {} if axis is None else {"axis": axis}
    m = model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", F, shape)],
              [("y", F, shape)], opset)
    x = rand(shape) * 5
    x.flat[-1] = 90.0  # exp(90) is not a float32
    exe = check(m, {"x": x})
    if len(shape) == 2 or axis in (-1, len(shape) - 1):
        assert kinds(exe) == ["row"]


# refusals ----------------------------------------------------------------------------------------

def _refused(node, inputs, outputs, opset, pattern):
    with pytest.raises(TileError, match=pattern):
        tonnx.load(model([node], inputs, outputs, opset))


def test_layer_norm_refusals():
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y"])
    _refused(node, [("x", F, (2, 3)), ("s", F, (3,))], [("y", F, (2, 3))], 16,
             "exists from opset 17 on")
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y"], stash_type=11)
    _refused(node, [("x", F, (2, 3)), ("s", F, (3,))], [("y", F, (2, 3))], 17,
             "attribute stash_type=11 is not supported")
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y"])
    _refused(node, [("x", F, (2, 3)), ("s", F, (2,))], [("y", F, (2, 3))], 17,
             r"scale of shape \[2\] does not broadcast")
    _refused(node, [("x", TensorProto.INT32, (2, 3)), ("s", TensorProto.INT32, (3,))],
             [("y", TensorProto.INT32, (2, 3))], 17, "only floating-point")


def test_group_norm_refusals():
    def gn(**attrs):
        return helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], **attrs)

    x = ("x", F, (2, 6, 5))
    y = [("y", F, (2, 6, 5))]
    _refused(gn(num_groups=3), [x, ("s", F, (6,)), ("b", F, (6,))], y, 18,
             r"scale has shape \[6\]; opset 18 expects \[3\]")
    _refused(gn(num_groups=3), [x, ("s", F, (3,)), ("b", F, (3,))], y, 21,
             r"scale has shape \[3\]; opset 21 expects \[6\]")
    _refused(gn(num_groups=4), [x, ("s", F, (6,)), ("b", F, (6,))], y, 21,
             "4 groups do not divide 6 channels")
    _refused(gn(), [x, ("s", F, (6,)), ("b", F, (6,))], y, 21, "num_groups is required")
    _refused(gn(num_groups=3), [x, ("s", F, (3,)), ("b", F, (3,))], y, 17,
             "exists from opset 18 on")


def test_rms_norm_refusal_and_instance_norm_shapes():
    node = helper.make_node("RMSNormalization", ["x", "s"], ["y"])
    _refused(node, [("x", F, (2, 3)), ("s", F, (3,))], [("y", F, (2, 3))], 22,
             "exists from opset 23 on")
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"])
    _refused(node, [("x", F, (2, 3, 4)), ("s", F, (4,)), ("b", F, (3,))],
             [("y", F, (2, 3, 4))], 17, r"scale has shape \[4\], expected \[3\]")


def test_converters_are_registered():
    assert set(NORM_CONVERTERS) <= set(tonnx.SUPPORTED_OPS)
