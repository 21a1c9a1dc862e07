"""The dataflow graph itself: tensor types, nodes, values and `GraphBase` (inputs, constants,
nodes in order, outputs, and the edits passes make).  Everything else in `tilec.graph` reads or
rewrites these; `builder.Graph` adds lowering and compiling on top.

Arithmetic on values (`x + y`, `-x`) is the op library's: `ops` registers its functions here
when it is imported (which `tilec.graph` always does), so this module needs nothing above it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import TileError
from ..lang.check import normalize_dtype

# op name ("add", "sub", "mul", "div", "neg") -> the op library's function
_OPERATORS: dict[str, Callable[..., Value]] = {}


def register_operators(**fns: Callable[..., Value]) -> None:
    """Called by `ops` with the functions behind Value's arithmetic operators."""
    _OPERATORS.update(fns)


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        return f"[{', '.join(map(str, self.shape))}] {self.dtype}"


@dataclass(frozen=True)
class Node:
    """One operation with one output.  `attrs` holds the op's normalised parameters (see
    `tilec.ops`); nodes are replaced, never changed, by the passes."""

    op: str
    inputs: tuple[str, ...]
    output: str
    type: TensorType
    attrs: Mapping[str, object] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    def get(self, key: str, default: object = None) -> object:
        return self.attrs.get(key, default)

    def __str__(self) -> str:
        attrs = " ".join(f"{k}={_attr_text(v)}" for k, v in self.attrs.items() if v is not None)
        return (f"%{self.output} = {self.op}({', '.join(self.inputs)})"
                + (f" {attrs}" if attrs else "") + f" -> {self.type}")


def _attr_text(v: object) -> str:
    if isinstance(v, tuple | list):
        return "[" + ",".join(_attr_text(x) for x in v) + "]"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


@dataclass(frozen=True, eq=False)
class Value:
    """A handle on one tensor of a graph: an input, a constant or a node's output.  The
    arithmetic operators build elementwise nodes (numpy broadcasting)."""

    graph: GraphBase = field(repr=False)
    name: str

    @property
    def type(self) -> TensorType:
        return self.graph.type(self.name)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def _bin(self, op: str, other: object, swap: bool = False) -> Value:
        fn = _OPERATORS[op]
        return fn(other, self) if swap else fn(self, other)

    def __add__(self, o: object) -> Value:
        return self._bin("add", o)

    def __radd__(self, o: object) -> Value:
        return self._bin("add", o, True)

    def __sub__(self, o: object) -> Value:
        return self._bin("sub", o)

    def __rsub__(self, o: object) -> Value:
        return self._bin("sub", o, True)

    def __mul__(self, o: object) -> Value:
        return self._bin("mul", o)

    def __rmul__(self, o: object) -> Value:
        return self._bin("mul", o, True)

    def __truediv__(self, o: object) -> Value:
        return self._bin("div", o)

    def __rtruediv__(self, o: object) -> Value:
        return self._bin("div", o, True)

    def __neg__(self) -> Value:
        return _OPERATORS["neg"](self)

    def __repr__(self) -> str:
        return f"Value({self.name}: {self.type})"


def constant_array(array: object, dtype: str | None = None) -> np.ndarray:
    """A constant's storage: tilec's element types (64-bit values are narrowed to 32 bits,
    which the device kernels use), read-only so a graph never sees its weights change."""
    a = np.asarray(array)
    want = normalize_dtype(dtype or _storage_dtype(a.dtype), "constant")
    if want == "int32" and a.dtype.kind in "iu" and a.size and (
            a.max() > np.iinfo(np.int32).max or a.min() < np.iinfo(np.int32).min):
        raise TileError(f"an integer constant does not fit in int32 (range {a.min()}..{a.max()})")
    dt = np.dtype(np.bool_ if want == "bool" else want)
    if a.dtype == dt and _frozen(a):
        # Nobody can change these elements: kept as they are, a view included (a model's
        # weights read from the file, a filter transposed for channels-last), not copied.
        return a
    out = np.array(a, dtype=dt)
    out.setflags(write=False)
    return out


def _frozen(a: np.ndarray) -> bool:
    """Whether `a`'s elements cannot change under the graph: `a` is read-only and so is every
    array it views, down to memory an immutable `bytes` holds (an ONNX initializer's data) or
    a read-only array owns (another constant's)."""
    base: object = a
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return False
        if base.base is None:
            return True
        base = base.base
    return isinstance(base, bytes)


def _storage_dtype(dt: np.dtype) -> str:
    if dt == np.bool_:
        return "bool"
    if dt.kind in "iu":
        return "int32"
    if dt == np.float16:
        return "float16"
    return "float32"


