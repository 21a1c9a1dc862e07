"""The interior of a constrained contraction on a CPU: its reduction loops run without masks.

A padded convolution's constraints (`0 <= x + i - 1 < X`) hold for almost every point; only the
image's border fails them.  Written as they are, they cost every load of the innermost loop a
clamped address and a lane mask: in the 3x3 convolution's inner loop on a Zen 4 (PoCL, AVX2)
there were about 30 integer and mask instructions for 8 FMAs.  The constraints only mention the
constrained reduction indices (`loops` puts those outermost) and the output positions, so at
the level where the last constrained loop has fixed them, one test tells whether every point of
the thread's register tile satisfies all of them.  When it does, the remaining (free) loops run
a second copy of the body with plain loads and unconditional updates; otherwise the masked body
as before.

Why plain loads are in bounds there: `plan.flatten` turns every access's bounds into
constraints and keeps those the index box does not imply, so at a point of the box where every
kept constraint holds each scalar read is inside its tensor.  The interior test therefore also
asks that the register tile's positions lie inside their index ranges (a partial last tile
overshoots them unless it moves back: `Schedule.shift`), and a vector read skips its clamp only
when its lanes cannot overshoot the vector index's range (`lanes_fit`).

CPU only: on a GPU the test differs between the threads of a warp at the border, which would
then run both copies.
"""

from __future__ import annotations

from ..plan.schedule import constrained
from . import clexpr
from .kernel_text import _lin, _vec, buf


class Interior:
    def __init__(self, c) -> None:
        self.c = c
        f = c.flat
        blocked = constrained(f)
        # The inner loops in `loops` order; the split goes before the first free one, or
        # inside the innermost loop where every reduction index is constrained (a padded
        # pooling window, a depthwise convolution): the test then runs once a window point
        # for the whole register tile.
        _, inner = c.loops()
        self.at = next((n for n, lp in enumerate(inner) if lp["index"] not in blocked),
                       len(inner))
        self.fixed = [k for k in c.red_idx if k in blocked]
        # Inputs whose reads stay inside their tensors in the interior without a clamp.
        self.plain = {i for i, t in enumerate(f.inputs) if self._lanes_inside(t)}
        # A linear constraint is tightest at a corner of the register tile: a point's
        # position grows with its accumulator number along every output index, so one test a
        # constraint (at the point with the last accumulator where the coefficient is
        # positive, the first where it is negative) covers every point.
        conds: dict[str, None] = {}
        for ci, kind in enumerate(c.cons_kind):
            if kind != "red":
                coeffs = f.constraints[ci].coeffs
                corner = tuple(c.acc[k] - 1 if coeffs[k] > 0 else 0 for k in c.out_idx)
                conds[c.constraint_text(ci, binding_lane(c, ci, c.point_env(corner)))] = None
        for k in c.out_idx:
            if c.overhangs(k) and any(t.strides[k] for t in f.inputs):
                conds[f"({c.pos(k, c.acc[k] - 1)} < {f.ranges[k]})"] = None
        self.cond = " && ".join(conds)

    @staticmethod
    def applies(c) -> bool:
        """A CPU contraction (`c.interior_split`) read through the cache whose constraints
        mention output or mixed indices."""
        s = c.sched
        if not c.interior_split or c.pipe or c.split or s.run is not None or \
                (s.staged and any(s.staged)):
            return False
        return any(kind != "red" for kind in c.cons_kind)

    def _lanes_inside(self, t) -> bool:
        c = self.c
        return c.v is None or t.strides[c.v] == 0 or c.lanes_fit()

    def head(self) -> list[str]:
        """Lines at the split: the fixed (constrained) reduction indices, their range and
        reduction-only checks, which the bodies below then leave out."""
        c, f = self.c, self.c.flat
        out = [f"const int i_{f.names[k]} = {c.red_var(k)} + u_{f.names[k]};"
               for k in self.fixed]
        for k in self.fixed:
            if f.ranges[k] % c.sched.tile[k]:
                out.append(f"if (i_{f.names[k]} >= {f.ranges[k]}) break;")
        red_env = {k: c.names[k] for k in c.red_idx}
        for ci, kind in enumerate(c.cons_kind):
            if kind == "red":
                out.append(f"if (!{c.constraint_text(ci, red_env)}) continue;")
        return out


