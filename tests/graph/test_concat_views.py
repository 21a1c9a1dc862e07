"""Graph concatenations without copies (`tilec.plan.placement`): DenseNet-like blocks, where
every layer's output is placed once in the block's last concatenation and the growing
concatenations before it are views; concatenations of inputs, constants and concatenations;
all compiled on the CPU device with poisoned outputs and compared with numpy."""

from __future__ import annotations

import numpy as np
import pytest

from tilec.config import Config
from tilec.graph import ops
from tilec.graph.builder import Graph

from ..device import needs_device
from ..graph_refs import close, conv_nchw, run

pytestmark = needs_device


def rand(rng, *shape):
    return rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def dense_block(n: int, c0: int, growth: int, layers: int, hw: int, seed: int = 0,
                layout: str = "NCHW"):
    """(graph, inputs, numpy result) of a DenseNet block: per layer, scale + shift + relu of
    the concatenation of all features so far, a 1x1 conv with relu, a 3x3 conv; the block's
    result is the concatenation of all features."""
    rng = np.random.default_rng(seed)
    axis = 1 if layout == "NCHW" else 3
    g = Graph("dense")
    x = rand(rng, n, c0, hw, hw)
    xv = g.input("x", x.shape if layout == "NCHW" else x.transpose(0, 2, 3, 1).shape)
    w0 = rand(rng, c0, c0, 3, 3) * 0.3
    f0 = np.maximum(conv_nchw(x, w0, pads=(1, 1, 1, 1)), 0)

    def conv(v, w, pad):
        if layout == "NHWC":
            w = w.transpose(2, 3, 1, 0)
        return ops.conv2d(v, g.constant(w), padding=pad, layout=layout)

    def chan(a):  # a per-channel constant, broadcast over the layout's channel axis
        return a.reshape((1, -1, 1, 1) if layout == "NCHW" else (1, 1, 1, -1))

    feats_v = [ops.relu(conv(xv, w0, 1))]
    feats = [f0]
    for i in range(layers):
        c = c0 + growth * i
        s, b = rng.uniform(0.5, 1.5, c).astype(np.float32), rand(rng, c)
        w1, w2 = rand(rng, 2 * growth, c, 1, 1) * 0.3, rand(rng, growth, 2 * growth, 3, 3) * 0.3
        cat_v = ops.concat(feats_v, axis=axis) if i else feats_v[0]
        h_v = ops.relu(cat_v * g.constant(chan(s)) + g.constant(chan(b)))
        h_v = conv(ops.relu(conv(h_v, w1, 0)), w2, 1)
        feats_v.append(h_v)
        cat = np.concatenate(feats, axis=1)
        h = np.maximum(cat * s.reshape(1, -1, 1, 1) + b.reshape(1, -1, 1, 1), 0)
        feats.append(conv_nchw(np.maximum(conv_nchw(h, w1), 0), w2, pads=(1, 1, 1, 1)))
    g.output("y", ops.concat(feats_v, axis=axis))
    want = np.concatenate(feats, axis=1)
    if layout == "NHWC":
        x, want = x.transpose(0, 2, 3, 1), want.transpose(0, 2, 3, 1)
    return g, {"x": x}, want


@pytest.mark.parametrize("passes", [False, True, "channels_last"])
@pytest.mark.parametrize("n", [1, 2])
def test_dense_block(n, passes):
    g, inputs, want = dense_block(n, 6, 4, 4, 6, seed=n)
    nhwc = passes == "channels_last"
    exe, outs = run(g, inputs, passes=bool(passes), config=Config(channels_last=nhwc))
    close(outs["y"], want, rtol=1e-4, atol=1e-4)
    plan = exe.executable.plan
    # Every feature lives in the block's result; the growing concatenations are views.  Held
    # channels-last (`graph.channels_last`), the block's result is the NHWC concatenation,
    # which the output `y` transposes back.
    placed = _placed(plan)
    roots = {s.root for s in placed.values()}
    assert len(placed) == 5 + 3 and len(roots) == 1
    assert nhwc or roots == {"y"}
    assert not any(s.kind == "init" for s in exe.executable.sources)


def test_dense_block_nhwc():
    """Concatenated along the last axis: the placed features are strided."""
    g, inputs, want = dense_block(2, 5, 3, 3, 5, seed=3, layout="NHWC")
    exe, outs = run(g, inputs, passes=True)
    close(outs["y"], want, rtol=1e-4, atol=1e-4)
    assert len(_placed(exe.executable.plan)) == 4 + 2


def _placed(plan) -> dict:
    """The plan's storage but the halos' (a CPU's padded reads of computed tensors: the
    convolutions' inputs in a dense block's bottlenecks, `plan.halo`)."""
    halos = {h.root for h in plan.halos}
    return {n: s for n, s in plan.storage.items() if s.root not in halos}


