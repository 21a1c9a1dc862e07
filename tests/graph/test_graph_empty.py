"""Tensors with no elements (`tilec.graph.empty`): no kernel reads or writes one; reductions over an
empty set give their identity; empty outputs come back with their shapes and types.  Non-empty
results are computed on the CPU device with their buffers poisoned and compared with numpy."""

from __future__ import annotations

import numpy as np
import pytest

import tilec
from tilec.errors import TileError
from tilec.graph import ops
from tilec.graph.builder import Graph
from tilec.graph.empty import eliminate_empty, has_empty

from ..device import needs_device
from ..graph_refs import close

device = needs_device
RNG = np.random.default_rng(11)


def rand(*shape):
    return RNG.uniform(0.5, 2.0, size=shape).astype(np.float32) * RNG.choice([-1, 1], shape)


def run(g, arrays, passes):
    exe = g.compile(passes=passes)
    return exe, exe.run(arrays, poison=True)


@device
@pytest.mark.parametrize("passes", [False, True])
def test_reductions_over_an_empty_axis_are_their_identity(passes):
    g = Graph("empty_reduce")
    x = g.input("x", (2, 0, 4))
    y = g.input("y", (2, 4))
    g.output("sum", ops.reduce_sum(x, 1, keepdims=True))
    g.output("max", ops.reduce_max(x, [1]))
    g.output("mean", ops.reduce_mean(x, 1))
    g.output("sum_sq", ops.reduce_sum(x * x, 1))
    g.output("sum_all", ops.reduce_sum(x))  # a scalar
    g.output("kept_empty", ops.reduce_sum(x, 2, keepdims=True))  # [2, 0, 1]: no elements
    # A non-empty computation that reads a reduction of the empty tensor.
    g.output("z", ops.relu(y + ops.reduce_sum(x, 1)) * 2.0)
    yv = rand(2, 4)
    exe, outs = run(g, {"x": np.zeros((2, 0, 4), np.float32), "y": yv}, passes)
    np.testing.assert_array_equal(outs["sum"], np.zeros((2, 1, 4), np.float32))
    np.testing.assert_array_equal(outs["max"], np.full((2, 4), -np.inf, np.float32))
    assert outs["mean"].shape == (2, 4) and np.isnan(outs["mean"]).all()
    np.testing.assert_array_equal(outs["sum_sq"], np.zeros((2, 4), np.float32))
    assert outs["sum_all"].shape == () and outs["sum_all"] == 0
    assert outs["kept_empty"].shape == (2, 0, 1) and outs["kept_empty"].dtype == np.float32
    close(outs["z"], np.maximum(yv, 0) * 2)
    assert list(outs) == ["sum", "max", "mean", "sum_sq", "sum_all", "kept_empty", "z"]
    # No Tile tensor has a zero size; the empty input is not a kernel input.
    assert "x" not in exe.program.inputs and exe.program.empty_inputs == {"x": (2, 0, 4)}
    assert exe.program.empty_outputs == {"kept_empty": ((2, 0, 1), "float32")}
    ref = g.evaluate(x=np.zeros((2, 0, 4), np.float32), y=yv)
    close(ref["z"], np.maximum(yv, 0) * 2)
    assert ref["kept_empty"].shape == (2, 0, 1)


@device
def test_integer_and_bool_identities():
    g = Graph()
    a = g.input("a", (0, 3), "int32")
    b = g.input("b", (3, 0), "bool")
    g.output("imax", ops.reduce_max(a, 0))
    g.output("isum", ops.reduce_sum(a, 0))
    g.output("bmax", ops.reduce_max(b, 1))
    _, outs = run(g, {"a": np.zeros((0, 3), np.int32), "b": np.zeros((3, 0), bool)}, True)
    np.testing.assert_array_equal(outs["imax"], np.full(3, np.iinfo(np.int32).min))
    np.testing.assert_array_equal(outs["isum"], np.zeros(3, np.int32))
    assert outs["bmax"].dtype == np.bool_ and not outs["bmax"].any()


@device
@pytest.mark.parametrize("passes", [False, True])
def test_every_output_empty_needs_no_kernel(passes):
    g = Graph("all_empty")
    x = g.input("x", (0, 3, 4))
    g.output("r", ops.reshape(x, (3, 4, 0)))
    g.output("t", ops.transpose(ops.relu(x), (2, 0, 1)))
    g.output("s", ops.softmax(x, 1))
    exe, outs = run(g, {"x": np.zeros((0, 3, 4), np.float32)}, passes)
    assert exe.kernels == [] and exe.executable is None
    assert {k: v.shape for k, v in outs.items()} == {"r": (3, 4, 0), "t": (4, 0, 3),
                                                    "s": (0, 3, 4)}
    assert all(v.dtype == np.float32 for v in outs.values())
    with pytest.raises(TileError, match=r"input x: expected shape \[0, 3, 4\], got \[0, 3, 5\]"):
        exe.run({"x": np.zeros((0, 3, 5), np.float32)})
    with pytest.raises(TileError, match="no array given for input x"):
        exe.run({})


