"""ONNX ops with several outputs and empty tensors, on random inputs with the outputs poisoned:
BatchNormalization in training mode (against numpy and ONNX's reference evaluator), MaxPool's
Indices (against a numpy loop, ONNX's reference and onnxruntime), and models whose tensors have
no elements (against onnxruntime)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import tilec.onnx.importer as tonnx  # noqa: E402
from tilec.errors import TileError  # noqa: E402

from ..device import needs_device  # noqa: E402

device = needs_device
RNG = np.random.default_rng(23)


def rand(*shape):
    """Random values away from zero, either sign."""
    return (RNG.uniform(0.25, 2.0, shape) * RNG.choice([-1, 1], shape)).astype(np.float32)


def model(nodes, inputs, outputs, inits=(), opset=17):
    def info(name, dtype, shape):
        return helper.make_tensor_value_info(name, dtype, shape)

    graph = helper.make_graph(nodes, "m", [info(*i) for i in inputs],
                              [info(*o) for o in outputs], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


def ort_run(m, feed):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


# BatchNormalization, training mode ---------------------------------------------------------------

def bn_training_numpy(x, s, b, mean, var, eps, momentum):
    axes = tuple(i for i in range(x.ndim) if i != 1)
    x64 = x.astype(np.float64)
    m, v = x64.mean(axis=axes), x64.var(axis=axes)  # the population (biased) variance
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x64 - m.reshape(shape)) / np.sqrt(v.reshape(shape) + eps) * s.reshape(shape) \
        + b.reshape(shape)
    return y, mean * momentum + m * (1 - momentum), var * momentum + v * (1 - momentum)


@device
@pytest.mark.parametrize("shape, attrs", [
    ((3, 4, 5, 6), {}),
    ((6, 5), {"epsilon": 1e-2, "momentum": 0.7}),
    ((2, 3, 7), {"momentum": 0.25}),
    ((2, 2, 3, 2, 4), {"epsilon": 1e-3})])
def test_batchnorm_training_mode(shape, attrs):
    c = shape[1]
    x = rand(*shape) * 3 + 1.5
    s, b, mean = rand(c), rand(c), rand(c)
    var = RNG.uniform(0.5, 2.0, c).astype(np.float32)
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "mean", "var"],
                            ["y", "running_mean", "running_var"], training_mode=1, **attrs)
    f = TensorProto.FLOAT
    m = model([node], [("x", f, shape), ("s", f, [c]), ("b", f, [c]), ("mean", f, [c]),
                       ("var", f, [c])],
              [("y", f, shape), ("running_mean", f, [c]), ("running_var", f, [c])], opset=15)
    feed = {"x": x, "s": s, "b": b, "mean": mean, "var": var}
    got = tonnx.load(m).run(feed, poison=True)
    want = bn_training_numpy(x, s, b, mean, var, attrs.get("epsilon", 1e-5),
                             attrs.get("momentum", 0.9))
    ref = ReferenceEvaluator(m).run(None, feed)
    for name, w, r in zip(("y", "running_mean", "running_var"), want, ref, strict=True):
        assert got[name].dtype == np.float32 and got[name].shape == w.shape
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(got[name], r, rtol=1e-4, atol=1e-5, err_msg=name)


@device
def test_batchnorm_training_mode_with_only_some_outputs():
    x = rand(2, 3, 4, 4)
    params = [rand(3), rand(3), rand(3), RNG.uniform(0.5, 2, 3).astype(np.float32)]
    inits = [numpy_helper.from_array(p, n) for p, n in zip(params, "sbmv", strict=True)]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"],
                            ["y", "", "rv"], training_mode=1)
    f = TensorProto.FLOAT
    m = model([node], [("x", f, [2, 3, 4, 4])], [("y", f, None), ("rv", f, None)], inits,
              opset=15)
    got = tonnx.load(m).run({"x": x}, poison=True)
    y, _, rv = bn_training_numpy(x, *params, 1e-5, 0.9)
    np.testing.assert_allclose(got["y"], y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["rv"], rv, rtol=1e-4, atol=1e-6)


def test_batchnorm_training_outputs_before_opset_14_are_refused():
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"],
                            ["y", "rm", "rv", "sm", "sv"], name="bn9")
    f = TensorProto.FLOAT
    inits = [numpy_helper.from_array(np.ones(3, np.float32), n) for n in "sbmv"]
    m = model([node], [("x", f, [2, 3, 4])], [("y", f, None)], inits, opset=9)
    with pytest.raises(TileError, match=r"'bn9' \(BatchNormalization\): the training outputs "
                                        r"of BatchNormalization before opset 14"):
        tonnx.load(m)


# MaxPool's Indices -------------------------------------------------------------------------------

def max_pool_numpy(x, kernel, strides, pads, dilations, ceil_mode, storage_order):
    """A loop over output positions and window offsets (row-major; the first maximum wins)."""
    r = x.ndim - 2
    spatial = x.shape[2:]
    out_sp = []
    for i in range(r):
        span = spatial[i] + pads[i] + pads[r + i] - (kernel[i] - 1) * dilations[i] - 1
        o = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
        if ceil_mode and (o - 1) * strides[i] >= spatial[i] + pads[i]:
            o -= 1
        out_sp.append(o)
    y = np.zeros(x.shape[:2] + tuple(out_sp), x.dtype)
    idx = np.zeros(y.shape, np.int64)
    size = int(np.prod(spatial))
    for n, c in itertools.product(range(x.shape[0]), range(x.shape[1])):
        base = (n * x.shape[1] + c) * size
        for o in itertools.product(*(range(k) for k in out_sp)):
            best, where = None, None
            for k in itertools.product(*(range(kk) for kk in kernel)):
                p = [o[i] * strides[i] + k[i] * dilations[i] - pads[i] for i in range(r)]
                if any(q < 0 or q >= spatial[i] for i, q in enumerate(p)):
                    continue
                v = x[(n, c, *p)]
                if best is None or v > best:
                    best, where = v, p
            y[(n, c, *o)] = best
            dims = spatial if storage_order == 0 else spatial[::-1]
            digits = where if storage_order == 0 else where[::-1]
            idx[(n, c, *o)] = base + int(np.ravel_multi_index(digits, dims))
    return y, idx


POOLS = [  # x shape, attributes
    ((2, 3, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 3, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                    "storage_order": 1}),
    ((1, 2, 9, 7), {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [0, 1, 1, 0],
                    "dilations": [2, 1], "ceil_mode": 1, "storage_order": 1}),
    ((2, 2, 11), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    ((1, 2, 4, 5, 6), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2]}),
    ((1, 2, 4, 5, 6), {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2], "pads": [1, 0, 1] * 2,
                       "storage_order": 1}),
    ((1, 1, 6, 6), {"kernel_shape": [3, 3], "strides": [1, 1], "auto_pad": "SAME_UPPER",
                    "storage_order": 1}),
]


def _pool_model(shape, attrs):
    f = TensorProto.FLOAT
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)
    return model([node], [("x", f, shape)], [("y", f, None), ("i", TensorProto.INT64, None)],
                 opset=12)


def _numpy_args(shape, attrs):
    r = len(shape) - 2
    kernel = attrs["kernel_shape"]
    strides = attrs.get("strides", [1] * r)
    pads = attrs.get("pads", [0] * 2 * r)
    if attrs.get("auto_pad") == "SAME_UPPER":  # stride 1 here
        pads = [(k - 1) // 2 for k in kernel] + [k - 1 - (k - 1) // 2 for k in kernel]
    return (kernel, strides, pads, attrs.get("dilations", [1] * r), attrs.get("ceil_mode", 0),
            attrs.get("storage_order", 0))


@device
@pytest.mark.parametrize("ties", [False, True], ids=["random", "ties"])
@pytest.mark.parametrize("case", range(len(POOLS)))
def test_max_pool_indices(case, ties):
    shape, attrs = POOLS[case]
    # With ties, many windows hold the maximum more than once: the first one must win.
    x = RNG.integers(1, 4, shape).astype(np.float32) if ties else rand(*shape)
    m = _pool_model(shape, attrs)
    got = tonnx.load(m).run({"x": x}, poison=True)
    y, idx = max_pool_numpy(x, *_numpy_args(shape, attrs))
    assert got["i"].dtype == np.int64 and got["i"].shape == idx.shape
    np.testing.assert_array_equal(got["y"], y)
    np.testing.assert_array_equal(got["i"], idx)
    # The index really points at the maximum.
    np.testing.assert_array_equal(
        np.take(x.ravel() if attrs.get("storage_order", 0) == 0 else
                x.transpose(0, 1, *range(x.ndim - 1, 1, -1)).ravel(), idx), y)
    if "auto_pad" not in attrs:  # ONNX 1.2x's reference evaluator disagrees with its own
        # pads there (onnxruntime agrees with the loop: the next test)
        want = ReferenceEvaluator(m).run(None, {"x": x})
        np.testing.assert_array_equal(got["i"], want[1])


@device
@pytest.mark.parametrize("case", range(len(POOLS)))
def test_max_pool_indices_match_onnxruntime(case):
    shape, attrs = POOLS[case]
    x = rand(*shape)
    m = _pool_model(shape, attrs)
    want = ort_run(m, {"x": x})
    got = tonnx.load(m).run({"x": x}, poison=True)
    np.testing.assert_array_equal(got["y"], want[0])
    np.testing.assert_array_equal(got["i"], want[1])


@device
def test_max_pool_indices_feed_other_nodes_and_kernels_stay_few():
    """The pooled values feed another node; the indices are a node of their own that reads
    the pooled values (the maximum is computed once)."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Relu", ["y"], ["r"])]
    m = model(nodes, [("x", f, [1, 2, 6, 6])], [("r", f, None), ("i", TensorProto.INT64, None)])
    x = rand(1, 2, 6, 6)
    exe = tonnx.load(m)
    got = exe.run({"x": x}, poison=True)
    y, idx = max_pool_numpy(x, [2, 2], [2, 2], [0] * 4, [1, 1], 0, 0)
    np.testing.assert_array_equal(got["r"], np.maximum(y, 0))
    np.testing.assert_array_equal(got["i"], idx)
    assert [n.op for n in exe.graph.nodes] == ["max_pool", "max_pool_indices", "relu"]


