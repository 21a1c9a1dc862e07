"""Graph frontends: a Python builder of tensor graphs, its op library and inference passes,
lowered to one Tile program.

From the bottom up: `core` (values, nodes, the graph structure), `ops` / `ops_extra` /
`ops_math` / `ops_norm` (every op generates Tile from its parameters), `empty` (zero-sized
tensors), `emit` (the Tile program and its emitter), `views` (reshapes read in place),
`lower_ops` (one emitter per op), `lower` (graph -> Tile text), `passes` (dead nodes, folding,
fusion), and `builder` (`Graph`: building, lowering, compiling; `GraphExecutable`)."""

from . import ops
from .builder import Graph, GraphExecutable
from .core import Node, TensorType, Value, constant_array

__all__ = ["Graph", "GraphExecutable", "Node", "TensorType", "Value", "constant_array", "ops"]
