"""How fast a CPU reads a working set of a given size: the calibrated curve of (MiB, GB/s).

One figure for "DRAM" and one for "L3" do not describe a CPU's memory.  Where the last-level
cache ends differs by machine and is not what the device reports: the GPU host's Xeon reports
300 MiB of L3 to OpenCL, yet with all 16 cores reading, a 32 MiB working set comes at 570 GB/s,
64 MiB at 380-490, 128 MiB at 230-270 and 256 MiB at 120-130 (its DRAM); the 2-core Zen 3
development VM (32 MiB of L3) reads 16 MiB at 110 GB/s, 24 MiB at 88 and 48 MiB or more at
30-37.  The calibration (`runtime.calibrate`) measures the rate at working sets from twice
the aggregate L2 to past the last-level cache, doubling (`ladder`), and the CPU time model
reads a kernel's first pass over its tensors at the rate of their size, interpolated between
the points (`rate_at`).  A hardware TOML can give the curve as a table
`read_gbs = { 32 = 570.0, ... }`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

Curve = tuple[tuple[float, float], ...]


def normal_curve(points: Mapping[Any, Any] | Iterable[Any]) -> Curve:
    """(MiB, GB/s) pairs as floats, sorted by size; a mapping (a TOML table's string keys)
    is accepted.  ValueError for a size or rate that is not a positive number."""
    pairs = points.items() if isinstance(points, Mapping) else points
    out = []
    for pair in pairs:
        mib, gbs = pair
        mib, gbs = float(mib), float(gbs)
        if not (mib > 0 and gbs > 0 and math.isfinite(mib) and math.isfinite(gbs)):
            raise ValueError(f"read rate {gbs!r} GB/s at {mib!r} MiB: both must be positive")
        out.append((mib, gbs))
    out.sort()
    if len({m for m, _ in out}) != len(out):
        raise ValueError("a working-set size appears twice in the read curve")
    return tuple(out)


def rate_at(curve: Curve, nbytes: float) -> float:
    """GB/s of reading `nbytes` once more, interpolated linearly in log size and log rate
    between the curve's points and held at its ends (below the smallest working set measured,
    its rate; past the largest, DRAM's)."""
    mib = max(nbytes, 1.0) / 2**20
    if mib <= curve[0][0]:
        return curve[0][1]
    for (m0, g0), (m1, g1) in zip(curve, curve[1:], strict=False):
        if mib <= m1:
            f = math.log(mib / m0) / math.log(m1 / m0)
            return math.exp(math.log(g0) + f * (math.log(g1) - math.log(g0)))
    return curve[-1][1]


def ladder(l2_total: int, largest: int) -> list[int]:
    """Working-set bytes the calibration measures: twice the aggregate L2 (at least 1 MiB),
    doubling up to `largest`.  Not less: a working set the cores' L2s hold together is read
    from them only when each core reads what it read last time, which the next kernel of a
    program, reading what another kernel wrote, does not (a 16 MB matrix-vector product on
    the Xeon ran at 218 GB/s, its 32 MiB point measured 570)."""
    size = max(1 << 20, 2 * l2_total)
    out = []
    while size < largest:
        out.append(size)
        size *= 2
    return out + [largest]


def non_increasing(curve: Curve) -> Curve:
    """The measured curve made non-increasing in size (pooled adjacent violators, geometric
    means): a larger working set is not read faster than a smaller one, and on a host whose
    speed changes in phases a point measured in a slow one (the 2-core VM read 2 MiB at 74 and
    at 152 GB/s a minute apart) should not make the curve climb after it."""
    blocks: list[list[float]] = []  # [sum of log rates, count]
    for _, g in curve:
        blocks.append([math.log(g), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            s, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
    rates: list[float | None] = []  # None: a point that pooled with none keeps its rate
    for s, n in blocks:
        rates += [math.exp(s / n)] * int(n) if n > 1 else [None]
    return tuple((m, g if r is None else r) for (m, g), r in zip(curve, rates, strict=True))


def describe_curve(curve: Curve) -> str:
    return ", ".join(f"{_mib(m)} {g:.0f}" for m, g in curve) + " GB/s"


def _mib(m: float) -> str:
    return f"{m:g} MiB" if m >= 1 else f"{m * 1024:g} KiB"