@device
@pytest.mark.parametrize("passes", [False, True])
def test_products_over_an_empty_dimension_are_zeros_plus_bias(passes):
    g = Graph("empty_k")
    a = g.input("a", (3, 0))
    b = g.input("b", (0, 4))
    c = g.input("c", (4,))
    g.output("mm", ops.matmul(a, b))
    g.output("gemm", ops.gemm(a, b, c, alpha=2.0, beta=0.5))
    cc = rand(3, 1)
    g.output("gemm_tb", ops.relu(ops.gemm(a, ops.transpose(b), g.constant(cc), trans_b=True)))
    x = g.input("x", (2, 0, 5, 5))
    w = g.constant(np.ones((3, 0, 3, 3), np.float32))
    bias = rand(3)
    g.output("conv", ops.conv2d(x, w, g.constant(bias), padding=1))
    cv = rand(4)
    _, outs = run(g, {"a": np.zeros((3, 0), np.float32), "b": np.zeros((0, 4), np.float32),
                      "c": cv, "x": np.zeros((2, 0, 5, 5), np.float32)}, passes)
    np.testing.assert_array_equal(outs["mm"], np.zeros((3, 4), np.float32))
    close(outs["gemm"], np.broadcast_to(0.5 * cv, (3, 4)))
    close(outs["gemm_tb"], np.broadcast_to(np.maximum(cc, 0), (3, 4)))
    close(outs["conv"], np.broadcast_to(bias[None, :, None, None], (2, 3, 5, 5)))


@device
@pytest.mark.parametrize("passes", [False, True])
def test_concat_drops_empty_operands(passes):
    g = Graph()
    x = g.input("x", (2, 0, 3))
    y = g.input("y", (2, 4, 3))
    z = g.input("z", (2, 1, 3))
    g.output("one", ops.concat([x, y, x], axis=1))
    g.output("two", ops.concat([y, x, z], axis=1))
    g.output("empty", ops.concat([x, x], axis=1))
    yv, zv = rand(2, 4, 3), rand(2, 1, 3)
    _, outs = run(g, {"x": np.zeros((2, 0, 3), np.float32), "y": yv, "z": zv}, passes)
    close(outs["one"], yv)
    close(outs["two"], np.concatenate([yv, zv], axis=1))
    assert outs["empty"].shape == (2, 0, 3)


@device
def test_empty_batch_through_a_cnn():
    g = Graph()
    x = g.input("x", (0, 3, 8, 8))
    w = g.constant(rand(4, 3, 3, 3))
    y = ops.relu(ops.conv2d(x, w, g.constant(rand(4)), padding="same"))
    y = ops.batchnorm(ops.max_pool2d(y, 2), *(g.constant(rand(4)) for _ in range(3)),
                      g.constant(np.abs(rand(4))))
    g.output("y", ops.softmax(ops.flatten(ops.global_avg_pool(y))))
    exe, outs = run(g, {"x": np.zeros((0, 3, 8, 8), np.float32)}, True)
    assert outs["y"].shape == (0, 4) and exe.kernels == []


def test_elimination_leaves_other_graphs_alone_and_names_what_it_cannot_do():
    g = Graph()
    x = g.input("x", (2, 3))
    g.output("y", ops.relu(x))
    assert not has_empty(g) and eliminate_empty(g) is g
    h = Graph()
    e = h.input("e", (2, 0))
    h.output("out", h.add_node("transpose", [e], (2, 2), "float32", name="bad", perm=(1, 0)))
    with pytest.raises(TileError, match=r"transpose node bad: operand e has no elements "
                                        r"\(shape \[2, 0\]\)"):
        h.to_tile()


def test_tile_programs_still_refuse_zero_sizes():
    with pytest.raises(TileError, match="sizes must be positive"):
        tilec.compile("function (A[M, K]) -> (B) { B = A; }", {"A": (0, 5)})
    g = Graph()
    x = g.input("x", (0, 5))
    with pytest.raises(TileError, match="-1 is ambiguous"):
        ops.reshape(x, (-1, 0))
    with pytest.raises(TileError, match="must not be negative"):
        ops.reshape(x, (-2, 0))


@device
def test_cli_graph_runs_and_validates_a_graph_with_empty_tensors(tmp_path, capsys):
    from tilec.cli.main import main

    script = tmp_path / "g.py"
    script.write_text(
        "import numpy as np\nimport tilec\nfrom tilec import ops\n\n"
        "def graph():\n    g = tilec.Graph('e')\n"
        "    x = g.input('x', (0, 4, 1, 1))\n    y = g.input('y', (3, 4))\n"
        "    w = g.constant(np.ones((5, 4), np.float32))\n"
        "    g.output('a', ops.gemm(ops.flatten(ops.relu(x)), w, trans_b=True))\n"
        "    g.output('b', ops.reduce_sum(x, 0))\n"
        "    g.output('c', ops.tanh(y))\n    return g\n")
    assert main(["graph", str(script), "--dump-passes", "--run"]) == 0
    assert "validation against the unoptimised graph: ok" in capsys.readouterr().out