def steered_offset(c, i: int, point: tuple[int, ...], cond: str) -> str | None:
    """Offset of masked input i's read at `point` that needs no clamp: the terms of the
    indices the constraints fix, or, where `cond` fails, a constant that keeps the free
    indices' terms inside the tensor (the value is then masked to zero).  The choice depends
    only on indices of enclosing loops, so the compiler hoists it out of the free loops and
    the innermost loop keeps one add and one mask per read.  None where a read at a point
    satisfying `cond` could still leave the tensor (partial tiles, overshooting lanes)."""
    f, s = c.flat, c.sched
    t = f.inputs[i]
    blocked = constrained(f)
    if (s.staged and s.staged[i]) or not _inside_when_valid(c, t):
        return None
    width = c.span(t)
    free = [k for k in c.red_idx if k not in blocked]
    env = c.point_env(point)
    lo = hi = 0
    for k in free:  # a partial reduction tile stops at the range's end (`body`)
        top = f.ranges[k] - 1
        lo += min(0, t.strides[k] * top)
        hi += max(0, t.strides[k] * top)
    safe = -lo
    if safe + hi + width - 1 >= t.size:
        return None
    fixed = _lin([(t.strides[k], env[k]) for k in range(len(f.names)) if k not in free],
                 t.offset)
    rest = _lin([(t.strides[k], env[k]) for k in free], 0)
    return f"(({cond}) ? {fixed} : {safe}) + {rest}"


def _inside_when_valid(c, t) -> bool:
    """Whether every read of t at a point where all constraints hold is inside t: the
    register tile's positions stay in their ranges and vector lanes cannot overshoot."""
    for k in c.out_idx:
        if t.strides[k] and c.overhangs(k):
            return False
    return c.v is None or t.strides[c.v] == 0 or c.lanes_fit()


def binding_lane(c, ci: int, env: dict[int, str]) -> dict[int, str]:
    """`env` (a point's positions) with the vector index at the lane where constraint ci is
    tightest: the last where its coefficient is positive, else the first (a vector's
    position is its first lane's)."""
    v = c.v
    if v is None or c.W == 1 or v not in c.out_idx or c.flat.constraints[ci].coeffs[v] <= 0:
        return env
    return {**env, v: f"({env[v]} + {c.W - 1})"}


