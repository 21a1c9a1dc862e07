"""Which of a contraction's inner reduction loops are unrolled (`contraction._Contraction.loops`):
innermost first, while the copies of the body they make stay within a budget that code
generation time (PoCL's, NVIDIA's) and the kernels' speed set."""

from __future__ import annotations

from ..plan.schedule import constrained
from .interior import Interior

# Most copies of the innermost loop body that nested unrolled loops make (`loops`): past
# this, code generation slows (seconds on PoCL) and the kernels do not run faster.
UNROLL_COPIES = 16
# A GPU kernel that is not pipelined copies its loop body up to this many times.  The seed
# conv's N=1 224x224 tiles with ci=16 left their 16 channels rolled (48 copies): unrolled, both
# mirrors ran 0.103 ms on the H200 where rolled they took 0.119 and 0.152 (NVIDIA's compiler
# gave them 80 registers, 83 rolled).  A pipelined loop keeps UNROLL_COPIES: its N=32 tile with
# i=3 unrolled too took 130 registers (128 rolled), one group an SM fewer, 3.38 ms for 3.03.
GPU_UNROLL_COPIES = 64
# Where the vector lanes are constrained (a padded pool's window columns) each point's edge
# walks its lanes, and PoCL's time to generate the code grows faster than its length: copies
# x points stays within this.  resnet18's 3x3 max pool on Zen 4 (PoCL 3.1): 28 float16
# vectors took 17 s with the window unrolled, 5.5 s with its rows rolled, 1.9 s with both
# loops rolled (0.32, 0.33, 0.36 ms to run); 28 float8 vectors 2.5, 0.6 and 0.4 s (0.159,
# 0.160, 0.184 ms).
UNROLL_LANE_EDGE_POINTS = 64


def unrolled_loops(c, order: list[int]) -> set[int]:
    """The flat indices of contraction `c`'s inner loops to unroll, of its summed indices in
    loop `order` (outermost first)."""
    f, s = c.flat, c.sched
    # Nested unrolled loops copy the body the product of their trip counts: innermost
    # first, loops are unrolled while that product stays within UNROLL_COPIES.  A 7x7x3
    # stem convolution fully unrolled (147 copies) took PoCL 5-9 s to generate and ran
    # half as fast as with its outer loop rolled.
    unrolled, copies = set(), 1
    # A GPU loop over a tile in local memory may unroll 16 trips: the unrolled local reads
    # are what the compiler schedules around the FMAs.  Past UNROLL_COPIES only where the
    # loop is not pipelined (`GPU_UNROLL_COPIES`).
    longest = 8 if c.cpu else 16
    most = GPU_UNROLL_COPIES if not c.cpu and not c.pipe else UNROLL_COPIES
    points = len(c.points) if c.lanes_constrained else 0
    # A padded NHWC max or min pool (every summed index constrained): the interior test
    # runs at each window point (`Interior`) and each point has a masked copy too, so
    # the window stays rolled.  resnet50's 3x3 stride-2 pool on a Zen 4 (PoCL 3.1): code
    # generation 0.35 -> 0.23 s, the kernel 0.070 -> 0.074 ms.  (Lane edges have their
    # budget above; other sums over constrained indices, a defracted reshape's, run 2-5x
    # slower rolled.)
    per_point = c.cpu and not points and f.agg in (">", "<") and \
        Interior.applies(c) and set(c.red_idx) <= set(constrained(f))
    for k in reversed(order if not s.rolled and not per_point else []):  # rolled: tuned
        trips = -(-s.tile[k] // (c.W if k == c.v else 1))
        if trips > longest or copies * trips > most or \
                points * copies * trips > UNROLL_LANE_EDGE_POINTS:
            # A window read through a border (`plan.halo`) has no edge code to fold:
            # its loops outside a rolled one stay rolled (a third less code to generate
            # for resnet50's 3x3 convolutions; run times within noise).
            if c.cpu and c.flat.windowed and not c.flat.constraints:
                break
            continue
        unrolled.add(k)
        copies *= trips
    return unrolled
