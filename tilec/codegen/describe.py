"""The comment at the top of a contraction kernel: what the statement is, how it is tiled,
threaded, vectorised, staged and swept, its post-ops, its stride table and its cost log."""

from __future__ import annotations

from typing import Any

from ..plan.gpu_form import RUN
from .edge import edge_width


def describe(c: Any, groups: int) -> list[str]:
    """Contraction `c`'s (a `contraction._Contraction`) comment lines; `groups`: its
    work-groups."""
    f, s, k_ = c.flat, c.sched, c.kernel
    wg = s.wg_threads
    tile = dict(zip(f.names, s.tile, strict=True))
    comment = [k_.op.text, ""]
    comment += [f"tile: {', '.join(f'{n}={t}' for n, t in tile.items())}",
                f"threads: {wg} per group, {groups} groups; "
                f"{len(c.points)} accumulators of {c.acc_type()} per thread"]
    if c.v is not None:
        comment.append(f"vector: {c.W} lanes along {f.names[c.v]}"
                       + (" (reduction: lanes summed at the end)" if s.dot else ""))
    comment.append("staging: " + ("local memory" if s.staged and any(s.staged) else
                                  "none (read through cache)"))
    if s.run is not None:
        comment.append(f"runs: {f.inputs[s.run.input].name} read {RUN} points along "
                       f"{f.names[s.run.index]} at a time from local memory")
    if c.pipe:
        comment.append("pipelined: the next reduction tile read into registers during "
                       "this one, local tiles double-buffered")
    if c.split:
        comment.append(f"split reduction: {s.split} threads along {f.names[s.split_index]}"
                       f" per output thread, combined in local memory")
    if c.sweep:
        comment.append(c.sweep.describe(f, s.tile[c.sweep.index]))
    if c.edge_k is not None and c.edge_of is None:
        comment.append(f"edge: the last tile along {f.names[c.edge_k]} is "
                       f"{edge_width(c)} wide, with code of its own")
    if k_.post_ops:
        comment.append("post-ops: " + "; ".join(p.text for p in k_.post_ops))
    comment += [""] + f.table().splitlines()
    for con in f.constraints:
        comment.append("constraint: " + f.constraint_text(con))
    comment += [""] + c.cost_lines
    return comment
