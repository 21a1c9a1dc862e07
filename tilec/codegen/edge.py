"""The last, partial tile along one output index with code of its own (CPU contractions).

A CPU schedule moves the last tile along an index its tile does not divide back, to end where
the range ends (`Schedule.shift`): a 7-wide row in tiles of 4 computes 8 columns, one of them
twice, a 13-wide one 16.  With code of its own the last work-group along that index runs a
register tile as wide as the range's rest (3, or 1) instead.  The kernel then holds the loops
twice: `if (last along y) { the 3-wide tile; return; }` before the 4-wide one.  resnet18's
7x7x512 3x3 convolutions (tiles of 4 pixels x 16 channels) repeated 1 point in 8, its 14x14
ones 1 in 15 (tiles of 5), squeezenet's 13x13 1x1 convolutions 3 in 16."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..plan.edges import edge_index as plan_edge_index


def edge_index(c: Any) -> int | None:
    """The output index of contraction `c` (a `contraction._Contraction`) whose last, partial
    tile gets code of its own (`plan.edges.edge_index`), or None (not a CPU model)."""
    return plan_edge_index(c.sched) if c.cpu else None


def edge_width(c: Any) -> int:
    """What the range leaves for the last tile along `c.edge_k`."""
    k = c.edge_k
    return c.flat.ranges[k] - (c.counts[k] - 1) * c.sched.tile[k]


def edge_code(c: Any) -> dict | None:
    """The template's `edge` block of contraction `c`: when its work-group is the last along
    `c.edge_k`, the code of a tile as wide as the range's rest (rendered by a second
    contraction of that tile, placed at the origin the kernel's own tiles give that group),
    then return."""
    k = c.edge_k
    if k is None or c.edge_of is not None:
        return None
    s, f = c.sched, c.flat
    width = edge_width(c)
    tile = tuple(width if j == k else t for j, t in enumerate(s.tile))
    # Its reduction loops stay rolled where it is a third of the work-groups along k or less:
    # unrolled it doubled PoCL's time to generate the kernel's code (14x14x256 3x3 on the
    # Zen 3: 1.0 -> 1.7 s), rolled 1.1-1.3 s, the kernel 0.87 of the moved-back tiles' time
    # either way.  Where it is half of them (7 = 4 + 3) it runs as the main tile does: rolled
    # it kept 0.94 of the time, unrolled 0.77.
    roll = c.counts[k] >= 3
    edge = type(c)(c.kernel, replace(s, tile=tile, rolled=roll or s.rolled), c.program, [],
                   c.muladd,
                   c.plain_vectors,
                   c.cpu, c.line_bytes, c.l2_bytes, edge_of=(k, s.tile[k], c.counts[k]))
    body = edge.render_body().strip("\n")
    # The work-group's place along k, decoded as the prologue decodes it.
    step = 1
    for j in c.group_walk():
        if j == k:
            break
        step *= c.group_count(j)
    gid = "get_group_id(0)" if step == 1 else f"get_group_id(0) / {step}"
    c.typedefs.update(edge.typedefs)
    return {"index": f.names[k], "size": width,
            "cond": f"({gid}) % {c.counts[k]} == {c.counts[k] - 1}",
            "text": "\n".join("    " + ln if ln.strip() else ln for ln in body.splitlines())}
