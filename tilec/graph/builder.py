"""The graph frontend: a DAG of tensor operations built from Python (`tilec.ops`) or ONNX
(`tilec.onnx`), rewritten by inference passes (`tilec.passes`), lowered to one Tile program
(`tilec.lower`) and compiled by the same compiler as hand-written Tile.

```
g = tilec.Graph()
x = g.input("x", (1, 3, 32, 32))
y = tilec.ops.relu(tilec.ops.conv2d(x, g.constant(w), bias=g.constant(b), padding="same"))
g.output("y", y)
exe = g.compile()
outs = exe(x=array)
```

Constants (weights) are program inputs too: the compiler takes inputs only, so the
`GraphExecutable` binds their arrays itself and the caller passes the graph's inputs alone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from ..errors import TileError
from ..lang.check import normalize_dtype

if TYPE_CHECKING:
    from ..compiler import Executable
    from ..config import Config
    from ..plan.hw import HwModel
    from .lower import TileProgram


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

    graph: Graph = field(repr=False)
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
        from . import ops

        fn = getattr(ops, op)
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
        from . import ops

        return ops.neg(self)

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
    out = np.array(a, dtype=np.bool_ if want == "bool" else want)
    out.setflags(write=False)
    return out


def _storage_dtype(dt: np.dtype) -> str:
    if dt == np.bool_:
        return "bool"
    if dt.kind in "iu":
        return "int32"
    if dt == np.float16:
        return "float16"
    return "float32"


class Graph:
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
    def derive(self, nodes: Sequence[Node] | None = None) -> Graph:
        """A graph with the same inputs, constants and outputs, and `nodes` (default: none,
        for a pass to fill in order)."""
        g = Graph(self.name)
        g.inputs = dict(self.inputs)
        g.constants = dict(self.constants)
        g.outputs = dict(self.outputs)
        g._types = {k: v for k, v in self._types.items()
                    if k in self.inputs or k in self.constants}
        g._reserved = set(self._types) | self._reserved
        for n in nodes or ():
            g.append(n)
        return g

    def copy(self) -> Graph:
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

    def prune(self) -> Graph:
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

    def lower(self) -> TileProgram:
        from .lower import lower

        return lower(self)

    def to_tile(self) -> str:
        """The whole graph as one Tile program (constants are inputs of the function)."""
        return self.lower().source

    def evaluate(self, **arrays: np.ndarray) -> dict[str, np.ndarray]:
        """Every output computed by the numpy reference interpreter of the lowered program."""
        return self.lower().evaluate(arrays)

    def compile(self, *, device: str | None = None, hw: HwModel | str | None = None,
                config: Config | None = None, validate: bool = False,
                passes: bool | Sequence[str] = True) -> GraphExecutable:
        """Optimise (`passes`: True for the inference passes, False for none, or pass names)
        and compile into kernels for one device."""
        from .empty import eliminate_empty
        from .passes import optimize

        g = eliminate_empty(self)  # tensors with no elements need no kernel (`tilec.empty`)
        if passes:
            g = optimize(self, None if passes is True else passes)
        return GraphExecutable.build(g, device=device, hw=hw, config=config, validate=validate)


class GraphExecutable:
    """A compiled graph: call it with the graph's inputs; the constants are bound here."""

    def __init__(self, graph: Graph, program: TileProgram, executable: Executable | None):
        self.graph = graph
        self.program = program
        # None when every output is empty (`tilec.empty`): there is nothing to run.
        self.executable = executable
        # Weights go to the device once, not on every call.
        if executable is not None:
            executable.bind(program.bound)

    @classmethod
    def build(cls, graph: Graph, *, device: str | None = None,
              hw: HwModel | str | None = None, config: Config | None = None,
              validate: bool = False) -> GraphExecutable:
        from ..compiler import compile as tile_compile
        from ..errors import Source

        program = graph.lower()
        if not program.has_kernels:
            return cls(graph, program, None)
        exe = tile_compile(Source(program.source, f"<graph {graph.name}>"), program.shapes,
                           dtype=program.dtypes, device=device, hw=hw, config=config,
                           validate=validate)
        return cls(graph, program, exe)

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(self.graph.inputs)

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(self.graph.outputs)

    @property
    def tile(self) -> str:
        return self.program.source

    @property
    def kernels(self):
        return self.executable.kernels if self.executable is not None else []

    @property
    def source(self) -> str:
        return self.executable.source if self.executable is not None else ""

    @property
    def last_timings(self) -> dict[str, float]:
        return self.executable.last_timings if self.executable is not None else {}

    def __call__(self, **arrays: np.ndarray) -> dict[str, np.ndarray]:
        return self.run(arrays)

    def bind(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The caller's arrays under their Tile names (the constants are bound already)."""
        missing = [k for k in self.graph.inputs if k not in arrays]
        if missing:
            t = self.graph.inputs[missing[0]]
            raise TileError(f"no array given for input {missing[0]} (shape {list(t.shape)})")
        extra = sorted(set(arrays) - set(self.graph.inputs))
        if extra:
            raise TileError(f"unknown input {extra[0]} (inputs: {', '.join(self.graph.inputs)})")
        for k, shape in self.program.empty_inputs.items():  # not inputs of the kernels
            if tuple(np.shape(arrays[k])) != tuple(shape):
                raise TileError(f"input {k}: expected shape {list(shape)}, got "
                                f"{list(np.shape(arrays[k]))}")
        return {tile_name: arrays[k] for k, tile_name in self.program.inputs.items()}

    def run(self, arrays: Mapping[str, np.ndarray], *, poison: bool = False,
            repeat: int = 1) -> dict[str, np.ndarray]:
        """Run the kernels (`poison`: fill every buffer the kernels write with NaN first).
        Outputs with no elements come from the host, with their shapes and types."""
        feed = self.bind(arrays)
        outs = {} if self.executable is None else \
            self.executable.run(feed, poison=poison, repeat=repeat)
        return self.program.arrange(outs)

    def reference(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The numpy reference's outputs for the same inputs."""
        return self.program.evaluate(arrays)


__all__ = ["Graph", "GraphExecutable", "Node", "TensorType", "Value", "constant_array"]
