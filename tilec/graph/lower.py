"""Graph -> one Tile program: the lowering driver.  Each node is written as Tile by its op's
emitter (`lower_ops`) through an `Emitter` (`emit`), after tensors with no elements are taken
out (`empty`)."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import TileError
from .core import GraphBase, Node
from .emit import Emitter, TileProgram, dims_text
from .empty import eliminate_empty, empty_outputs, is_empty
from .lower_ops import EMITTERS


def lower(graph: GraphBase) -> TileProgram:
    order = tuple(graph.outputs)
    graph = eliminate_empty(graph)  # unchanged when no tensor is empty
    em = Emitter(graph)
    empty_in = {k: t.shape for k, t in graph.inputs.items() if is_empty(t.shape)}
    inputs = {k: em.declare(k) for k in graph.inputs if k not in empty_in}
    empty_out = {k: (t.shape, t.dtype) for k, t in empty_outputs(graph).items()}
    outputs: dict[str, str] = {}
    produced = {n.output for n in graph.nodes}
    for out, value in graph.outputs.items():
        if out in empty_out:
            continue
        if value in produced and value not in em.names:
            em.names[value] = em.unique(out)
            outputs[out] = em.names[value]
    for node in graph.nodes:
        emit: Callable[[Emitter, Node], None] | None = EMITTERS.get(node.op)
        if emit is None:
            raise TileError(f"no Tile lowering for op {node.op!r} (node {node.output})")
        em.stmt(f"// {node}")
        emit(em, node)
    for out, value in graph.outputs.items():
        if out not in outputs and out not in empty_out:
            # an input, a constant, or a value that is output twice
            name = em.unique(out)
            em.stmt(f"{name} = {em.ref(value)};")
            outputs[out] = name
    if not order:
        raise TileError(f"graph {graph.name} has no outputs")
    outputs = {k: outputs[k] for k in graph.outputs if k in outputs}
    if not outputs:  # every output is empty: nothing to compute
        return TileProgram("", {}, {}, {}, {}, {}, empty_in, empty_out, order)
    params = ", ".join(f"{n}[{dims_text(s)}]" for n, (s, _) in em.params.items())
    body = "\n".join("  " + line for line in em.lines)
    source = (f"// graph {graph.name}\nfunction ({params}) -> ({', '.join(outputs.values())}) "
              f"{{\n{body}\n}}\n")
    return TileProgram(source, {n: s for n, (s, _) in em.params.items()},
                       {n: d for n, (_, d) in em.params.items()}, inputs, dict(em.bound),
                       outputs, empty_in, empty_out, order)


__all__ = ["TileProgram", "lower"]
