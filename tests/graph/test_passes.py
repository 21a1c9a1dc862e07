"""The inference passes: the graph's structure after each one, and its numerics (compiled,
outputs poisoned) before and after each one against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from tilec.config import Config
from tilec.errors import TileError
from tilec.graph import ops, passes
from tilec.graph.builder import Graph

from ..device import needs_device
from ..graph_refs import close, conv_nchw, run, sigmoid

device = needs_device
RNG = np.random.default_rng(11)


def rand(*shape):
    return RNG.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def bn_params(c):
    return (RNG.uniform(0.5, 1.5, c).astype(np.float32), rand(c), rand(c),
            RNG.uniform(0.5, 1.5, c).astype(np.float32))


def conv_bn_relu(layout="NCHW"):
    """conv -> batch norm -> relu -> 2x2 max pool -> flatten -> gemm -> bias -> tanh, and the
    numpy result for input x."""
    x, w, b = rand(2, 3, 6, 6), rand(4, 3, 3, 3), rand(4)
    gamma, beta, mean, var = bn_params(4)
    wf, bf = rand(5, 36), rand(5)
    g = Graph("conv_bn_relu")
    nhwc = layout == "NHWC"
    xv = g.input("x", x.transpose(0, 2, 3, 1).shape if nhwc else x.shape)
    c = ops.conv2d(xv, g.constant(w.transpose(2, 3, 1, 0) if nhwc else w, "w"),
                   g.constant(b, "b"), padding=1, layout=layout)
    bn = ops.batchnorm(c, *(g.constant(p, k) for k, p in
                            (("gamma", gamma), ("beta", beta), ("mean", mean), ("var", var))),
                       axis=-1 if nhwc else 1)
    p = ops.max_pool2d(ops.relu(bn), 2, layout=layout)
    if nhwc:
        p = ops.transpose(p, (0, 3, 1, 2))
    f = ops.gemm(ops.flatten(p), g.constant(wf, "wf"), trans_b=True)
    g.output("y", ops.tanh(ops.add(f, g.constant(bf, "bf"))))
    conv = conv_nchw(x, w, b, pads=(1, 1, 1, 1))
    r = (slice(None), None, None)
    act = np.maximum((conv - mean[r]) / np.sqrt(var[r] + 1e-5) * gamma[r] + beta[r], 0)
    pooled = act.reshape(2, 4, 3, 2, 3, 2).max(axis=(3, 5))
    want = np.tanh(pooled.reshape(2, 36) @ wf.T + bf)
    return g, (x.transpose(0, 2, 3, 1) if nhwc else x), want


def ops_of(g):
    return [n.op for n in g.nodes]


@device
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_every_pass_keeps_the_numbers(layout):
    g, x, want = conv_bn_relu(layout)
    _, outs = run(g, {"x": x})
    close(outs["y"], want)
    for _, after in passes.trace(g):
        close(after.evaluate(x=x)["y"], want)
        _, outs = run(after, {"x": x})
        close(outs["y"], want)


def test_structure_after_each_pass():
    g, _, _ = conv_bn_relu()
    trace = passes.trace(g)
    assert [name for name, _ in trace] == list(passes.DEFAULT_PASSES)
    steps = [g for _, g in trace[1:]]  # from batchnorm_to_elementwise on
    assert "batchnorm" in ops_of(g)
    assert "batchnorm" not in ops_of(steps[0])
    folded = steps[1]
    assert ops_of(folded)[:4] == ["conv", "mul", "add", "relu"]
    # Only the per-channel scale and shift are left of the batch norm's statistics.
    assert {"gamma", "beta", "mean", "var"}.isdisjoint(folded.constants)
    assert {"batchnorm_scale", "batchnorm_shift"} <= set(folded.constants)
    assert ops_of(steps[3])[:2] == ["conv", "add"]  # the scale went into the weights
    assert "w_scaled" in steps[3].constants
    final = steps[-1]
    assert ops_of(final) == ["conv", "max_pool", "reshape", "gemm"]
    conv, gemm = final.nodes[0], final.nodes[3]
    assert conv.get("activation") == "relu" and len(conv.inputs) == 3
    assert gemm.get("activation") == "tanh" and len(gemm.inputs) == 3
    assert all(not final.is_constant(n.output) for n in final.nodes)
    assert set(final.constants) == set(conv.inputs[1:] + gemm.inputs[1:])
    # The source graph is untouched.
    assert "batchnorm" in ops_of(g)


@device
def test_conv_bias_relu_is_one_kernel():
    g, x, want = conv_bn_relu()
    # (Phase launches off: on a CPU they would run the call's kernels as one launch.)
    exe, outs = run(g, {"x": x}, passes=True, config=Config(phase_launches=False))
    close(outs["y"], want)
    conv_kernels = [k for k in exe.kernels if k.args[0] == "x" or "x" in k.args]
    assert len(conv_kernels) == 1
    assert conv_kernels[0].kind == "contraction"
    # The fused epilogue writes the activation; the raw accumulation never reaches memory.
    assert not any(a.endswith("_acc") for k in exe.kernels for a in k.args)


@device
def test_elementwise_chain_becomes_one_statement_and_one_kernel():
    a, b = rand(4, 6), rand(4, 6)
    g = Graph()
    av, bv = g.input("a", a.shape), g.input("b", b.shape)
    t = ops.sigmoid(ops.relu(av * bv + 0.5) - bv)
    g.output("t", ops.clip(ops.leaky_relu(t, 0.1) * av, -0.2, 0.3))
    want = np.clip(np.where((s := sigmoid(np.maximum(a * b + 0.5, 0) - b)) > 0, s, 0.1 * s) * a,
                   -0.2, 0.3)
    fused = passes.fuse_elementwise(g)
    assert ops_of(fused) == ["fused"]
    assert fused.nodes[0].inputs == ("a", "b")
    exe, outs = run(fused, {"a": a, "b": b})
    close(outs["t"], want)
    assert [k.kind for k in exe.kernels] == ["elementwise"]


def test_fusion_stops_at_outputs_and_shared_values():
    g = Graph()
    x = g.input("x", (3,))
    r = ops.relu(x)
    g.output("r", r)
    g.output("s", ops.sigmoid(r))
    shared = ops.tanh(x)
    g.output("u", shared + shared)
    out = passes.optimize(g)
    assert "relu" in ops_of(out) and "sigmoid" in ops_of(out) and "tanh" in ops_of(out)


def test_batchnorm_with_input_statistics_is_kept():
    g = Graph()
    x = g.input("x", (1, 2, 3, 3))
    stats = [g.input(k, (2,)) for k in ("s", "b", "m", "v")]
    g.output("y", ops.batchnorm(x, *stats))
    assert ops_of(passes.optimize(g)) == ["batchnorm"]


def test_dead_nodes_unused_constants_and_copies_go():
    g = Graph()
    x = g.input("x", (2, 2))
    g.constant(np.ones((2, 2)), "unused")
    ops.sigmoid(x * g.constant(np.ones((2, 2)), "only_dead"))
    y = ops.identity(ops.relu(x))
    g.output("y", ops.tanh(y))
    out = passes.eliminate_dead_nodes(g)
    assert ops_of(out) == ["relu", "tanh"]
    assert out.constants == {}
    assert out.nodes[1].inputs == (out.nodes[0].output,)


@device
def test_constant_folding_runs_the_reference():
    g = Graph()
    x = g.input("x", (2, 3))
    w = g.constant(np.arange(6, dtype=np.float32).reshape(3, 2), "w")
    scale = ops.softmax(ops.transpose(w) * 2.0, 1)  # all constant
    g.output("y", ops.matmul(x, ops.transpose(scale)))
    folded = passes.fold_constants(g)
    assert ops_of(folded) == ["matmul"]
    xv = rand(2, 3)
    want = xv @ np.exp(2 * np.arange(6.0).reshape(3, 2)) / \
        np.exp(2 * np.arange(6.0).reshape(3, 2)).sum(0)
    _, outs = run(folded, {"x": xv})
    close(outs["y"], want)


@device
def test_gemm_scale_bias_activation_fold():
    x, w, c = rand(3, 5), rand(4, 5), rand(4)
    s, t = RNG.uniform(0.5, 2, 4).astype(np.float32), rand(4)
    g = Graph()
    xv = g.input("x", x.shape)
    y = ops.gemm(xv, g.constant(w), g.constant(c), alpha=0.5, beta=2.0, trans_b=True)
    g.output("y", ops.relu6(ops.add(ops.mul(y, g.constant(s)), g.constant(t))))
    out = passes.optimize(g)
    assert ops_of(out) == ["gemm"] and out.nodes[0].get("activation") == "relu6"
    _, outs = run(out, {"x": x})
    close(outs["y"], np.clip((0.5 * x @ w.T + 2 * c) * s + t, 0, 6))


def test_unknown_pass():
    with pytest.raises(TileError, match="unknown pass 'fold'"):
        passes.trace(Graph(), ["fold"])


@device
def test_scale_bias_activation_variants_fold_into_conv_and_matmul():
    x, w = rand(1, 2, 5, 5), rand(3, 2, 3, 3)
    a, b = rand(2, 4, 6), rand(6, 5)
    t1, s2, t2 = rand(1, 3, 1, 1), rand(5), rand(5)
    g = Graph()
    xv, av = g.input("x", x.shape), g.input("a", a.shape)
    c = ops.conv2d(xv, g.constant(w), stride=2)
    g.output("c", ops.leaky_relu(ops.add(ops.mul(c, 0.5), g.constant(t1)), 0.2))
    m = ops.matmul(av, g.constant(b))
    g.output("m", ops.sigmoid(ops.add(ops.mul(m, g.constant(s2)), g.constant(t2))))
    out = passes.optimize(g)
    assert ops_of(out) == ["conv", "matmul"]
    assert [n.get("activation") for n in out.nodes] == ["leaky_relu", "sigmoid"]
    _, outs = run(out, {"x": x, "a": a})
    conv = 0.5 * conv_nchw(x, w, stride=(2, 2)) + t1
    close(outs["c"], np.where(conv > 0, conv, 0.2 * conv))
    close(outs["m"], sigmoid((a @ b) * s2 + t2))


# reshapes read in place (tilec.graph.views) --------------------------------------------------

def _head(kind):
    """A global-pool classifier head whose reshape only drops unit dimensions, and numpy's
    result: gemm (trans_b) reading a flatten, matmul reading a reshape as its left operand,
    gemm with trans_a reading a [C, 1, N] tensor as [C, N], and matmul's right operand."""
    x = rand(3, 6, 4, 5)
    g = Graph(kind)
    xv = g.input("x", x.shape)
    pooled = ops.global_avg_pool(ops.relu(xv))  # [3, 6, 1, 1], computed: not a constant
    p = np.maximum(x, 0).mean(axis=(2, 3))
    if kind == "gemm":
        w, c = rand(7, 6), rand(7)
        y = ops.gemm(ops.flatten(pooled), g.constant(w), g.constant(c), alpha=0.5, trans_b=True)
        want = 0.5 * p @ w.T + c
    elif kind == "matmul":
        w = rand(6, 7)
        y = ops.matmul(ops.reshape(pooled, (3, 6)), g.constant(w))
        want = p @ w
    elif kind == "gemm_trans_a":
        w = rand(6, 4)
        t = ops.transpose(pooled, (1, 2, 0, 3))  # [6, 1, 3, 1]
        y = ops.gemm(ops.reshape(t, (6, 3)), g.constant(w), trans_a=True)
        want = p @ w
    else:  # the right operand
        a = rand(5, 6)
        y = ops.matmul(g.constant(a), ops.reshape(ops.transpose(pooled, (1, 0, 2, 3)), (6, 3)))
        want = a @ p.T
    g.output("y", ops.tanh(y))
    return g, x, np.tanh(want)