def test_dense_block_kernel_count():
    """The concatenation copies are gone: one kernel a statement group, none a copy."""
    from tilec.config import Config
    from tilec.plan.fuse import plan_kernels

    g, _, _ = dense_block(1, 8, 4, 6, 6)
    # (Chains would merge the small kernels that remain: counted apart, `plan.chain`.)
    # Phase launches off: they would run the call's kernels as one (counted by sources).
    exe = g.compile(passes=True, config=Config(chains=False, phase_launches=False)).executable
    before = plan_kernels(exe.program, place_concats=False)
    after = exe.plan
    # concat of 2..7 operands: 27 copies, each with an initialisation but the first.
    assert len(before.kernels) - len(after.kernels) == sum(range(2, 8))
    assert len(exe.sources) == len(after.kernels)


def test_inputs_constants_and_nested():
    """Inputs and constants are copied into their slice, computed operands placed; a
    concatenation of a concatenation lives in the outer buffer; a concatenation that is an
    operand twice is placed once and copied once."""
    rng = np.random.default_rng(5)
    a, b, k = rand(rng, 2, 3, 5), rand(rng, 2, 4, 5), rand(rng, 2, 1, 5)
    g = Graph()
    av, bv = g.input("a", a.shape), g.input("b", b.shape)
    inner = ops.concat([ops.relu(av), g.constant(k), ops.tanh(bv)], axis=1)
    outer = ops.concat([bv, ops.sigmoid(inner), ops.sigmoid(av)], axis=1)
    g.output("y", outer + 1.0)
    g.output("z", ops.concat([inner, inner], axis=2) * 2.0)
    _, outs = run(g, {"a": a, "b": b}, passes=True)
    inner_np = np.concatenate([np.maximum(a, 0), k, np.tanh(b)], axis=1)
    sig = 1 / (1 + np.exp(-np.concatenate([inner_np, a], axis=1)))
    close(outs["y"], np.concatenate([b, sig], axis=1) + 1.0)
    close(outs["z"], np.concatenate([inner_np, inner_np], axis=2) * 2.0)


def test_concat_of_concat_in_place():
    rng = np.random.default_rng(6)
    a, b, c = rand(rng, 4, 3), rand(rng, 4, 2), rand(rng, 4, 5)
    g = Graph()
    av, bv, cv = g.input("a", a.shape), g.input("b", b.shape), g.input("c", c.shape)
    inner = ops.concat([ops.relu(av), ops.tanh(bv)], axis=1)
    g.output("y", ops.concat([ops.sigmoid(cv), inner], axis=1) * 3.0)
    exe, outs = run(g, {"a": a, "b": b, "c": c}, passes=False)
    want = np.concatenate([1 / (1 + np.exp(-c)), np.maximum(a, 0), np.tanh(b)], axis=1) * 3.0
    close(outs["y"], want)
    storage = exe.executable.plan.storage
    assert storage["relu"].offset == 5 and storage["tanh"].offset == 8


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_odd_sizes_and_axes_feeding_a_conv(axis):
    rng = np.random.default_rng(axis)
    shapes = [(3, 5, 7), (3, 5, 7), (3, 5, 7)]
    sizes = [1, 3, 2]
    parts = []
    for s, m in zip(shapes, sizes, strict=True):
        s = list(s)
        s[axis] = m
        parts.append(tuple(s))
    xs = [rand(rng, *s) for s in parts]
    g = Graph()
    vs = [ops.relu(g.input(f"x{i}", x.shape)) for i, x in enumerate(xs)]
    cat = ops.concat(vs, axis=axis)
    want_cat = np.concatenate([np.maximum(x, 0) for x in xs], axis=axis)
    # As NCHW with one image: a 3x3 conv over the concatenation.
    img = ops.reshape(cat, (1,) + tuple(want_cat.shape))
    w = rand(rng, 4, want_cat.shape[0], 3, 3)
    g.output("y", ops.conv2d(img, g.constant(w), padding=1))
    g.output("c", cat * 1.0)
    _, outs = run(g, {f"x{i}": x for i, x in enumerate(xs)}, passes=True)
    close(outs["c"], want_cat)
    close(outs["y"], conv_nchw(want_cat[None], w, pads=(1, 1, 1, 1)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["int32", "float16"])
def test_other_element_types(dtype):
    rng = np.random.default_rng(2)
    a = rng.integers(1, 30, size=(3, 4)).astype(dtype)
    b = rng.integers(-30, -1, size=(3, 2)).astype(dtype)
    g = Graph()
    av, bv = g.input("a", a.shape, dtype), g.input("b", b.shape, dtype)
    g.output("y", ops.concat([av + av, bv * bv, av * av], axis=1))
    exe, outs = run(g, {"a": a, "b": b}, passes=True)
    want = np.concatenate([a + a, b * b, a * a], axis=1)
    np.testing.assert_array_equal(outs["y"], want)
    assert exe.executable.plan.storage
