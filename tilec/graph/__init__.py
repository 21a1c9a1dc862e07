"""Graph frontends: a Python builder of tensor graphs, its op library and inference passes,
lowered to one Tile program.

`builder` (Graph, Value, Node, the executable), `ops` / `ops_extra` (every op generates Tile
from its parameters), `passes` (dead nodes, folding, fusion), `views` (reshapes read in place),
`empty` (zero-sized tensors), `lower` / `lower_ops` (graph -> Tile text)."""

from .builder import Graph, GraphExecutable, Node, TensorType, Value, constant_array

__all__ = ["Graph", "GraphExecutable", "Node", "TensorType", "Value", "constant_array"]
