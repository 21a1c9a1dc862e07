"""The builder API: every op compiled on the CPU device (outputs poisoned) against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import tilec
from tilec.errors import TileError
from tilec.graph import ops
from tilec.graph.builder import Graph

from ..device import needs_device
from ..graph_refs import close, conv_nchw, pool_nchw, run, sigmoid, softmax

device = needs_device
RNG = np.random.default_rng(7)


def rand(*shape):
    return RNG.uniform(-1.0, 1.0, size=shape).astype(np.float32)


# conv2d ----------------------------------------------------------------------------------------

CONVS = {  # name: (x shape, w shape, kwargs, pads as (top, left, bottom, right))
    "same": ((2, 3, 9, 7), (5, 3, 3, 3), {"padding": "same"}, (1, 1, 1, 1)),
    "valid_stride2": ((1, 4, 11, 9), (6, 4, 3, 2), {"stride": 2}, (0, 0, 0, 0)),
    "asym_pads_dilated": ((1, 2, 10, 10), (3, 2, 3, 3),
                          {"padding": (1, 0, 2, 1), "dilation": 2}, (1, 0, 2, 1)),
    "groups": ((1, 6, 8, 8), (4, 3, 3, 3), {"groups": 2, "padding": 1}, (1, 1, 1, 1)),
    "depthwise": ((2, 5, 7, 7), (5, 1, 3, 3), {"groups": 5, "padding": 1, "stride": 2},
                  (1, 1, 1, 1)),
    "depthwise_multiplier": ((1, 3, 6, 6), (6, 1, 3, 3), {"groups": 3}, (0, 0, 0, 0)),
}


@device
@pytest.mark.parametrize("name", sorted(CONVS))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv2d(name, layout):
    xs, ws, kw, pads = CONVS[name]
    x, w, b = rand(*xs), rand(*ws), rand(ws[0])
    want = conv_nchw(x, w, b, stride=(kw.get("stride", 1),) * 2, pads=pads,
                     dil=(kw.get("dilation", 1),) * 2, groups=kw.get("groups", 1))
    g = Graph("conv")
    if layout == "NHWC":  # data N,H,W,C and weights H,W,I/groups,O
        x, w = x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0)
        want = want.transpose(0, 2, 3, 1)
    xi = g.input("x", x.shape)
    g.output("y", ops.conv2d(xi, g.constant(w), g.constant(b), layout=layout, **kw))
    _, outs = run(g, {"x": x})
    close(outs["y"], want)


def test_conv_checks_its_operands():
    g = Graph()
    x = g.input("x", (1, 4, 8, 8))
    with pytest.raises(TileError, match="groups"):
        ops.conv2d(x, g.constant(np.ones((4, 3, 3, 3))), groups=1)
    with pytest.raises(TileError, match="bias"):
        ops.conv2d(x, g.constant(np.ones((4, 4, 3, 3))), g.constant(np.ones(3)))
    with pytest.raises(TileError, match="padding"):
        ops.conv2d(x, g.constant(np.ones((4, 4, 3, 3))), padding="full")


# matrix products ------------------------------------------------------------------------------

@device
@pytest.mark.parametrize("sa, sb", [((5, 7), (7, 3)), ((2, 1, 4, 6), (3, 6, 5)),
                                    ((6,), (2, 6, 4)), ((3, 4, 6), (6,)), ((8,), (8,))])
def test_matmul(sa, sb):
    a, b = rand(*sa), rand(*sb)
    g = Graph()
    g.output("c", ops.matmul(g.input("a", sa), g.input("b", sb)))
    _, outs = run(g, {"a": a, "b": b})
    close(outs["c"], np.matmul(a, b))


@device
@pytest.mark.parametrize("ta, tb, alpha, beta, cshape", [
    (False, False, 1.0, 1.0, (4,)), (True, False, 0.5, 2.0, (3, 4)),
    (False, True, 1.0, 0.0, (3, 1)), (True, True, 2.0, 1.0, ()), (False, False, 1.0, 1.0, None)])
def test_gemm(ta, tb, alpha, beta, cshape):
    a, b = rand(6, 3) if ta else rand(3, 6), rand(4, 6) if tb else rand(6, 4)
    g = Graph()
    c = None if cshape is None else rand(*cshape)
    cv = None if c is None else g.constant(c)
    g.output("y", ops.gemm(g.input("a", a.shape), g.input("b", b.shape), cv, alpha=alpha,
                           beta=beta, trans_a=ta, trans_b=tb))
    _, outs = run(g, {"a": a, "b": b})
    want = alpha * ((a.T if ta else a) @ (b.T if tb else b))
    close(outs["y"], want + (0 if c is None else beta * c))


# normalisation, activations, elementwise ------------------------------------------------------

@device
def test_batchnorm_with_runtime_statistics():
    x = rand(2, 4, 5, 3)
    scale, bias, mean = rand(4), rand(4), rand(4)
    var = RNG.uniform(0.5, 2.0, 4).astype(np.float32)
    g = Graph()
    vals = [g.input(k, a.shape) for k, a in
            (("x", x), ("s", scale), ("b", bias), ("m", mean), ("v", var))]
    g.output("y", ops.batchnorm(*vals, epsilon=1e-3))
    _, outs = run(g, {"x": x, "s": scale, "b": bias, "m": mean, "v": var})
    r = (slice(None), None, None)
    close(outs["y"], (x - mean[r]) / np.sqrt(var[r] + 1e-3) * scale[r] + bias[r])


@device
def test_activations_and_broadcasting_in_one_graph():
    x, y, z = rand(3, 4, 5), rand(4, 1), rand(5)
    lo = np.float32(-0.3)
    g = Graph()
    xv, yv, zv, lov = g.input("x", x.shape), g.input("y", y.shape), g.input("z", z.shape), \
        g.input("lo", ())
    outs_v = {
        "relu": ops.relu(xv), "relu6": ops.relu6(xv * 8.0), "leaky": ops.leaky_relu(xv, 0.2),
        "sigmoid": ops.sigmoid(xv), "tanh": ops.tanh(xv), "clip": ops.clip(xv, -0.5, 0.25),
        "clip_t": ops.clip(xv, lov, None), "add": xv + yv, "sub": zv - xv, "mul": 2.0 * xv * zv,
        "div": ops.div(xv, ops.add(ops.relu(zv), 1.5)), "rdiv": 1.0 / (yv + 2.0), "neg": -xv,
    }
    for k, v in outs_v.items():
        g.output(k, v)
    _, outs = run(g, {"x": x, "y": y, "z": z, "lo": lo})
    want = {
        "relu": np.maximum(x, 0), "relu6": np.clip(x * 8, 0, 6), "sigmoid": sigmoid(x),
        "leaky": np.where(x > 0, x, 0.2 * x), "tanh": np.tanh(x), "clip": np.clip(x, -0.5, 0.25),
        "clip_t": np.maximum(x, lo), "add": x + y, "sub": z - x, "mul": 2 * x * z,
        "div": x / (np.maximum(z, 0) + 1.5), "rdiv": 1 / (y + 2), "neg": -x,
    }
    for k, v in want.items():
        close(outs[k], v)


def test_elementwise_shapes_must_broadcast():
    g = Graph()
    with pytest.raises(TileError, match="do not broadcast"):
        ops.add(g.input("a", (3, 4)), g.input("b", (3,)))


# pooling, reductions, softmax --------------------------------------------------------------------

@device
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("k, s, pads, ceil, include", [
    ((2, 2), (2, 2), (0, 0, 0, 0), False, False), ((3, 3), (2, 2), (1, 1, 1, 1), False, False),
    ((3, 2), (2, 1), (1, 0, 1, 1), False, True), ((2, 2), (2, 2), (0, 0, 0, 0), True, False),
    ((3, 3), (2, 2), (1, 1, 1, 1), True, True)])
def test_pool2d(kind, k, s, pads, ceil, include):
    x = rand(2, 3, 7, 6)
    g = Graph()
    xv = g.input("x", x.shape)
    if kind == "max":
        y = ops.max_pool2d(xv, k, s, pads, ceil_mode=ceil)
    else:
        y = ops.avg_pool2d(xv, k, s, pads, ceil_mode=ceil, count_include_pad=include)
    g.output("y", y)
    _, outs = run(g, {"x": x})
    close(outs["y"], pool_nchw(x, kind, k, s, pads, ceil, include))


@device
def test_reductions_global_pools_and_softmax():
    x = rand(2, 3, 4, 5)
    g = Graph()
    xv = g.input("x", x.shape)
    g.output("sum", ops.reduce_sum(xv, (1, 3), keepdims=True))
    g.output("mean", ops.reduce_mean(xv, -1))
    g.output("max", ops.reduce_max(xv))
    g.output("gap", ops.global_avg_pool(xv))
    g.output("gmp", ops.global_max_pool(xv))
    g.output("sm", ops.softmax(xv, 1))
    g.output("sm2", ops.softmax(xv, axes=(2, 3)))
    _, outs = run(g, {"x": x})
    close(outs["sum"], x.sum(axis=(1, 3), keepdims=True))
    close(outs["mean"], x.mean(axis=-1))
    close(outs["max"], x.max())
    close(outs["gap"], x.mean(axis=(2, 3), keepdims=True))
    close(outs["gmp"], x.max(axis=(2, 3), keepdims=True))
    close(outs["sm"], softmax(x, 1))
    close(outs["sm2"], softmax(x, (2, 3)))


# layout -----------------------------------------------------------------------------------------

@device
def test_reshape_flatten_transpose_concat():
    x, y = rand(2, 3, 4), rand(2, 5, 4)
    g = Graph()
    xv, yv = g.input("x", x.shape), g.input("y", y.shape)
    g.output("flat", ops.flatten(xv))
    g.output("split", ops.reshape(xv, (2, 3, 2, 2)))
    g.output("merge", ops.reshape(xv, (6, -1)))
    g.output("no_refinement", ops.reshape(xv, (4, 6)))  # 24 = 3*8 = 4*6: through a flat copy
    g.output("t", ops.transpose(xv, (2, 0, 1)))
    g.output("cat", ops.concat([xv, yv, xv], axis=1))
    exe, outs = run(g, {"x": x, "y": y})
    close(outs["flat"], x.reshape(2, 12))
    close(outs["split"], x.reshape(2, 3, 2, 2))
    close(outs["merge"], x.reshape(6, 4))
    close(outs["no_refinement"], x.reshape(4, 6))
    close(outs["t"], x.transpose(2, 0, 1))
    close(outs["cat"], np.concatenate([x, y, x], axis=1))
    assert "flat_flat" not in exe.tile  # a refinement needs no staging tensor
    assert "no_refinement_flat" in exe.tile


def test_reshape_checks_sizes():
    g = Graph()
    x = g.input("x", (2, 3))
    with pytest.raises(TileError, match="6 elements"):
        ops.reshape(x, (4, 2))
    with pytest.raises(TileError, match="permutation"):
        ops.transpose(x, (0, 0))
    with pytest.raises(TileError, match="differ outside axis"):
        ops.concat([x, g.input("y", (3, 3))], axis=1)


# the graph itself --------------------------------------------------------------------------------

def test_to_tile_is_a_tile_program_with_constants_as_inputs():
    g = Graph("tiny")
    x = g.input("x", (1, 2, 4, 4))
    w = g.constant(np.ones((3, 2, 3, 3), np.float32), "weights")
    g.output("y", ops.relu(ops.conv2d(x, w, padding=1)))
    text = g.to_tile()
    assert text.splitlines()[1].startswith("function (x[1, 2, 4, 4], weights[3, 2, 3, 3])")
    program = tilec.check_program(text, {"x": (1, 2, 4, 4), "weights": (3, 2, 3, 3)})
    assert program.outputs == ("y",)
    assert "conv(x, weights)" in str(g)


@device
def test_outputs_that_are_inputs_constants_or_repeated_and_odd_names():
    g = Graph("names")
    x = g.input("input:0", (3,))
    c = g.constant(np.arange(3, dtype=np.float32), "1")
    s = x + c
    g.output("same", x)
    g.output("const", c)
    g.output("sum", s)
    g.output("sum again", s)
    exe, outs = run(g, {"input:0": np.ones(3, np.float32)})
    close(outs["same"], np.ones(3))
    close(outs["const"], np.arange(3))
    close(outs["sum"], 1 + np.arange(3))
    close(outs["sum again"], 1 + np.arange(3))
    with pytest.raises(TileError, match="no array given for input input:0"):
        exe()
    with pytest.raises(TileError, match="unknown input z"):
        exe.run({"input:0": np.ones(3), "z": np.ones(1)})


@device
def test_integer_graph_and_reference_agree():
    a = RNG.integers(-9, 9, size=(4, 5)).astype(np.int32)
    g = Graph()
    av = g.input("a", a.shape, "int32")
    g.output("y", ops.relu(av * 3 - 4) + ops.reduce_sum(av, 1, keepdims=True))
    exe, outs = run(g, {"a": a})
    want = np.maximum(a * 3 - 4, 0) + a.sum(1, keepdims=True)
    np.testing.assert_array_equal(outs["y"], want)
    np.testing.assert_array_equal(g.evaluate(a=a)["y"], want)
    assert exe.executable.program.tensors[exe.program.outputs["y"]].dtype == "int32"


def test_values_from_two_graphs_do_not_mix():
    g1, g2 = Graph("one"), Graph("two")
    with pytest.raises(TileError, match="another graph"):
        ops.add(g1.input("a", (2,)), g2.input("b", (2,)))
    with pytest.raises(TileError, match="must not be negative"):
        g1.input("c", (-1, 2))
    with pytest.raises(TileError, match="already used"):
        g1.input("a", (2,))