@device
@pytest.mark.parametrize("kind", ["gemm", "matmul", "gemm_trans_a", "right_operand"])
def test_reshape_into_a_product_is_read_in_place(kind):
    g, x, want = _head(kind)
    without = [p for p in passes.DEFAULT_PASSES if p != "reshape_views"]
    # Kernel counts: one launch a kernel (chains would merge the small ones, `plan.chain`).
    one_each = Config(chains=False)
    copy_exe, copy_outs = run(g, {"x": x}, passes=without, config=one_each)
    view_exe, view_outs = run(g, {"x": x}, passes=True, config=one_each)
    close(copy_outs["y"], want)
    close(view_outs["y"], want)
    assert "reshape" in ops_of(copy_exe.graph) and "reshape" not in ops_of(view_exe.graph)
    # Never more kernels.  Without the view the reshape is still no kernel of its own where
    # its operand can live in its buffer (`plan.placement`: the relu writes the reshape's
    # memory), and where it composed with another copy into one (`plan.copies`: a transpose
    # before a product) that copy is the view's product reading in place.
    assert len(view_exe.kernels) <= len(copy_exe.kernels)
    if kind in ("gemm", "matmul"):
        assert len(view_exe.kernels) == len(copy_exe.kernels)
    product = next(n for n in view_exe.graph.nodes if n.op in ("gemm", "matmul"))
    assert product.get("view_a") or product.get("view_b")
    close(view_exe.graph.evaluate(x=x)["y"], want)  # the numpy reference reads it the same way


@device
def test_reshapes_that_merge_dimensions_keep_their_copy():
    x, w = rand(2, 3, 4, 4), rand(48, 5)
    g = Graph()
    xv = g.input("x", x.shape)
    g.output("y", ops.matmul(ops.flatten(ops.relu(xv)), g.constant(w)))
    exe, outs = run(g, {"x": x}, passes=True)
    close(outs["y"], np.maximum(x, 0).reshape(2, 48) @ w)
    assert "reshape" in ops_of(exe.graph)
    assert not any(n.get("view_a") or n.get("view_b") for n in exe.graph.nodes)