# empty tensors through ONNX ------------------------------------------------------------------

@device
def test_model_with_empty_tensors_matches_onnxruntime():
    """An empty input reduced over its empty axis feeds a non-empty computation; other outputs
    are empty.  Compared with onnxruntime."""
    f = TensorProto.FLOAT
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    shape = numpy_helper.from_array(np.array([4, 0, 2], np.int64), "shape")
    nodes = [helper.make_node("ReduceSum", ["e", "axes"], ["s"], keepdims=0),
             helper.make_node("ReduceMax", ["e"], ["mx"], axes=[1], keepdims=0),
             helper.make_node("Add", ["s", "y"], ["a"]),
             helper.make_node("Add", ["a", "mx"], ["b"]),
             helper.make_node("Relu", ["a"], ["out"]),
             helper.make_node("Transpose", ["e"], ["t"], perm=[1, 2, 0]),
             helper.make_node("Reshape", ["e", "shape"], ["r"], allowzero=1),
             helper.make_node("Concat", ["e", "z"], ["cat"], axis=1)]
    m = model(nodes, [("e", f, [2, 0, 4]), ("y", f, [2, 4]), ("z", f, [2, 3, 4])],
              [("out", f, None), ("b", f, None), ("t", f, None), ("r", f, None),
               ("cat", f, None)], [axes, shape], opset=14)
    feed = {"e": np.zeros((2, 0, 4), np.float32), "y": rand(2, 4), "z": rand(2, 3, 4)}
    want = ort_run(m, feed)
    exe = tonnx.load(m)
    got = exe.run(feed, poison=True)
    for name, w in zip(exe.outputs, want, strict=True):
        assert got[name].shape == w.shape and got[name].dtype == w.dtype, name
        np.testing.assert_allclose(got[name], w, rtol=1e-6, err_msg=name)
    assert len(exe.kernels) >= 1