class GraphBase:
    """A dataflow graph: named inputs and constants, nodes in a topological order, and named
    outputs.  Build it with `input`, `constant`, `output` and the functions of `tilec.ops`."""

    def __init__(self, name: str = "graph"):
        self.name = name
        self.inputs: dict[str, TensorType] = {}
        self.constants: dict[str, np.ndarray] = {}
        self.nodes: list[Node] = []
        self.outputs: dict[str, str] = {}  # output name -> value name
        self._types: dict[str, TensorType] = {}
        # Names a rewrite must not give to new nodes: the source graph's, still to be copied.
        self._reserved: set[str] = set()

    # building ----------------------------------------------------------------------------------
    def input(self, name: str, shape: Sequence[int], dtype: str = "float32") -> Value:
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise TileError(f"input {name}: sizes must not be negative, got {list(shape)}")
        self._claim(name)
        t = TensorType(shape, normalize_dtype(dtype, f"input {name}"))
        self.inputs[name] = t
        self._types[name] = t
        return Value(self, name)

    def constant(self, array: object, name: str | None = None,
                 dtype: str | None = None) -> Value:
        arr = constant_array(array, dtype)
        name = self.fresh(name or "const")
        self.constants[name] = arr
        self._types[name] = TensorType(tuple(arr.shape), _storage_dtype(arr.dtype))
        return Value(self, name)

    def output(self, name: str, value: Value) -> None:
        if value.graph is not self:
            raise TileError(f"output {name}: the value belongs to another graph")
        if name in self.outputs:
            raise TileError(f"output {name!r} is set twice")
        self.outputs[name] = value.name

    def add_node(self, op: str, inputs: Sequence[Value | str], shape: Sequence[int],
                 dtype: str, name: str | None = None, **attrs: object) -> Value:
        names = tuple(self._name_of(v) for v in inputs)
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise TileError(f"{op}: the result would have shape {list(shape)}; sizes must "
                            "not be negative")
        out = self.fresh(name or op)
        self._claim(out)
        t = TensorType(shape, dtype)
        self._types[out] = t
        self.nodes.append(Node(op, names, out, t, attrs))
        return Value(self, out)

    def _name_of(self, v: Value | str) -> str:
        if isinstance(v, Value):
            if v.graph is not self:
                raise TileError(f"{v.name} belongs to another graph")
            return v.name
        if v not in self._types:
            raise TileError(f"unknown value {v!r}")
        return v

    def _claim(self, name: str) -> None:
        if name in self._types:
            raise TileError(f"the name {name!r} is already used in graph {self.name}")

    def fresh(self, base: str) -> str:
        def taken(n: str) -> bool:
            return n in self._types or n in self._reserved

        if not taken(base):
            return base
        k = 1
        while taken(f"{base}_{k}"):
            k += 1
        return f"{base}_{k}"

    # queries -----------------------------------------------------------------------------------
    def type(self, name: str) -> TensorType:
        return self._types[name]

    def value(self, name: str) -> Value:
        if name not in self._types:
            raise TileError(f"unknown value {name!r}")
        return Value(self, name)

    def is_constant(self, name: str) -> bool:
        return name in self.constants

    def consumers(self, name: str) -> list[Node]:
        return [n for n in self.nodes if name in n.inputs]

    def uses(self, name: str) -> int:
        """How many times a value is read: node operands and graph outputs."""
        return sum(n.inputs.count(name) for n in self.nodes) + \
            sum(1 for v in self.outputs.values() if v == name)

    # rewriting (the passes) --------------------------------------------------------------------
    def derive(self, nodes: Sequence[Node] | None = None) -> GraphBase:
        """A graph with the same inputs, constants and outputs, and `nodes` (default: none,
        for a pass to fill in order)."""
        g = type(self)(self.name)  # a pass keeps the caller's class (tilec.Graph)
        g.inputs = dict(self.inputs)
        g.constants = dict(self.constants)
        g.outputs = dict(self.outputs)
        g._types = {k: v for k, v in self._types.items()
                    if k in self.inputs or k in self.constants}
        g._reserved = set(self._types) | self._reserved
        for n in nodes or ():
            g.append(n)
        return g

    def copy(self) -> GraphBase:
        g = self.derive(self.nodes)
        g._types = dict(self._types)
        return g

    def append(self, node: Node) -> None:
        self._types[node.output] = node.type
        self.nodes.append(node)

    def retarget(self, value: Value, name: str) -> None:
        """Rename the output of the node that produced `value` (the last one added) to `name`,
        so a rewritten subgraph keeps the name its consumers read."""
        last = self.nodes[-1]
        if last.output != value.name:
            raise TileError(f"internal: {value.name} is not the last node's output")
        del self._types[last.output]
        self.nodes[-1] = replace(last, output=name)
        self._types[name] = last.type

    def prune(self) -> GraphBase:
        """Nodes and constants that no output needs are dropped (dead-node elimination)."""
        live = set(self.outputs.values())
        kept: list[Node] = []
        for n in reversed(self.nodes):
            if n.output in live:
                kept.append(n)
                live.update(n.inputs)
        g = self.derive(list(reversed(kept)))
        g.constants = {k: v for k, v in self.constants.items() if k in live}
        g._types = {k: v for k, v in g._types.items()
                    if k in g.inputs or k in g.constants or any(k == n.output for n in g.nodes)}
        return g

    # output ------------------------------------------------------------------------------------
    def __str__(self) -> str:
        lines = [f"graph {self.name}"]
        for k, t in self.inputs.items():
            lines.append(f"  input {k}: {t}")
        for k in self.constants:
            lines.append(f"  constant {k}: {self._types[k]}")
        lines += [f"  {n}" for n in self.nodes]
        for k, v in self.outputs.items():
            lines.append(f"  output {k} = {v}")
        return "\n".join(lines)
