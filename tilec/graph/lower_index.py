"""The Tile text of the indexing and conversion ops (`ops_index`): casts are Tile's
conversions, `gather` its builtin, slices, broadcasts and constant pads `=` contractions, and
arg max / min a max contraction over `X == best ? rank`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .core import Node
from .emit import Emitter, affine, lit


def _out(name: str, idx: Sequence[str], shape: Sequence[int]) -> str:
    dims = ", ".join(str(s) for s in shape)
    return f"{name}[{', '.join(idx)} : {dims}]" if idx else f"{name}[]"


def _cast(em: Emitter, node: Node) -> None:
    x = em.ref(node.inputs[0])
    text = {"float32": f"as_float({x}, 32)", "float16": f"as_float({x}, 16)",
            "int32": f"as_int({x}, 32)", "bool": f"as_bool({x})"}[node.dtype]
    em.stmt(f"{em.define(node)} = {text};")


def _gather(em: Emitter, node: Node) -> None:
    v, i = node.inputs
    em.stmt(f"{em.define(node)} = gather({em.ref(v)}, {em.ref(i)});")


def _slice(em: Emitter, node: Node) -> None:
    starts, steps = node.get("starts"), node.get("steps")
    iv = [f"i{k}" for k in range(len(node.shape))]
    x_idx = [affine({v: steps[k]}, starts[k]) for k, v in enumerate(iv)]  # type: ignore[index]
    em.stmt(f"{_out(em.define(node), iv, node.shape)} = "
            f"=({em.ref(node.inputs[0])}[{', '.join(x_idx)}]);")


def _broadcast(em: Emitter, node: Node) -> None:
    x = node.inputs[0]
    xs = em.shape(x)
    iv = [f"i{k}" for k in range(len(node.shape))]
    off = len(node.shape) - len(xs)
    x_idx = ["0" if n == 1 and node.shape[off + k] != 1 else iv[off + k]
             for k, n in enumerate(xs)]
    src = f"{em.ref(x)}[{', '.join(x_idx)}]" if xs else em.ref(x)
    em.stmt(f"{_out(em.define(node), iv, node.shape)} = =({src});")


def _pad(em: Emitter, node: Node) -> None:
    begin = node.get("begin")
    value = node.get("value")
    iv = [f"i{k}" for k in range(len(node.shape))]
    o_idx = [affine({v: 1}, begin[k]) for k, v in enumerate(iv)]  # type: ignore[index]
    default = ""
    if value:
        fill = em.constant(np.full(node.shape, value), f"{node.output}_fill", node.dtype)
        default = f" default {fill}"
    em.stmt(f"{_out(em.define(node), o_idx, node.shape)} = "
            f"=({em.ref(node.inputs[0])}[{', '.join(iv)}]){default};")


def _arg(em: Emitter, node: Node) -> None:
    x, best = node.inputs
    xs = em.shape(x)
    ax = int(node.get("axis"))  # type: ignore[arg-type]
    n = xs[ax]
    last = bool(node.get("last"))
    # The largest rank among the positions holding the best value is the first (last) one.
    ranks = np.arange(1, n + 1) if last else n - np.arange(n)
    rank = em.constant(ranks.astype(np.int32), f"{node.output}_rank", "int32")
    iv = [f"i{k}" for k in range(len(xs))]
    o_idx = ["0" if k == ax else v for k, v in enumerate(iv)]
    found = em.temp(f"{node.output}_found")
    em.stmt(f"{_out(found, o_idx, node.shape)} = >({em.ref(x)}[{', '.join(iv)}] == "
            f"{em.ref(best)}[{', '.join(o_idx)}] ? {rank}[{iv[ax]}]);")
    expr = f"{found} - 1" if last else f"{lit(n, 'int32')} - {found}"
    em.stmt(f"{em.define(node)} = {expr};")


INDEX_EMITTERS: dict[str, Callable[[Emitter, Node], None]] = {
    "cast": _cast, "gather": _gather, "slice": _slice, "broadcast": _broadcast, "pad": _pad,
    "arg": _arg,
}
