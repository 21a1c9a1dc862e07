"""Inference passes over a graph, after MegEngine's OptPasses (seed 004):

- `dead_node_elimination`: drop nodes and constants no output needs, and identity copies.
- `batchnorm_to_elementwise` (ConvertBatchNormToElemwise): with constant statistics, a batch
  norm is `x * s + t` with s = scale / sqrt(var + eps) and t = bias - mean * s, per channel.
- `constant_folding`: every node whose operands are all constants is computed now, by the numpy
  reference interpreter of its Tile text, and becomes a constant.
- `fold_scale_into_weights` (ParamRedistribute): a per-output-channel multiplication after a
  convolution or matrix product with constant weights moves into the weights (and bias).
- `fuse_bias_activation` (FuseConvBiasNonlin): convolution / matrix product + bias add +
  activation become one node, lowered to one contraction with one fused epilogue (one kernel).
- `reshape_views`: a 2-D gemm / matmul reads a reshaped (flattened) operand's source in place,
  so the reshape's copy kernel goes (`tilec.views`).
- `elementwise_fusion`: an elementwise node read by a single elementwise node of the same shape
  is inlined into it, so a chain is one Tile statement and one kernel.
- `channels_last` (CPUs only, first; `tilec.channels_last`): NCHW convolutions and their
  neighbours NHWC, so that a convolution stores its output-channel vectors whole.

Every pass takes a graph and returns a new one; none changes its argument."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..errors import TileError
from . import ops
from .channels_last import channels_last
from .core import GraphBase, Node, Value, constant_array
from .emit import ew_text
from .views import reshape_views

CONTRACTIONS = ("conv", "gemm", "matmul")


def eliminate_dead_nodes(g: GraphBase) -> GraphBase:
    alias: dict[str, str] = {}
    outputs = set(g.outputs.values())
    nodes = []
    for n in g.nodes:
        n = Node(n.op, tuple(alias.get(i, i) for i in n.inputs), n.output, n.type, n.attrs)
        if n.op == "copy" and n.output not in outputs:
            alias[n.output] = n.inputs[0]
            continue
        nodes.append(n)
    return g.derive(nodes).prune()


def batchnorm_to_elementwise(g: GraphBase) -> GraphBase:
    out = g.derive()
    for n in g.nodes:
        if n.op != "batchnorm" or not all(g.is_constant(p) for p in n.inputs[1:]):
            out.append(n)
            continue
        x, scale, bias, mean, var = (out.value(i) for i in n.inputs)
        ax = int(n.get("axis"))  # type: ignore[arg-type]
        pshape = (n.shape[ax],) + (1,) * (len(n.shape) - ax - 1)
        s = ops.div(scale, ops.sqrt(ops.add(var, float(n.get("epsilon")))))  # type: ignore
        s_b = _named(_reshaped(s, pshape), f"{n.output}_scale")
        s_vec = s_b if len(pshape) == 1 else s  # `s` itself was renamed when no reshape was due
        t_b = _named(_reshaped(ops.sub(bias, ops.mul(mean, s_vec)), pshape),
                     f"{n.output}_shift")
        out.retarget(ops.add(ops.mul(x, s_b), t_b), n.output)
    return out


def _named(v: Value, name: str) -> Value:
    """Give the node just added a readable name (folded weights keep it as constants)."""
    v.graph.retarget(v, v.graph.fresh(name))
    return v.graph.value(v.graph.nodes[-1].output)


def _reshaped(v: Value, shape: tuple[int, ...]) -> Value:
    return v if v.shape == shape else ops.reshape(v, shape)


def fold_constants(g: GraphBase) -> GraphBase:
    known = set(g.constants)
    folded: list[Node] = []
    for n in g.nodes:
        if all(i in known for i in n.inputs):
            folded.append(n)
            known.add(n.output)
    if not folded:
        return g.copy()
    done = {n.output for n in folded}
    rest = [n for n in g.nodes if n.output not in done]
    needed = {i for n in rest for i in n.inputs} | set(g.outputs.values())
    sub = g.derive(folded)
    sub.inputs = {}
    sub.outputs = {n.output: n.output for n in folded if n.output in needed}
    out = g.derive(rest)
    if sub.outputs:
        for name, arr in sub.lower().evaluate({}).items():
            out.constants[name] = constant_array(arr)
            out._types[name] = g.type(name)
    return out.prune()


def _channel_vector(g: GraphBase, v: str, out_shape: tuple[int, ...], axis: int) -> bool:
    """Whether constant `v` broadcasts to `out_shape` varying along `axis` only."""
    if not g.is_constant(v):
        return False
    shape = g.type(v).shape
    if len(shape) > len(out_shape):
        return False
    full = (1,) * (len(out_shape) - len(shape)) + shape
    return all(s == 1 or (i == axis and s == out_shape[i]) for i, s in enumerate(full))


def _channel_axis(n: Node) -> int:
    if n.op == "conv":
        return len(n.shape) - 1 if n.get("layout") == "NHWC" else 1
    return len(n.shape) - 1


def _as_vector(v: Value, c: int) -> Value:
    """A per-channel constant as shape [C] (a scalar stays a scalar)."""
    return _reshaped(v, () if int(np.prod(v.shape)) == 1 else (c,))


def _sole_consumer(g: GraphBase, n: Node) -> Node | None:
    if n.output in g.outputs.values():
        return None
    users = g.consumers(n.output)
    return users[0] if len(users) == 1 and g.uses(n.output) == 1 else None


def _other(n: Node, name: str) -> str:
    return n.inputs[1] if n.inputs[0] == name else n.inputs[0]


def fold_scale_into_weights(g: GraphBase) -> GraphBase:
    plan: dict[str, tuple[Node, Node]] = {}  # mul output -> (contraction, mul)
    for n in g.nodes:
        if n.op not in CONTRACTIONS or n.get("activation") is not None \
                or not g.is_constant(n.inputs[1]):
            continue
        if n.op == "matmul" and len(g.type(n.inputs[1]).shape) != 2:
            continue
        m = _sole_consumer(g, n)
        if m is None or m.op != "mul" or m.shape != n.shape or \
                not _channel_vector(g, _other(m, n.output), n.shape, _channel_axis(n)):
            continue
        plan[m.output] = (n, m)
    out = g.derive()
    skip = {c.output for c, _ in plan.values()}
    for node in g.nodes:
        if node.output in skip:
            continue
        if node.output not in plan:
            out.append(node)
            continue
        c, m = plan[node.output]
        co = c.shape[_channel_axis(c)]
        s = _as_vector(out.value(_other(m, c.output)), co)
        w = out.value(c.inputs[1])
        if c.op == "conv":
            nhwc = c.get("layout") == "NHWC"
            wshape = (1,) * (w.ndim - 1) + (co,) if nhwc else (co,) + (1,) * (w.ndim - 1)
        else:
            wshape = (co, 1) if c.get("trans_b") else (1, co)
        w2 = _named(ops.mul(w, s if s.shape == () else _reshaped(s, wshape)), f"{w.name}_scaled")
        inputs = [c.inputs[0], w2.name]
        if len(c.inputs) > 2:
            b = out.value(c.inputs[2])
            inputs.append(_named(ops.mul(b, s), f"{b.name}_scaled").name)
        out.append(Node(c.op, tuple(inputs), m.output, c.type, c.attrs))
    return out


def _bias_fits(g: GraphBase, c: Node, v: str) -> bool:
    if v == c.output:  # `y + y` is no bias
        return False
    if c.op == "conv":
        return _channel_vector(g, v, c.shape, _channel_axis(c))
    try:
        return tuple(np.broadcast_shapes(g.type(v).shape, c.shape)) == c.shape
    except ValueError:
        return False


def _activation_of(n: Node) -> tuple[str, tuple] | None:
    if n.op not in ops.ACTIVATIONS:
        return None
    if n.op == "clip" and "input" in (n.get("min"), n.get("max")):
        return None
    return n.op, tuple((k, v) for k, v in n.attrs.items() if v is not None)


def fuse_bias_activation(g: GraphBase) -> GraphBase:
    plan: dict[str, tuple[Node, Node | None, Node | None]] = {}  # last output -> pieces
    for n in g.nodes:
        if n.op not in CONTRACTIONS or n.get("activation") is not None:
            continue
        add, act, last = None, None, n
        nxt = _sole_consumer(g, n)
        if nxt is not None and nxt.op == "add" and nxt.shape == n.shape and \
                nxt.dtype == n.dtype and _bias_fits(g, n, _other(nxt, n.output)):
            add, last = nxt, nxt
            nxt = _sole_consumer(g, nxt)
        if nxt is not None and nxt.shape == n.shape and _activation_of(nxt) is not None:
            act, last = nxt, nxt
        if last is not n:
            plan[last.output] = (n, add, act)
    out = g.derive()
    skip = {p.output for c, a, _ in plan.values() for p in (c, a) if p is not None}
    for node in g.nodes:
        if node.output in skip and node.output not in plan:
            continue
        if node.output not in plan:
            out.append(node)
            continue
        c, add, act = plan[node.output]
        inputs, attrs = list(c.inputs), dict(c.attrs)
        if add is not None:
            t = out.value(_other(add, c.output))
            if c.op == "conv":
                t = _as_vector(t, c.shape[_channel_axis(c)])
                if t.shape == ():
                    ones = out.constant(np.ones(c.shape[_channel_axis(c)]))
                    t = _named(ops.mul(ones, t), f"{c.output}_bias")
            elif c.op == "gemm" and len(inputs) > 2 and attrs["beta"] != 1:
                inputs[2] = ops.mul(out.value(inputs[2]), attrs["beta"]).name
            if len(inputs) > 2:
                t = _named(ops.add(out.value(inputs[2]), t), f"{inputs[2]}_biased")
            inputs = inputs[:2] + [t.name]
            if c.op == "gemm":
                attrs["beta"] = 1.0
        if act is not None:
            name, params = _activation_of(act)  # type: ignore[misc]
            attrs["activation"], attrs["act_attrs"] = name, params or None
        out.append(Node(c.op, tuple(inputs), node.output, c.type, attrs))
    return out


def template(n: Node) -> str:
    """An elementwise node as a format string over its operands {0}, {1}, ..."""
    if n.op == "fused":
        return str(n.get("expr"))
    return ew_text(n.op, [f"{{{i}}}" for i in range(len(n.inputs))], n.attrs, n.dtype)


def _inline_scalars(g: GraphBase, n: Node) -> Node:
    """Scalar constants of a fused expression become literals of its text."""
    from .emit import lit

    args, inputs = [], []
    for v in n.inputs:
        arr = g.constants.get(v)
        if arr is not None and arr.shape == () and arr.dtype != np.bool_ and \
                np.isfinite(arr).all():
            args.append(lit(arr.item(), "int32" if arr.dtype.kind == "i" else str(arr.dtype)))
        else:
            args.append(f"{{{len(inputs)}}}")
            inputs.append(v)
    expr = str(n.get("expr")).format(*args)
    return Node("fused", tuple(inputs), n.output, n.type, {"expr": expr})


def _merge(e: Node, f: Node) -> Node:
    j = f.inputs.index(e.output)
    k = len(e.inputs)
    inner = "(" + template(e).format(*(f"{{{j + t}}}" for t in range(k))) + ")"
    args = [f"{{{i}}}" if i < j else inner if i == j else f"{{{i - 1 + k}}}"
            for i in range(len(f.inputs))]
    expr = template(f).format(*args)
    inputs = list(f.inputs[:j]) + list(e.inputs) + list(f.inputs[j + 1:])
    unique = list(dict.fromkeys(inputs))  # an operand read twice gets one placeholder
    expr = expr.format(*(f"{{{unique.index(v)}}}" for v in inputs))
    return Node("fused", tuple(unique), f.output, f.type, {"expr": expr})


def fuse_elementwise(g: GraphBase) -> GraphBase:
    # In program order, so a node's producers are already fused when it is reached.
    uses: dict[str, int] = {}
    for n in g.nodes:
        for i in n.inputs:
            uses[i] = uses.get(i, 0) + 1
    for v in g.outputs.values():
        uses[v] = uses.get(v, 0) + 1
    # An operand read twice by the merged node counts twice here: that only stops a fusion.
    current: dict[str, Node] = {}
    order: list[str] = []
    for n in g.nodes:
        while n.op in ops.ELEMENTWISE:
            e = next((current[i] for i in n.inputs if i in current and uses[i] == 1
                      and current[i].op in ops.ELEMENTWISE
                      and current[i].shape == n.shape), None)
            if e is None:
                break
            n = _inline_scalars(g, _merge(e, n))
            del current[e.output]
            order.remove(e.output)
        current[n.output] = n
        order.append(n.output)
    return g.derive([current[k] for k in order])


PASSES: dict[str, Callable[[GraphBase], GraphBase]] = {
    "dead_node_elimination": eliminate_dead_nodes,
    "batchnorm_to_elementwise": batchnorm_to_elementwise,
    "constant_folding": fold_constants,
    "fold_scale_into_weights": fold_scale_into_weights,
    "fuse_bias_activation": fuse_bias_activation,
    "reshape_views": reshape_views,
    "elementwise_fusion": fuse_elementwise,
    "channels_last": channels_last,  # for CPUs, before the others (`Graph.optimized`)
}

DEFAULT_PASSES = ("dead_node_elimination", "batchnorm_to_elementwise", "constant_folding",
                  "fold_scale_into_weights", "constant_folding", "fuse_bias_activation",
                  "constant_folding", "reshape_views", "elementwise_fusion",
                  "dead_node_elimination")


def trace(graph: GraphBase, passes: Sequence[str] | None = None) -> list[tuple[str, GraphBase]]:
    """The graph after each pass, in order (`tilec graph --dump-passes`)."""
    names = DEFAULT_PASSES if passes is None else tuple(passes)
    unknown = [p for p in names if p not in PASSES]
    if unknown:
        raise TileError(f"unknown pass {unknown[0]!r} (passes: {', '.join(PASSES)})")
    out = []
    g = graph
    for name in names:
        g = PASSES[name](g)
        out.append((name, g))
    return out


def optimize(graph: GraphBase, passes: Sequence[str] | None = None) -> GraphBase:
    steps = trace(graph, passes)
    return steps[-1][1] if steps else graph.copy()


__all__ = ["DEFAULT_PASSES", "PASSES", "batchnorm_to_elementwise", "channels_last",
           "eliminate_dead_nodes", "fold_constants", "fold_scale_into_weights",
           "fuse_bias_activation", "fuse_elementwise", "optimize", "reshape_views", "template",
           "trace"]
