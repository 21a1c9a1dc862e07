"""An epilogue in columns: post-ops and stores of an output whose vector lanes lie apart.

A CPU convolution over an NCHW tensor holds its output channels in the vector lanes (one
broadcast input value times a vector of filter values an FMA), but the output holds channels
a whole image apart, so `vector_finish` stores each accumulator lane by lane: a 16-lane
accumulator is 16 extracts and 16 scalar stores.  Its register tile also holds several
points along the output's unit-stride index (x), and those points' lane l are neighbours in
the output.  Here the accumulators of R such points (R of 2, 4, 8 or 16) are read as W
columns: column l is lane l of each, an R-vector of consecutive output elements.  The
post-ops run on columns (an operand that does not move along x is one broadcast value, one
that moves at unit stride a vector read), and each column is one vector store.  A 3x3
convolution of 64 channels at 4 points x 4 vectors stored 256 scalars; in columns it stores
64 4-vectors, and PoCL also generates its code in a fraction of the time.  From `LOOP_LANES`
lanes on the columns are one loop over the lanes rather than written out (`_looped`).

Columns apply on CPUs (`_Contraction.cpu`) where the plain epilogue would run the post-ops on
whole vectors (`vector_finish`) and store the lanes one by one; points whose positions along x
run past the output are stored as before, point by point, behind the same guards."""

from __future__ import annotations

from . import clexpr, vector_finish
from .kernel_text import LANES, buf

# Column widths: OpenCL vector sizes (3 is left out: clang reads and writes a 3-vector
# through a pointer as 4 elements).
WIDTHS = (16, 8, 4, 2)
# Accumulators of this many lanes or more have their columns taken in a loop (`_looped`).
LOOP_LANES = 4


def column_index(c) -> int | None:
    """The output index whose consecutive register points are consecutive output elements
    (unit output stride), where the lanes lie apart in the output; None where columns do
    not apply."""
    f, s, k_ = c.flat, c.sched, c.kernel
    if not c.cpu or not c.whole_vectors() or c.split or c.v is None or \
            f.output.strides[c.v] in (0, 1) or clexpr.COMPUTE[c.dtype] != "float":
        return None
    if k_.post_ops and not vector_finish.applies(c):
        return None
    for k in c.out_idx:
        if k != c.v and f.output.strides[k] == 1 and c.acc[k] >= 2 and s.threads[k] == 1 \
                and not s.ragged(k) and (s.run is None or s.run.index != k):
            return k
    return None


def groups(c, u: int) -> list[list[int]]:
    """Accumulator numbers in columns: points equal but along u, consecutive along it, in
    runs of `WIDTHS` (a point left over is a run of one), ordered by their first point."""
    at = c.out_idx.index(u)
    rows: dict[tuple, list[tuple[int, int]]] = {}
    for j, pt in enumerate(c.points):
        rows.setdefault(pt[:at] + pt[at + 1:], []).append((pt[at], j))
    out: list[list[int]] = []
    for row in rows.values():
        js = [j for _, j in sorted(row)]
        i = 0
        while i < len(js):
            r = next((w for w in WIDTHS if i + w <= len(js)), 1)
            out.append(js[i:i + r])
            i += r
    return sorted(out)


def finish(c, js: list[int], u: int) -> list[str]:
    """The columns of accumulators `js` (consecutive along u): post-ops and stores (the
    epilogue has declared `o`, the output offset of the first point's first lane).  From
    LOOP_LANES lanes on, the accumulators go to a private array once and a loop takes its
    columns in turn (`_looped`); below, each column is written out."""
    if c.W >= LOOP_LANES:
        return _looped(c, js, u)
    return _written_out(c, js, u)


def _looped(c, js: list[int], u: int) -> list[str]:
    """One loop over the lanes.  A tile of 4 points x 4 vectors of 16 lanes is 64 columns,
    each with its operand reads, post-ops and store; written out, they were most of a 3x3
    convolution's text and of the time PoCL takes to build it (resnet50's program: 1.13M ->
    0.61M characters, 13.2 -> 10.4 s of PoCL on one core)."""
    W, R = c.W, len(js)
    vtype = f"{c.ctype}{R}"
    sv = c.flat.output.strides[c.v]
    # A private array of the accumulators, read element by element through a scalar
    # pointer (no vloadN/vstoreN: a library call on some PoCL builds, `plan.calibration`).
    lines = [f"{c.ctype}{W} lanes_t[{R}];"]
    lines += [f"lanes_t[{i}] = a_{j};" for i, j in enumerate(js)]
    lines.append(f"const {c.ctype}* lanes_p = (const {c.ctype}*)lanes_t;")
    lines.append(f"for (int l = 0; l < {W}; l += 1) {{")
    cols = ", ".join(f"lanes_p[{i * W} + l]" for i in range(R))
    block = [f"const int ol = o + l * {sv};", f"const {vtype} v = (({vtype})({cols}));"]

    def at(name: str) -> tuple[str, str]:
        # Lane l of the first point: lane 0's offset and l steps along the lanes' index.
        into, off = c.at_output(name, js[0], 0, elem="ol")
        step = c.operand(name)[0][c.v]
        if off == "ol" or not step:
            return into, off
        return into, f"{off} + l" if step == 1 else f"{off} + l * {step}"

    _column_body(c, block, u, R, at)
    return lines + ["    " + ln for ln in block] + ["}"]


def _column_body(c, block: list[str], u: int, R: int, at) -> None:
    """A column's post-ops and stores, appended to `block` (which has declared `ol` and the
    column `v`); `at(name)`: the buffer and offset of tensor `name` at the column's lane."""
    k_ = c.kernel
    names = {k_.op.output: "v"}

    def ref(name: str) -> str:
        if name in names:
            return names[name]
        into, off = at(name)
        return vector_finish.operand(c, into, off, c.program.tensors[name].dtype,
                                     c.operand(name)[0][u], R)

    vector_finish.post_ops(c, block, ref, R, names)
    for w in k_.writes:
        dtype = c.program.tensors[w].dtype
        if w == k_.op.output:
            (into, off), step = (c.flat.output.name, "ol"), 1
        else:
            (into, off), step = at(w), c.operand(w)[0][u]
        block += _stores(c, into, off, names[w], dtype, R, step)


def _stores(c, into: str, at: str, value: str, dtype: str, R: int, step: int) -> list[str]:
    """A column's store: one vector where its elements are consecutive, else one by one
    (or one element: the last point's value is kept)."""
    if step == 1:
        return [clexpr.store(buf(into), at, value, dtype, R, unaligned=c.unaligned(dtype, R))]
    return [clexpr.store(buf(into), f"{at} + {i * step}", f"{value}.s{LANES[i]}", dtype)
            for i in (range(R) if step else [R - 1])]


def _written_out(c, js: list[int], u: int) -> list[str]:
    """Each column written out with its lane's constant offsets."""
    W, R = c.W, len(js)
    vtype = f"{c.ctype}{R}"
    sv = c.flat.output.strides[c.v]
    lines: list[str] = []
    for lane in range(W):
        elem = f"o + {lane * sv}" if lane else "o"
        block = ["{", f"const int ol = {elem};"]
        cols = ", ".join(f"a_{j}.s{LANES[lane]}" for j in js)
        block.append(f"const {vtype} v = (({vtype})({cols}));")
        _column_body(c, block, u, R,
                     lambda name, lane=lane: c.at_output(name, js[0], lane, elem="ol"))
        lines += block + ["}"]
    return lines
