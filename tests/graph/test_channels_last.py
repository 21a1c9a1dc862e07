"""`channels_last`: the graph after the pass computes what it computed before (numpy reference
of both, device-free), holds its convolutions NHWC with no transposes where none is needed,
and compiled on the CPU device (outputs poisoned) matches numpy and the NCHW compile."""

from __future__ import annotations

import numpy as np
import pytest

from tilec.config import Config
from tilec.graph import ops
from tilec.graph.builder import Graph, wants_channels_last
from tilec.graph.channels_last import channels_last, has_nchw_conv

from ..device import needs_device
from ..graph_refs import close, conv_nchw, run

RNG = np.random.default_rng(5)


def rand(*shape):
    return RNG.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def fire_net():
    """conv (stride 2, the graph input read as NCHW) + bias + relu -> max pool -> squeeze 1x1
    -> two expands (1x1, padded 3x3) concatenated -> residual add with a per-channel
    constant -> depthwise 3x3 -> SE-style scale (global pool, 1x1 conv, sigmoid, broadcast
    multiply) -> global average pool -> flatten -> gemm; a second output is a 4-D NHWC
    value read back as NCHW."""
    g = Graph("fire")
    x = g.input("x", (1, 3, 17, 17))
    c = ops.relu(ops.conv2d(x, g.constant(rand(16, 3, 3, 3)), g.constant(rand(16)), stride=2))
    p = ops.max_pool2d(c, 3, stride=2, ceil_mode=True)
    s = ops.relu(ops.conv2d(p, g.constant(rand(8, 16, 1, 1)), g.constant(rand(8))))
    e1 = ops.relu(ops.conv2d(s, g.constant(rand(16, 8, 1, 1)), g.constant(rand(16))))
    e3 = ops.relu(ops.conv2d(s, g.constant(rand(16, 8, 3, 3)), g.constant(rand(16)),
                             padding=1))
    cat = ops.concat([e1, e3], axis=1)
    res = ops.add(cat, g.constant(rand(32, 1, 1)))
    dw = ops.conv2d(res, g.constant(rand(32, 1, 3, 3)), padding=1, groups=32)
    se = ops.sigmoid(ops.conv2d(ops.global_avg_pool(dw), g.constant(rand(32, 32, 1, 1))))
    scaled = ops.mul(dw, se)
    flat = ops.flatten(ops.global_avg_pool(scaled))
    g.output("y", ops.gemm(flat, g.constant(rand(5, 32)), trans_b=True))
    g.output("z", ops.softmax(scaled, axis=1))
    return g, {"x": rand(1, 3, 17, 17)}


def test_pass_keeps_the_results_and_moves_the_convolutions():
    g, arrays = fire_net()
    moved = channels_last(g)
    want = g.evaluate(**arrays)
    got = moved.evaluate(**arrays)
    for k in want:
        close(got[k], want[k])
    convs = [n for n in moved.nodes if n.op == "conv"]
    assert convs and all(n.get("layout") == "NHWC" for n in convs)
    assert convs[0].get("input_layout") == "NCHW"  # the model's input is read as it is
    assert not has_nchw_conv(moved)
    # Back to NCHW only for the outputs: the 4-D softmax output (a transpose) and the global
    # pool read by the flatten (a reshape: its spatial axes have size 1).
    kinds = sorted(n.op for n in moved.nodes if n.output.endswith("_nchw"))
    assert kinds == ["reshape", "transpose"], kinds
    assert [n.op for n in moved.nodes if n.op == "transpose"] == ["transpose"]


def test_pass_leaves_what_it_cannot_move():
    g = Graph("rest")
    x = g.input("x", (1, 4, 6, 6))
    w = g.input("w", (4, 4, 3, 3))  # weights computed at run time: the conv stays NCHW
    y = ops.conv2d(x, w, padding=1)
    g.output("y", ops.relu(y))
    assert not has_nchw_conv(g)
    assert str(channels_last(g)) == str(g)
    h = Graph("one_d")
    v = h.input("v", (1, 4, 9))
    h.output("o", ops.conv(v, h.constant(rand(2, 4, 3))))
    assert str(channels_last(h)) == str(h)


def test_elementwise_with_an_nchw_operand_and_a_reduction_without_kept_axes():
    g = Graph("mixed")
    x = g.input("x", (1, 4, 5, 5))
    other = g.input("o", (1, 4, 5, 5))
    c = ops.conv2d(x, g.constant(rand(4, 4, 1, 1)))
    s = ops.add(c, other)  # `other` is NCHW: it is transposed for the add
    g.output("m", ops.reduce_max(s, (2, 3)))  # [1, 4]: N and C keep their order
    g.output("w", ops.reduce_sum(s, (1, 3), keepdims=False))  # [1, 5]
    moved = channels_last(g)
    arrays = {"x": rand(1, 4, 5, 5), "o": rand(1, 4, 5, 5)}
    want, got = g.evaluate(**arrays), moved.evaluate(**arrays)
    for k in want:
        close(got[k], want[k])


def test_wants_channels_last():
    assert wants_channels_last(Config(channels_last=True, hw="nvidia-h100"))
    assert not wants_channels_last(Config(channels_last=False, hw="pocl-cpu"))
    assert wants_channels_last(Config(hw="pocl-cpu"))
    assert not wants_channels_last(Config(hw="nvidia-h100"))


@needs_device
@pytest.mark.parametrize("layout", [True, False])
def test_compiled_on_the_cpu_against_numpy(layout):
    g, arrays = fire_net()
    want = g.evaluate(**arrays)
    exe, outs = run(g, arrays, passes=True,
                    config=Config(device="Portable", channels_last=layout))
    for k in want:
        close(outs[k], want[k], rtol=1e-3)
    assert ("_hwio" in exe.tile) == layout


@needs_device
def test_a_large_nhwc_filter_is_read_in_panels():
    """A padded 3x3 convolution whose filter (9.4 MB) is larger than L2 reads it in contiguous
    panels of the tile's output channels (`plan.pack.choose_packing`), as the NCHW one does."""
    g = Graph("wide")
    x = g.input("x", (1, 512, 7, 7))
    w, b = rand(512, 512, 3, 3) * 0.05, rand(512)
    g.output("y", ops.relu(ops.conv2d(x, g.constant(w), g.constant(b), padding=1)))
    xs = rand(1, 512, 7, 7)
    exe, outs = run(g, {"x": xs}, passes=True,
                    config=Config(device="Portable", channels_last=True))
    close(outs["y"], np.maximum(conv_nchw(xs, w, b, pads=(1, 1, 1, 1)), 0), rtol=1e-3)
    assert any(s.name.endswith("_panels") for s in exe.executable.sources)
