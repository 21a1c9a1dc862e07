"""Writing a graph as Tile: the program it becomes (`TileProgram`) and the `Emitter` the op
emitters write through.  Every node becomes Tile statements written from its parameters
(convolutions and pools as contractions with affine index polynomials, elementwise ops as
expressions), so a graph goes through the same compiler as hand-written Tile.

Layout changes are copies: a reshape is one `=` contraction whose index polynomials come from a
common mixed-radix refinement of the two shapes (flatten, squeeze, splitting or merging
dimensions), or two copies through a flat 1-D tensor when the shapes have no common refinement.
A reshaped *constant* costs nothing: the executable binds the reshaped array."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import Source, TileError
from .core import GraphBase, Node
from .empty import NP_DTYPES


@dataclass(frozen=True)
class TileProgram:
    source: str
    shapes: Mapping[str, tuple[int, ...]]  # every input of the Tile function
    dtypes: Mapping[str, str]
    inputs: Mapping[str, str]  # graph input -> Tile name
    bound: Mapping[str, np.ndarray]  # Tile name -> constant array the executable binds
    outputs: Mapping[str, str]  # graph output -> Tile name
    # Tensors with no elements are not in the Tile program (see `tilec.empty`): graph inputs
    # (shape only, to check the caller's arrays) and outputs (made on the host).
    empty_inputs: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    empty_outputs: Mapping[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)
    order: tuple[str, ...] = ()  # every graph output, in the graph's order

    @property
    def has_kernels(self) -> bool:
        """False when every output is empty: there is no Tile function to compile."""
        return bool(self.outputs)

    def host_outputs(self) -> dict[str, np.ndarray]:
        """The empty outputs, as fresh arrays."""
        return {k: np.zeros(s, NP_DTYPES[d]) for k, (s, d) in self.empty_outputs.items()}

    def arrange(self, tile_outs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every graph output, from the Tile outputs (keyed by Tile name) and the empty ones."""
        outs = {k: tile_outs[t] for k, t in self.outputs.items()}
        outs.update(self.host_outputs())
        return {k: outs[k] for k in (self.order or tuple(outs))}

    def evaluate(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The numpy reference's outputs, keyed by graph output name."""
        from ..lang.api import check_program
        from ..lang.reference import evaluate_program

        if not self.has_kernels:
            return self.arrange({})
        program = check_program(Source(self.source, "<graph>"), self.shapes, self.dtypes)
        feed = dict(self.bound)
        for k, t in self.inputs.items():
            feed[t] = np.asarray(arrays[k])
        return self.arrange(evaluate_program(program, feed))


_RESERVED = {"function", "default", "no_defract"}
# The lowering's index variables: Tile keeps them apart from tensors, a reader might not.
_INDEX_LIKE = re.compile(r"n|c|g|m|k|co|ci|[xkibjrq]\d+")


def _sanitize(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if not s or not s[0].isalpha():
        s = "T" + s
    return s + "_" if s in _RESERVED or _INDEX_LIKE.fullmatch(s) else s


def lit(v: float | int, dtype: str) -> str:
    """A Tile literal of the operation's type (a float literal would make an int op float)."""
    if dtype in ("int32", "bool"):
        i = int(v)
        return str(i) if i >= 0 else f"({i})"
    f = float(np.float16(v)) if dtype == "float16" else float(np.float32(v))
    if not math.isfinite(f):
        raise TileError(f"the constant {v} cannot be written in Tile (not finite)")
    s = repr(f)
    return s if f >= 0 else f"({s})"


def affine(terms: Mapping[str, int], const: int = 0) -> str:
    """`2*x0 + k0 - 1` from {x0: 2, k0: 1} and -1."""
    parts = []
    for name, c in terms.items():
        if c == 0:
            continue
        mag = "" if abs(c) == 1 else f"{abs(c)}*"
        parts.append(("- " if c < 0 else "+ ") + mag + name)
    if const or not parts:
        parts.append(("- " if const < 0 else "+ ") + str(abs(const)))
    text = " ".join(parts)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]


_INFIX = {"eq": "==", "ne": "!=", "lt": "<", "gt": ">", "le": "<=", "ge": ">=", "and": "&&",
          "or": "||"}


def ew_text(op: str, args: Sequence[str], attrs: Mapping[str, object], dtype: str) -> str:
    """An elementwise op as a Tile expression of its operand texts."""
    a = args[0] if args else ""

    def L(v: object) -> str:
        return lit(v, dtype)  # type: ignore[arg-type]

    if op in ("add", "sub", "mul", "div"):
        sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[op]
        return f"({a} {sym} {args[1]})"
    if op == "neg":
        return f"(-{a})"
    if op in ("relu", "sigmoid", "tanh", "sqrt", "exp", "log", "erf", "sin", "cos", "abs",
              "floor", "ceil"):
        return f"{op}({a})"
    if op in ("pow", "min", "max"):
        return f"{op}({a}, {args[1]})"
    if op in _INFIX:
        return f"({a} {_INFIX[op]} {args[1]})"
    if op == "not":
        return f"(!{a})"
    if op == "where":
        return f"({a} ? {args[1]} : {args[2]})"
    if op == "relu6":
        return f"min(max({a}, {L(0)}), {L(6)})"
    if op == "leaky_relu":
        return f"({a} > {L(0)} ? {a} : {L(attrs['alpha'])} * {a})"
    if op == "clip":
        rest = list(args[1:])
        out = a
        lo, hi = attrs.get("min"), attrs.get("max")
        if lo is not None:
            out = f"max({out}, {rest.pop(0) if lo == 'input' else L(lo)})"
        if hi is not None:
            out = f"min({out}, {rest.pop(0) if hi == 'input' else L(hi)})"
        return out
    if op == "copy":
        return a
    if op == "fused":
        return str(attrs["expr"]).format(*args)
    raise TileError(f"internal: {op} is not an elementwise op")


def activation_text(node: Node, expr: str) -> str:
    act = node.get("activation")
    if act is None:
        return expr
    operand = expr if re.fullmatch(r"\w+", expr) else f"({expr})"
    return ew_text(str(act), [operand], dict(node.get("act_attrs", ()) or ()), node.dtype)


def refinement(src: Sequence[int], dst: Sequence[int], prefix: str = "r"
               ) -> tuple[list[str], list[str], list[str]] | None:
    """Index variables (`prefix` + digit), source polynomials and destination polynomials of a
    row-major reshape, when every place value of one shape divides the next one of the other
    (None otherwise)."""
    def cuts(shape: Sequence[int]) -> list[int]:
        return [math.prod(shape[k:]) for k in range(len(shape) + 1)]

    if 0 in src or 0 in dst:  # no elements: nothing to copy (`tilec.empty`)
        return None

    places = sorted(set(cuts(src)) | set(cuts(dst)))
    if any(b % a for a, b in zip(places, places[1:], strict=False)):
        return None
    digits = [(f"{prefix}{j}", p, places[j + 1] // p) for j, p in enumerate(places[:-1])]

    def polys(shape: Sequence[int]) -> list[str]:
        out = []
        for k in range(len(shape)):
            lo, hi = math.prod(shape[k + 1:]), math.prod(shape[k:])
            out.append(affine({v: p // lo for v, p, _ in digits if lo <= p < hi}))
        return out

    return [v for v, _, _ in digits], polys(src), polys(dst)


class Emitter:
    """Collects the statements, the function's inputs and the constants to bind."""

    def __init__(self, graph: GraphBase):
        self.graph = graph
        self.taken: set[str] = set()
        self.names: dict[str, str] = {}  # graph value -> Tile name
        self.params: dict[str, tuple[tuple[int, ...], str]] = {}  # Tile input -> shape, dtype
        self.bound: dict[str, np.ndarray] = {}
        self.views: dict[tuple[str, tuple[int, ...]], str] = {}
        self.lines: list[str] = []

    def unique(self, base: str) -> str:
        s = _sanitize(base)
        name, k = s, 1
        while name in self.taken:
            name = f"{s}_{k}"
            k += 1
        self.taken.add(name)
        return name

    def shape(self, value: str) -> tuple[int, ...]:
        return self.graph.type(value).shape

    def declare(self, value: str) -> str:
        t = self.graph.type(value)
        name = self.unique(value)
        self.names[value] = name
        self.params[name] = (t.shape, t.dtype)
        return name

    def ref(self, value: str) -> str:
        if value not in self.names:
            if not self.graph.is_constant(value):
                raise TileError(f"internal: {value} is read before it is computed")
            arr = self.graph.constants[value]
            if arr.size == 0:  # an empty list of axes is fine, an empty operand is not
                raise TileError(f"constant {value}: zero-sized tensors are not supported "
                                f"(shape {list(arr.shape)})")
            name = self.declare(value)
            self.bound[name] = arr
        return self.names[value]

    def operand(self, value: str) -> str:
        """A scalar constant is written as a literal, everything else by name."""
        g = self.graph
        if g.is_constant(value) and self.shape(value) == () and value not in self.names:
            arr = g.constants[value]
            if arr.dtype != np.bool_ and np.isfinite(arr).all():
                return lit(arr.item(), "int32" if arr.dtype.kind == "i" else str(arr.dtype))
        return self.ref(value)

    def define(self, node: Node) -> str:
        if node.output not in self.names:
            self.names[node.output] = self.unique(node.output)
        return self.names[node.output]

    def temp(self, base: str) -> str:
        return self.unique(base)

    def stmt(self, text: str) -> None:
        self.lines.append(text)

    def view(self, value: str, shape: Sequence[int]) -> str:
        """`value` seen with another row-major shape of the same size."""
        shape = tuple(shape)
        if shape == self.shape(value):
            return self.ref(value)
        key = (value, shape)
        if key not in self.views:
            if self.graph.is_constant(value):
                name = self.unique(f"{value}_view")
                self.params[name] = (shape, self.graph.type(value).dtype)
                self.bound[name] = self.graph.constants[value].reshape(shape)
            else:
                name = self.temp(f"{value}_view")
                self.reshape(self.ref(value), self.shape(value), name, shape)
            self.views[key] = name
        return self.views[key]

    def reshape(self, src: str, src_shape: Sequence[int], dst: str,
                dst_shape: Sequence[int]) -> None:
        found = refinement(src_shape, dst_shape)
        if found is not None:
            _, sp, dp = found
            self.stmt(f"{dst}[{', '.join(dp)} : {dims_text(dst_shape)}] = "
                      f"=({src}[{', '.join(sp)}]);")
            return
        # No common refinement (e.g. [6, 4] -> [4, 6]): copy through a flat tensor.
        flat = self.temp(f"{dst}_flat")
        total = math.prod(src_shape)
        iv = [f"i{k}" for k in range(len(src_shape))]
        jv = [f"j{k}" for k in range(len(dst_shape))]
        self.stmt(f"{flat}[{_flat_poly(iv, src_shape)} : {total}] = =({src}[{', '.join(iv)}]);")
        self.stmt(f"{dst}[{', '.join(jv)} : {dims_text(dst_shape)}] = "
                  f"=({flat}[{_flat_poly(jv, dst_shape)}]);")

    def constant(self, array: np.ndarray, base: str, dtype: str) -> str:
        """An array computed while lowering (pool divisors), bound like a constant."""
        name = self.unique(base)
        self.params[name] = (tuple(array.shape), dtype)
        self.bound[name] = np.asarray(array, dtype)
        return name

    def finish(self, node: Node, target: str, expr: str) -> None:
        """The epilogue after a contraction: `expr` (bias, scaling) then the activation."""
        expr = activation_text(node, expr)
        if expr != target:
            self.stmt(f"{self.define(node)} = {expr};")


def dims_text(shape: Sequence[int]) -> str:
    return ", ".join(str(s) for s in shape)


def _flat_poly(vs: Sequence[str], shape: Sequence[int]) -> str:
    return affine({v: math.prod(shape[k + 1:]) for k, v in enumerate(vs)})


__all__ = ["Emitter", "TileProgram", "activation_text", "affine", "ew_text", "lit",
           "refinement"]
