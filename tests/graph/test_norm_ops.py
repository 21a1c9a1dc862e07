"""The normalisation graph ops (`tilec.graph.ops_norm`: layer, RMS, instance and group
normalisation, log-softmax) against numpy on random inputs, run with the outputs poisoned,
with and without the passes; the row-fused form of their Tile (layer norm, RMS norm, softmax
and log-softmax are each one "row" kernel); and their errors."""

from __future__ import annotations

import numpy as np
import pytest

from tilec.errors import TileError
from tilec.graph import Graph, ops
from tilec.graph import ops_norm as N

from ..device import needs_device
from ..graph_refs import close, kinds, run

device = needs_device
RNG = np.random.default_rng(41)


def rand(*shape):
    """Random values away from zero, either sign, with an offset (a mean to take out)."""
    v = RNG.uniform(0.25, 2.0, shape) * RNG.choice([-1, 1], shape) + 0.75
    return v.astype(np.float32)


def np_layer_norm(x, axes, eps, scale=None, bias=None):
    x = x.astype(np.float64)
    m = x.mean(axis=axes, keepdims=True)
    v = ((x - m) ** 2).mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(v + eps)
    y = (x - m) * inv
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    return y, m, inv


def np_rms_norm(x, axes, eps, scale=None):
    x = x.astype(np.float64)
    y = x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + eps)
    return y if scale is None else y * scale


def np_log_softmax(x, axes):
    x = x.astype(np.float64)
    m = x.max(axis=axes, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axes, keepdims=True))


def np_group_norm(x, scale, bias, groups, eps):
    n, c = x.shape[:2]
    xg = x.reshape((n, groups, -1)).astype(np.float64)
    y = np_layer_norm(xg, (2,), eps)[0].reshape(x.shape)
    if scale.shape[0] == groups and groups != c:  # per group
        scale, bias = np.repeat(scale, c // groups), np.repeat(bias, c // groups)
    p = (c,) + (1,) * (x.ndim - 2)
    return y * scale.reshape(p) + bias.reshape(p)


SHAPES = [((5, 300), -1), ((3, 7), -1), ((2, 3, 257), -1), ((1, 1000), -1), ((4, 6, 13), 1),
          ((3, 5, 7), 0), ((2, 520), 0)]


@device
@pytest.mark.parametrize("passes", [False, True])
@pytest.mark.parametrize("shape, axis", SHAPES)
def test_layer_norm(shape, axis, passes):
    axes = tuple(range(axis % len(shape), len(shape)))
    x = rand(*shape)
    s, b = rand(*shape[axes[0]:]), rand(shape[-1])
    g = Graph()
    xv, sv = g.input("x", shape), g.input("s", s.shape)
    y, m, inv = N.layer_norm_stats(xv, sv, g.constant(b), axis=axis, epsilon=1e-3)
    g.output("y", y)
    g.output("plain", N.layer_norm(xv, axis=axis))
    g.output("mean", m)
    g.output("inv", inv)
    _, outs = run(g, {"x": x, "s": s}, passes=passes)
    want, wm, winv = np_layer_norm(x, axes, 1e-3, s, b)
    close(outs["y"], want)
    close(outs["plain"], np_layer_norm(x, axes, 1e-5)[0])
    close(outs["mean"], wm)
    close(outs["inv"], winv)


@device
@pytest.mark.parametrize("shape, axis", SHAPES)
def test_rms_norm(shape, axis):
    axes = tuple(range(axis % len(shape), len(shape)))
    x = rand(*shape)
    s = rand(shape[-1])
    g = Graph()
    xv = g.input("x", shape)
    g.output("y", N.rms_norm(xv, g.input("s", s.shape), axis=axis))
    g.output("plain", N.rms_norm(xv, axis=axis, epsilon=0.5))
    _, outs = run(g, {"x": x, "s": s}, passes=True)
    close(outs["y"], np_rms_norm(x, axes, 1e-6, s))
    close(outs["plain"], np_rms_norm(x, axes, 0.5))


@device
@pytest.mark.parametrize("shape, axes", [((5, 300), (1,)), ((3, 7), (0,)), ((2, 3, 257), (2,)),
                                         ((4, 6, 13), (1, 2)), ((2, 9, 3), (1,))])
def test_log_softmax(shape, axes):
    x = rand(*shape) * 4
    x.flat[0] = 80.0  # exp(80) overflows float32: the maximum must come out first
    g = Graph()
    xv = g.input("x", shape)
    g.output("y", N.log_softmax(xv, axes=axes) if len(axes) > 1 else
             N.log_softmax(xv, axes[0] - len(shape)))
    _, outs = run(g, {"x": x})
    close(outs["y"], np_log_softmax(x, axes))


@device
@pytest.mark.parametrize("shape", [(2, 3, 7, 9), (1, 4, 300), (3, 2, 5, 3, 2)])
@pytest.mark.parametrize("const", [False, True])
def test_instance_norm(shape, const):
    c = shape[1]
    x, s, b = rand(*shape), rand(c), rand(c)
    g = Graph()
    xv = g.input("x", shape)
    sv, bv = (g.constant(s), g.constant(b)) if const else (g.input("s", (c,)), g.input("b", (c,)))
    g.output("y", N.instance_norm(xv, sv, bv, epsilon=1e-4))
    exe, outs = run(g, {"x": x} if const else {"x": x, "s": s, "b": b}, passes=True)
    p = (c,) + (1,) * (len(shape) - 2)
    want = np_layer_norm(x, tuple(range(2, len(shape))), 1e-4)[0] * s.reshape(p) + b.reshape(p)
    close(outs["y"], want)
    if const:  # the parameters are reshaped constants: the row kernel is all
        assert kinds(exe) == ["row"]


@device
@pytest.mark.parametrize("shape, groups, per_group", [((2, 6, 7, 9), 3, False),
                                                      ((2, 6, 7, 9), 3, True),
                                                      ((1, 4, 300), 2, False),
                                                      ((3, 5, 4), 5, False), ((2, 8, 3), 1, True)])
def test_group_norm(shape, groups, per_group):
    c = shape[1]
    n = groups if per_group else c
    x, s, b = rand(*shape), rand(n), rand(n)
    g = Graph()
    g.output("y", N.group_norm(g.input("x", shape), g.constant(s), g.constant(b), groups))
    exe, outs = run(g, {"x": x}, passes=True)
    close(outs["y"], np_group_norm(x, s, b, groups, 1e-5))
    assert kinds(exe).count("row") == 1


@device
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(5, 300), (7, 13), (3, 2, 1000)])
@pytest.mark.parametrize("passes", [False, True])
def test_one_row_kernel(op, shape, passes):
    """Each is one row reduction chain: one kernel, kind "row"."""
    x = rand(*shape)
    s, b = rand(shape[-1]), rand(shape[-1])
    g = Graph()
    xv = g.input("x", shape)
    sv, bv = g.input("s", s.shape), g.constant(b)
    y = {"layer_norm": lambda: N.layer_norm(xv, sv, bv),
         "rms_norm": lambda: N.rms_norm(xv, sv),
         "softmax": lambda: ops.softmax(xv),
         "log_softmax": lambda: N.log_softmax(xv)}[op]()
    g.output("y", y)
    exe, outs = run(g, {"x": x, "s": s}, passes=passes)
    assert kinds(exe) == ["row"], exe.tile
    want = {"layer_norm": lambda: np_layer_norm(x, (-1,), 1e-5, s, b)[0],
            "rms_norm": lambda: np_rms_norm(x, (-1,), 1e-6, s),
            "softmax": lambda: np.exp(np_log_softmax(x, (-1,))),
            "log_softmax": lambda: np_log_softmax(x, (-1,))}[op]()
    close(outs["y"], want)


