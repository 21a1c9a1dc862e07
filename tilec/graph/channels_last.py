"""`channels_last`: a graph's NCHW convolutions and what runs between them, channels-last
(NHWC), for CPUs.

Why: a CPU convolution puts its output channels in the vector lanes (one broadcast input
value times a vector of filter values per FMA).  In NCHW those lanes are a plane apart in
the output, so every result is stored lane by lane; in NHWC they are adjacent and each
accumulator is one vector store.  squeezenet's 55x55 3x3 layer (16 -> 64 channels, bias and
ReLU) runs 0.25 ms in NCHW and 0.16 ms in NHWC on a 2-core AVX-512 Xeon (PoCL 3.0); with
its stores removed the NCHW kernel runs 0.15 ms: the stores were the difference.  The next
layer reads its input one value at a time either way, so NHWC costs it nothing.

What it does, node by node in order, each value kept in one layout:
- a 2-D convolution with constant weights becomes NHWC (weights transposed to
  [KH, KW, CI/groups, CO], a constant the folding computes); an input that is NCHW is read as
  it is (`input_layout`), so a model's input needs no transpose;
- pools, batch norms, reductions, softmaxes and concatenations whose 4-D operand is NHWC
  follow it (their axes permuted);
- an elementwise node follows where one of its operands is NHWC and every other is NHWC, a
  4-D value broadcast along the same axes (transposed the same way) or a constant;
- any other reader of an NHWC value, and every graph output, gets it back in NCHW: a
  transpose, or a reshape where the moved axes have size 1 (a global pool's [N, 1, 1, C]).
Nothing changes on a graph without a 2-D NCHW convolution.  The result is the same tensor
computation; only the order of elements in memory between kernels changes."""

from __future__ import annotations

import numpy as np

from .core import GraphBase, Node, TensorType
from .ops import ELEMENTWISE

TO_NHWC = (0, 2, 3, 1)  # NHWC axis i holds NCHW axis TO_NHWC[i]
TO_NCHW = (0, 3, 1, 2)
_NEW_AXIS = {0: 0, 1: 3, 2: 1, 3: 2}  # an NCHW axis -> its NHWC position
# Nodes that follow their first operand into NHWC, their axes permuted (`follower`).
_FOLLOWERS = ("max_pool", "avg_pool", "batchnorm", "reduce", "softmax", "log_softmax",
              "concat")