def lane_edge(c) -> list[str]:
    """The edge body of contraction c (`_Contraction`) where a constraint mentions the
    vector index (a padded pooling window's columns, an NCHW depthwise convolution's:
    `vector_candidates`): a point whose every lane meets the constraints is updated as a
    vector; one whose vector reads stay inside their tensors is updated as a vector too and
    keeps the lanes that meet them (`_masked_update`); any other walks its lanes one by one
    through a private copy of its accumulator, each read and updated under its constraints.
    Reads are in bounds where the constraints hold at a position inside the index box
    (`plan.flatten`), so positions past an index's range (a partial last tile, overshooting
    lanes) are tested too.  The interior (`Interior`, whose test covers every lane of the
    tile) has no tests."""
    f, v, width = c.flat, c.v, c.W
    cons = [ci for ci, kind in enumerate(c.cons_kind) if kind != "red"]
    over = [k for k in c.out_idx if c.overhangs(k)]
    if v not in over and not c.lanes_fit():
        over.append(v)
    out = []
    for j, point in enumerate(c.points):
        env = c.point_env(point)
        # Every lane passes where each constraint holds at the lane it binds at.
        whole = [c.constraint_text(ci, binding_lane(c, ci, env)) for ci in cons]
        end = f"({env[v]} + {width - 1})"  # the last lane's position
        whole += [f"({end if k == v else env[k]} < {f.ranges[k]})" for k in over]
        vector = c.update(f"a_{j}", [c.input_value(i, point, clamp=False)
                                     for i in range(len(f.inputs))])
        masked = _masked_update(c, j, point, cons, over)
        env[v] = f"({env[v]} + l)"
        vals = [clexpr.load(buf(t.name), _lin([(t.strides[k], env[k])
                                                for k in range(len(f.names))], t.offset),
                            t.dtype) for t in f.inputs]
        conds = [c.constraint_text(ci, env) for ci in cons]
        conds += [f"({env[k]} < {f.ranges[k]})" for k in over]
        lane = c.update("e[l]", vals, lanes=1)
        # The walk runs only where a vector read would leave its tensor (the first and last
        # rows of the buffer): left to LLVM, it becomes gathers under masks, which were a
        # quarter of what PoCL spent generating a padded max pool of 28 float16 points.
        walk = [f"    {_vec(c.ctype, width)} lv = a_{j}; {c.ctype}* e = ({c.ctype}*)&lv;",
                "    #pragma clang loop vectorize(disable)",
                f"    for (int l = 0; l < {width}; l += 1) if ({' && '.join(conds)}) "
                f"{{ {lane} }}",
                f"    a_{j} = lv;"]
        out.append(f"if ({' && '.join(whole)}) {{ {vector} }} else")
        if masked:
            # The constraints without the vector index fail for every lane or none.
            rest, inside, update = masked
            out += [f"if ({rest}) {{", f"  if ({inside}) {{ {update} }} else {{",
                    *walk, "  }", "}"]
        else:
            out += ["{", *walk, "}"]
    return out


def _masked_update(c, j: int, point: tuple[int, ...], cons: list[int],
                   over: list[int]) -> tuple[str, str, str] | None:
    """(test of the constraints without the vector index, test of the reads, statement)
    updating accumulator j at `point` as a whole vector and keeping the lanes that meet the
    constraints on the vector index.  Where the constraints without it
    hold and each vector read of the point lies inside its tensor, the lanes that fail read
    neighbouring elements (the previous row's last columns, say) whose results the select
    drops: an image's border columns then cost one vector update each instead of a walk
    over the lanes.  None where a lane mask cannot select the accumulator's elements (not
    32 bits wide) or no constraint mentions the vector index."""
    f, v, width = c.flat, c.v, c.W
    if c.ctype not in ("float", "int", "uint"):
        return None
    env = c.point_env(point)
    lanes = ", ".join(str(n) for n in range(width))
    lane_env = {**env, v: f"({env[v]} + (({_vec('int', width)})({lanes})))"}
    mask = [c.constraint_text(ci, lane_env) for ci in cons if f.constraints[ci].coeffs[v]]
    if v in over:
        mask.append(f"({lane_env[v]} < {f.ranges[v]})")
    if not mask:
        return None
    rest = [c.constraint_text(ci, env) for ci in cons if not f.constraints[ci].coeffs[v]]
    rest += [f"({env[k]} < {f.ranges[k]})" for k in over if k != v]
    inside = []
    for t in f.inputs:
        s = t.strides[v]
        if s:
            first = _lin([(t.strides[k], env[k]) for k in range(len(f.names))], t.offset)
            last = f"{first} + {(width - 1) * s}"
            inside += [f"({first if s > 0 else last} >= 0)",
                     f"({last if s > 0 else first} < {t.size})"]
    vals = [c.input_value(i, point, clamp=False) for i in range(len(f.inputs))]
    update = c.update("nv", vals)
    keep = " & ".join(mask)
    return (" && ".join(rest) or "1", " && ".join(inside) or "1",
            f"{_vec(c.ctype, width)} nv = a_{j}; {update} a_{j} = ({keep}) ? nv : a_{j};")