def test_reference_interpreter_agrees():
    """The lowered Tile's numpy reference (no device) computes the same."""
    x, s = rand(3, 11), rand(11)
    g = Graph()
    xv = g.input("x", x.shape)
    g.output("ln", N.layer_norm(xv, g.constant(s)))
    g.output("rms", N.rms_norm(xv))
    g.output("lsm", N.log_softmax(xv, 0))
    outs = g.evaluate(x=x)
    close(outs["ln"], np_layer_norm(x, (1,), 1e-5, s)[0])
    close(outs["rms"], np_rms_norm(x, (1,), 1e-6))
    close(outs["lsm"], np_log_softmax(x, (0,)))


@pytest.mark.parametrize("build, pattern", [
    (lambda g: N.layer_norm(g.input("x", (3, 4)), g.input("s", (3,))),
     r"scale of shape \[3\] does not broadcast"),
    (lambda g: N.layer_norm(g.input("x", (3, 4)), None, g.input("b", (2, 4))),
     r"bias of shape \[2, 4\] does not broadcast"),
    (lambda g: N.layer_norm(g.input("x", (3, 4), "int32")), "floating-point"),
    (lambda g: N.rms_norm(g.input("x", (3, 4)), axis=2), "axis 2 is out of range"),
    (lambda g: N.instance_norm(g.input("x", (3, 4))), r"expected \[N, C, D1, \.\.\.\]"),
    (lambda g: N.instance_norm(g.input("x", (2, 3, 4)), g.input("s", (4,))),
     r"scale has shape \[4\], expected \[3\]"),
    (lambda g: N.group_norm(g.input("x", (2, 6, 4)), None, None, 4), "4 groups do not divide"),
    (lambda g: N.group_norm(g.input("x", (2, 6, 4)), g.input("s", (4,)), None, 3),
     r"scale has shape \[4\], expected \[6\]"),
    (lambda g: N.log_softmax(g.input("x", (3, 4), "int32")), "floating-point"),
])
def test_errors(build, pattern):
    with pytest.raises(TileError, match=pattern):
        build(Graph())
