"""A split reduction in the contraction kernel (`Schedule.split` threads on one reduction index).

Each output thread's work is shared by `split` threads ("ranks", `h_<index>`): rank r walks the
split index's tile from point r (vector r in dot mode) in steps of `split`, so partial tiles,
constraints, padding masks and hit flags all work per point as before.  After the reduction
loops every thread writes its accumulators (dot-mode vectors folded first) and hit flags to a
__local buffer, slot `get_local_id(0)`; a tree of log2(split) steps folds rank r + s into rank r
with the aggregation (+, *, max or min; hit flags OR-ed), one barrier after every step, outside
any branch, so every thread reaches every barrier.  Rank 0 then reads its combined values back
and runs the usual epilogue (default, post-ops, stores) alone.  Local staging is unchanged: the
staged tile is the whole tile, every thread (ranks included) copies a share and reads its own
points from it.
"""

from __future__ import annotations

from .kernel_text import _vec


def agg_pair(agg: str, ctype: str, a: str, b: str) -> str:
    """Two partial results combined with the aggregation (works on vectors too)."""
    if agg == "+":
        return f"({a} + {b})"
    if agg == "*":
        return f"({a} * {b})"
    if agg in (">", "<"):
        fn = ("fmax" if agg == ">" else "fmin") if ctype == "float" else \
            ("max" if agg == ">" else "min")
        return f"{fn}({a}, {b})"
    return b


class Split:
    def __init__(self, c) -> None:
        self.c = c
        s = c.sched
        self.k = s.split_index
        self.n = s.split
        self.name = c.flat.names[self.k]
        self.rank = f"h_{self.name}"
        self.rank_first = rank_first(c.flat, s)
        # Output threads that lie between two neighbouring ranks' slots.
        self.pitch = 1 if self.rank_first else s.out_threads
        self.wg = s.wg_threads
        self.folded = s.dot  # dot-mode vectors are folded before the combine
        self.lanes = s.vec if s.vec_index is not None and not s.dot else 1

    def rank_line(self) -> str:
        return f"const int {self.rank} = thr % {self.n}; thr /= {self.n};"

    def loop(self, loop: dict) -> dict:
        """The split index's inner loop: this rank's points of the tile.  Every rank runs the
        same trips (`v_<index>` from 0) and skips a point past the tile's end: PoCL 3.0's
        work-group vectorizer miscomputed a loop whose start depends on the work-item when it
        holds another loop (a depthwise kernel whose inner loop the driver left rolled), and
        a GPU compiler can unroll a loop whose trip count is a constant."""
        step, end, var = loop["step"], loop["end"], loop["var"]
        wide = step * self.n
        rank = f"{self.rank} * {step}" if step > 1 else self.rank
        trip = "v" + var[1:]
        lead = [f"const int {var} = {trip} + {rank};"]
        if end % wide:
            lead.append(f"if ({var} >= {end}) continue;")
        return dict(loop, var=trip, step=wide, unroll=False, lead=lead)

    def buffers(self) -> list[str]:
        elems = self.wg * len(self.c.points)
        out = [f"{_vec(self.c.ctype, self.lanes)} l_red[{elems}]"]
        if self.c.need_hit:
            out.append(f"int l_hit[{elems}]")
        return out

    def value(self, j: int) -> str:
        """Output point j's combined (scalar in dot mode) accumulator, in rank 0's epilogue."""
        return f"c_{j}" if self.folded else f"a_{j}"

    def combine(self) -> list[str]:
        c = self.c
        P = len(c.points)
        agg = c.flat.agg
        out = [f"/* Combine the {self.n} ranks' partial results along {self.name} "
               f"(tree in local memory). */",
               "const int sl = get_local_id(0);"]
        for j in range(P):
            val = c.horizontal(f"a_{j}") if self.folded else f"a_{j}"
            out.append(f"l_red[{j * self.wg} + sl] = {val};")
            if c.need_hit:
                out.append(f"l_hit[{j * self.wg} + sl] = hit_{j};")
        out.append("barrier(CLK_LOCAL_MEM_FENCE);")
        step = "s" if self.pitch == 1 else f"{self.pitch} * s"
        inner = []
        for j in range(P):
            here, there = f"l_red[{j * self.wg} + sl]", f"l_red[{j * self.wg} + sl + {step}]"
            inner.append(f"{here} = {agg_pair(agg, c.ctype, here, there)};")
            if c.need_hit:
                inner.append(f"l_hit[{j * self.wg} + sl] |= l_hit[{j * self.wg} + sl + {step}];")
        out.append(f"for (int s = {self.n // 2}; s > 0; s >>= 1) {{")
        out.append(f"    if ({self.rank} < s) {{")
        out += ["        " + s for s in inner]
        out.append("    }")
        out.append("    barrier(CLK_LOCAL_MEM_FENCE);")
        out.append("}")
        return out

    def wrap(self, epilogue: list[str]) -> list[str]:
        """Rank 0 reads the combined values back and finishes the outputs alone."""
        c = self.c
        ty = c.ctype
        head = []
        for j in range(len(c.points)):
            if self.folded:
                head.append(f"const {ty} c_{j} = l_red[{j * self.wg} + sl];")
            else:
                head.append(f"a_{j} = l_red[{j * self.wg} + sl];")
            if c.need_hit:
                head.append(f"hit_{j} = l_hit[{j * self.wg} + sl];")
        return [f"if ({self.rank} == 0) {{"] + ["    " + s for s in head + epilogue] + ["}"]


def rank_first(flat, sched) -> bool:
    """Whether neighbouring threads are neighbouring ranks (rather than neighbouring outputs):
    when some input's stride along the split index is below every input's stride along the
    output index that neighbouring output threads would take (softmax's row reduction reads
    along its unit-stride column), so that neighbouring threads read neighbouring elements."""
    outs = [k for k in sorted(flat.out_indices, key=lambda k: abs(flat.output.strides[k]))
            if sched.threads[k] > 1]
    if not outs:
        return True

    def least(k: int) -> float:
        return min((abs(t.strides[k]) for t in flat.inputs if t.strides[k]), default=float("inf"))

    return least(sched.split_index) < least(outs[0])


__all__ = ["Split", "agg_pair"]