def _permuted(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(shape[i] for i in TO_NHWC)


def _is_nchw_conv(g: GraphBase, n: Node) -> bool:
    return (n.op == "conv" and len(n.shape) == 4 and n.get("layout", "NCHW") == "NCHW"
            and n.get("input_layout") in (None, "NCHW") and g.is_constant(n.inputs[1]))


def has_nchw_conv(g: GraphBase) -> bool:
    """Whether the pass has anything to do."""
    return any(_is_nchw_conv(g, n) for n in g.nodes)


class _Rewrite:
    def __init__(self, g: GraphBase):
        self.g = g
        self.out = g.derive()
        self.nhwc: set[str] = set()  # values held channels-last in `out`
        self.back: dict[str, str] = {}  # NHWC value -> its NCHW copy in `out`
        self.fwd: dict[str, str] = {}  # NCHW 4-D value -> its NHWC copy in `out`
        self.hwio: dict[str, str] = {}  # OIHW weights -> their [KH, KW, CI, CO] constant

    # layouts on demand ---------------------------------------------------------------------
    def nchw(self, name: str) -> str:
        """`name` as the source graph had it (NCHW where it is 4-D)."""
        if name not in self.nhwc:
            return name
        if name not in self.back:
            t = self.out.type(name)
            shape = tuple(t.shape[i] for i in TO_NCHW)
            if t.shape[1] * t.shape[2] == 1 or t.shape[3] == 1:
                node = self._node("reshape", (name,), f"{name}_nchw", shape, t.dtype, {})
            else:
                node = self._node("transpose", (name,), f"{name}_nchw", shape, t.dtype,
                                  {"perm": TO_NCHW})
            self.back[name] = node
        return self.back[name]

    def channels_last(self, name: str) -> str:
        """A computed 4-D value channels-last: itself where it is, else a transpose
        (`elementwise` transposes constants itself)."""
        if name in self.nhwc:
            return name
        if name not in self.fwd:
            t = self.out.type(name)
            self.fwd[name] = self._node("transpose", (name,), f"{name}_nhwc",
                                        _permuted(t.shape), t.dtype, {"perm": TO_NHWC})
        return self.fwd[name]

    def _node(self, op: str, inputs: tuple[str, ...], base: str, shape: tuple[int, ...],
              dtype: str, attrs: dict) -> str:
        name = self.out.fresh(base)
        self.out.append(Node(op, inputs, name, TensorType(tuple(shape), dtype), attrs))
        return name

    # nodes ---------------------------------------------------------------------------------
    def move(self, n: Node, inputs: tuple[str, ...], **attrs: object) -> None:
        """`n` channels-last: its output keeps its name and takes the permuted shape."""
        self.out.append(Node(n.op, inputs, n.output, TensorType(_permuted(n.shape), n.dtype),
                             {**n.attrs, **attrs}))
        self.nhwc.add(n.output)

    def keep(self, n: Node) -> None:
        self.out.append(Node(n.op, tuple(self.nchw(i) for i in n.inputs), n.output, n.type,
                             n.attrs))

    def conv(self, n: Node) -> None:
        x, w, *rest = n.inputs
        if w not in self.hwio:  # one copy for convolutions that share their weights
            self.hwio[w] = self.out.constant(np.transpose(self.out.constants[w], (2, 3, 1, 0)),
                                             f"{w}_hwio", self.out.type(w).dtype).name
        wt = self.hwio[w]
        layout = "NHWC" if x in self.nhwc else "NCHW"
        self.move(n, (x, wt, *rest), layout="NHWC", input_layout=layout)

    def follower(self, n: Node) -> bool:
        x = n.inputs[0]
        if x not in self.nhwc or len(self.out.type(x).shape) != 4:
            return False
        if n.op in ("max_pool", "avg_pool"):
            self.move(n, n.inputs, layout="NHWC")
        elif n.op == "batchnorm":
            self.move(n, n.inputs, axis=_NEW_AXIS[int(n.get("axis"))])  # type: ignore[arg-type]
        elif n.op in ("reduce", "softmax", "log_softmax"):
            axes = tuple(sorted(_NEW_AXIS[int(a)] for a in n.get("axes")))  # type: ignore
            if n.op == "reduce" and not n.get("keepdims"):
                # Without kept axes the result is NCHW-ordered where the remaining axes keep
                # their order: N and C always do, with H or W between them they do not.
                kept = [a for a in range(4) if a not in n.get("axes")]  # type: ignore
                if [_NEW_AXIS[a] for a in kept] != sorted(_NEW_AXIS[a] for a in kept):
                    return False
                self.out.append(Node(n.op, n.inputs, n.output, n.type, {**n.attrs,
                                                                      "axes": axes}))
                return True
            self.move(n, n.inputs, axes=axes)
        elif n.op == "concat":
            if not all(i in self.nhwc for i in n.inputs):
                return False
            self.move(n, n.inputs, axis=_NEW_AXIS[int(n.get("axis"))])  # type: ignore
        else:
            return False
        return True

    def elementwise(self, n: Node) -> bool:
        if n.op not in ELEMENTWISE or len(n.shape) != 4 or \
                not any(i in self.nhwc for i in n.inputs):
            return False
        inputs = []
        for i in n.inputs:
            shape = self.out.type(i).shape if i in self.nhwc or self.out.is_constant(i) \
                else self.g.type(i).shape
            if i in self.nhwc:
                inputs.append(i)
            elif self.out.is_constant(i) and len(shape) <= 4:
                arr = self.out.constants[i]
                if arr.ndim == 0 or arr.size == 1:
                    inputs.append(i)
                    continue
                full = arr.reshape((1,) * (4 - arr.ndim) + arr.shape)
                name = self.out.constant(np.transpose(full, TO_NHWC), f"{i}_nhwc",
                                         self.out.type(i).dtype).name
                inputs.append(name)
            elif len(shape) == 4:
                inputs.append(self.channels_last(i))
            else:
                return False
        self.move(n, tuple(inputs))
        return True


def channels_last(g: GraphBase) -> GraphBase:
    """The graph with its 2-D NCHW convolutions and their neighbours channels-last (see the
    module's text); unchanged where there is none."""
    if not has_nchw_conv(g):
        return g.copy()
    r = _Rewrite(g)
    for n in g.nodes:
        if _is_nchw_conv(g, n):
            r.conv(n)
        elif not ((n.op in _FOLLOWERS and r.follower(n)) or r.elementwise(n)):
            r.keep(n)
    r.out.outputs = {k: r.nchw(v) for k, v in g.outputs.items()}
    return r.out.prune()
