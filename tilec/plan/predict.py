"""A GPU contraction kernel's time, predicted in microseconds from the device's facts, with the
resource that limits it.  The search ranks GPU tiles by it (`search`); PlaidML's score stays in
the cost log beside it, and `Config.cost_model = "plaidml"` ranks by the score alone.

The kernel is the one `schedule` and `codegen` make for a GPU: work-groups of `threads`
work-items, each holding a register tile of `acc` accumulators and reading its operands from
tiles staged in local memory, one reduction tile at a time.  With CU compute units:

    compute = per-CU groups x flops per group / (peak / CU x issue x latency)
        issue   = acc / (acc + local reads + ISSUE + tile cost / steps)   FMAs among the
                  instructions of a step (local reads: each input's values per step, in float4
                  reads; tile cost: a reduction tile's copies and barrier, over its steps)
        latency = min(1, warps / WARPS, warps x acc / ILP)   enough warps, and enough
                  independent FMAs among them, to cover the pipeline's latency
        warps   = resident groups x threads / 32; resident groups are limited by the groups a
                  CU gets, its local memory (l1_bytes) and its registers (acc + 2 x reads + 32
                  a work-item, 64K a CU) and threads (2 x max work-group)
    local   = local-memory passes (`local_banks`: the register tile's reads a step, the staging
              copies' stores a tile, of every warp) x 128 bytes, over the calibrated
              local-memory bandwidth (`local_bandwidth`: else a pass a clock a compute unit)
    latency = the reduction tiles a compute unit runs one after another (its groups over the
              resident ones, x tiles) x TILE_LATENCY: a global read and a barrier a tile
    L2      = every group's staged tiles (the local bytes of a reduction tile x tiles) and its
              output, over L2_PER_DRAM x the DRAM bandwidth
    DRAM    = every tensor once, over the DRAM bandwidth
    time    = launch + |compute, local, latency, L2, DRAM|_p + waves x group overhead
              (a p-norm: close to the largest term, imperfect overlap of the others)

A register tile with more accumulators than a work-item can hold (vector accumulators along a
reduction index count their lanes) spills; it is predicted infinitely slow.

The coefficients (ISSUE, WARPS, ILP, L2_PER_DRAM) are the model's few free parameters; their
values come from matmul and convolution tile sweeps on an H200 (BENCHMARKS.md), and `Coefficients`
carries them so that measurements can refit them for another device."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .cost_cpu import vector_lanes
from .flat import FlatContraction
from .gpu_form import PIPELINE_MIN_TRIPS, RUN
from .hw import HwModel
from .local_banks import PASS_BYTES, wavefronts
from .schedule import make_schedule, moves_back, vector_candidates
from .staged_pad import assign

BOTTLENECKS = ("compute", "L2", "DRAM", "launch", "registers", "L1", "local memory",
               "round trips")
# L1: CPUs; local memory: its passes (`local_banks`); round trips: reduction tiles in a row
# The GPU terms joined by the p-norm, in `predict_many`'s order, as indices into BOTTLENECKS.
_TERM_BOTTLENECKS = np.array([BOTTLENECKS.index(b) for b in
                              ("compute", "L2", "DRAM", "local memory", "round trips")])


@dataclass(frozen=True)
class Coefficients:
    issue: float = 8.0  # instruction slots per reduction step besides FMAs and local reads
    copy_slots: float = 4.0  # slots per element a work-item copies into local memory
    tile_slots: float = 32.0  # slots per reduction tile for its barrier and loop
    warps: float = 12.0  # resident warps a compute unit needs to issue every cycle
    ilp: float = 256.0  # resident warps x accumulators for the FMA latency to be covered
    l2_per_dram: float = 0.44  # L2-to-CU bandwidth of staging copies over DRAM bandwidth
    overlap: float = 2.0  # p of the p-norm that joins the terms (infinity: perfect overlap)
    # A reduction tile cannot take less than a global read's round trip and a barrier: the
    # H200's 4096 matmul at 128x128 ran 2.9, 3.9, 5.8 and 9.2 ms with reduction tiles of 8,
    # 4, 2 and 1 (each halving adds about 0.28 us a tile for each group an SM holds).
    tile_latency_us: float = 0.45
    launch_us: float = 5.0  # a kernel's launch, where the device was not calibrated
    group_us: float = 0.5  # a wave of work-groups' set-up and stores


DEFAULT = Coefficients()


def can_predict(hw: HwModel) -> bool:
    """Whether the model has the facts a prediction needs (a GPU or CPU with peak and
    bandwidth; CPUs are predicted by `predict_cpu`)."""
    return hw.kind in ("gpu", "cpu") and hw.peak_gflops > 0 and hw.bandwidth_gbs > 0


def predict_many(flat: FlatContraction, tiles: np.ndarray, hw: HwModel,
                 stats: dict[str, np.ndarray], dtype: str = "float32",
                 coeff: Coefficients = DEFAULT, exact: bool = True,
                 registers: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Predicted seconds ("time"), the limiting resource ("bottleneck", an index into
    BOTTLENECKS) and every term, for each row of `tiles`; `stats` are `cost.score_many`'s for
    the same rows.  `exact=False` splits threads the vectorised way PlaidML's layout does
    instead of as the schedule will (a search's first pass over up to millions of tiles; the
    schedule's split takes half a millisecond a tile).  `registers` (GPU): a work-item's
    registers as the device's compiler gave each row's kernel (`plan.registers`), in place
    of the estimate; 0 where not known."""
    if hw.kind == "cpu":
        from .predict_cpu import predict_many_cpu
        return corrected(predict_many_cpu(flat, tiles, hw, stats, dtype), hw)
    T = np.ascontiguousarray(tiles, dtype=np.int64)
    n = T.shape[0]
    es = hw.elem_size(dtype)
    cus = hw.compute_units or max(1, hw.goal_groups // 4)
    peak = hw.peak_gflops * 1e9
    dram_bw = hw.bandwidth_gbs * 1e9
    # Not the calibrated L2 bandwidth: staging copies are a few float4 reads a work-item in
    # flight, and they reached about 0.44 of the measured DRAM bandwidth (4.2 TB/s) in the
    # H200's sweeps (the tiles of a 2048 matmul at 64 x 64 move 1.07 GB in 0.54 ms).
    l2_bw = coeff.l2_per_dram * dram_bw

    acc, fmas, reads, threads, step_passes, tile_passes, staged_bytes = \
        (_register_tiles if exact else _register_tiles_fast)(flat, T, hw)
    # A work-item holds twice the accumulators PlaidML's budget plans (max_regs / threads):
    # 128 floats of them ran at 30 TFLOP/s on the H200, 256 spilled and ran 3.3x slower.
    cap = 2 * hw.max_regs / (hw.threads * es)
    spills = fmas > cap
    # A reduction tile's copies and barrier, spread over its steps (a work-item's reduction
    # points per tile).
    red = np.prod(T[:, list(flat.reduce_indices)], axis=1).astype(np.float64) \
        if flat.reduce_indices else np.ones(n)
    copies = stats["sm"] / es / threads
    per_step = (coeff.copy_slots * copies + coeff.tile_slots) / red
    issue = fmas / (fmas + reads + coeff.issue + per_step)

    wg = stats["wg"].astype(np.float64)
    il = stats["il"].astype(np.float64)
    per_cu = np.ceil(wg / cus)
    local_cu = hw.l1_bytes or 2 * (hw.local_mem_bytes or 49152)
    regs = fmas + 2 * reads + 32
    counted = np.zeros(n)
    if registers is not None:
        # The compiler's figure, allocated in whole units (NVIDIA: 256 registers a warp, 8 a
        # work-item): 147 registers hold 152, and a 256-thread group of them leaves no room
        # for a second.  The estimate is 16 registers off at best, too much at the 128
        # boundary where an SM's groups halve.
        counted = np.asarray(registers, np.float64)
        regs = np.where(counted > 0, np.ceil(counted / REGISTER_UNIT) * REGISTER_UNIT, regs)
    # The pipelined loop (`gpu_form`) doubles the local tiles where they fit and it applies.
    trips = np.prod(-(-np.asarray(flat.ranges)[list(flat.reduce_indices)]
                      // T[:, list(flat.reduce_indices)]), axis=1) if flat.reduce_indices \
        else np.ones(n)
    sm = np.where((trips >= PIPELINE_MIN_TRIPS)
                  & (2 * stats["sm"] <= (hw.local_mem_bytes or 49152)), 2 * stats["sm"],
                  stats["sm"])
    limit = np.minimum(np.floor(local_cu / np.maximum(sm, 1)),
                       np.floor(65536 / (threads * regs)))
    limit = np.minimum(limit, np.floor(2 * (hw.max_work_group_size or 1024) / threads))
    resident = np.maximum(1, np.minimum(per_cu, limit))
    warps = resident * np.ceil(threads / 32)
    latency = np.minimum(1.0, np.minimum(warps / coeff.warps, warps * fmas / coeff.ilp))
    points = wg * il * np.prod(T, axis=1)  # tiles past the ranges compute too
    compute = per_cu * (2 * points / wg) / (peak / cus * issue * latency)

    kv, lanes = _lanes(flat, T, hw)
    steps = red / lanes if kv is not None and kv in flat.reduce_indices else red
    local_bw = local_bandwidth(hw)
    local = wg * il * (steps * step_passes + tile_passes) * PASS_BYTES / local_bw \
        if local_bw else np.zeros(n)
    latency_s = np.ceil(per_cu / resident) * il * coeff.tile_latency_us * 1e-6
    # Inputs a split kernel reads through the cache (`cost.score_many`) come from DRAM once
    # (the DRAM term); what other work-groups read of them again comes from L2.
    # Where the L2's sector is known (`HwModel.sector_bytes`) a staging copy's reads count in
    # whole sectors: a tile that reads 2 channels of each pixel moves a 32-byte sector for 8
    # bytes (the H200's N=32 seed conv at ci=2 ran 3.5 ms where ci=4 tiles ran 3.1; over five
    # H200 sweeps rho rose by up to 0.17 and no first choice got slower).
    staged = np.maximum(stats["sm"], stats["sectors"]) if "sectors" in stats else stats["sm"]
    l2 = (wg * (il * staged + stats["mw"]) + stats.get("reread", 0)) / l2_bw
    unique = sum(t.size for t in flat.inputs) + flat.output.size
    dram = np.full(n, unique * es / dram_bw)
    launch = (hw.launch_us or coeff.launch_us) * 1e-6
    waves = np.ceil(per_cu / resident)
    fixed = launch + waves * coeff.group_us * 1e-6
    terms = np.stack([compute, l2, dram, local, latency_s], axis=1)
    # The terms overlap, but not perfectly: a p-norm is near the largest and still grows with
    # the others (tiles limited by the same resource are not all predicted alike).
    body = (terms ** coeff.overlap).sum(axis=1) ** (1.0 / coeff.overlap)
    which = _TERM_BOTTLENECKS[terms.argmax(axis=1)]
    bottleneck = np.where(spills, BOTTLENECKS.index("registers"),
                          np.where(fixed > body, BOTTLENECKS.index("launch"), which))
    time = np.where(spills, np.inf, body + fixed)
    # A tile whose schedule stages more than the device's local memory cannot be built (the
    # statistics' staging guess, `cost.score_many`, can miss a split the schedule declines).
    if hw.local_mem_bytes:
        over = staged_bytes > hw.local_mem_bytes
        time = np.where(over, np.inf, time)
        bottleneck = np.where(over, BOTTLENECKS.index("local memory"), bottleneck)
    return corrected({"time": time, "bottleneck": bottleneck, "compute_s": compute, "l2_s": l2,
            "dram_s": dram, "local_s": local, "latency_s": latency_s,
            "fixed_s": np.full(n, 0.0) + fixed, "issue": issue,
            "latency": latency, "resident": resident, "acc": acc,
            "acc_regs": fmas, "reg_cap": np.full(n, cap), "regs": regs, "compiled_regs": counted,
            "copies": copies, "reads": reads}, hw)


def local_bandwidth(hw: HwModel) -> float:
    """Bytes a second local memory serves: the calibrated figure, else a pass a clock on every
    compute unit (NVIDIA's 128 bytes a clock an SM: 33 TB/s for an H100's 132 SMs at 1.98 GHz,
    where an H200 measured 31); 0 where neither is known."""
    if hw.local_gbs:
        return hw.local_gbs * 1e9
    if hw.compute_units and hw.clock_mhz:
        return hw.compute_units * PASS_BYTES * hw.clock_mhz * 1e6
    return 0.0


# Registers a work-item is given in whole units of (NVIDIA allocates a warp's 256 at a time).
REGISTER_UNIT = 8


# Issue slots of one read of an input under a padding constraint: the read's address is
# clamped and its value selected against the constraint (`codegen.contraction` masked loads).
MASKED_READ_SLOTS = 3.0


def _read_slots(flat: FlatContraction, t, staged: frozenset[int] = frozenset()) -> float:
    """Slots a local read of input t costs: more where a constraint masks its values, but
    for the constraints in `staged`, which the kernel applies where it copies the input tile
    (`staged_pad`)."""
    used = {k for ci, c in enumerate(flat.constraints) if ci not in staged
            for k, x in enumerate(c.coeffs) if x}
    return MASKED_READ_SLOTS if any(t.strides[k] != 0 for k in used) else 1.0


def _padded_at_staging(s, hw: HwModel) -> frozenset[int]:
    """The constraints schedule `s`'s kernel applies in its staging copies
    (`staged_pad.assign`; a sum with a default value and outputs no point reaches keeps its
    tests there, which the flat table does not say: such sums are rare)."""
    return frozenset(ci for entries in assign(s, hw.kind == "gpu").values()
                     for ci, _, _ in entries)


def _lanes(flat: FlatContraction, T: np.ndarray, hw: HwModel) -> tuple[int | None, np.ndarray]:
    """The vector index (`schedule.vector_candidates`' first) and each row's lanes on it."""
    staged = hw.kind == "gpu" and hw.staging == "local"  # as `make_schedule` decides
    cands = vector_candidates(flat, staged=staged, cpu=hw.kind == "cpu",
                              lanes=hw.vec_size) if hw.vec_size > 1 else []
    kv = cands[0] if cands else None
    if kv is None:
        return None, np.ones(T.shape[0], np.int64)
    return kv, vector_lanes(T[:, kv], flat.ranges[kv], max(1, hw.vec_size),
                            moves_back(flat, kv, hw.kind == "cpu")).astype(np.int64)


def _register_tiles_fast(flat: FlatContraction, T: np.ndarray, hw: HwModel):
    """`_register_tiles` for every row at once, the threads split greedily: each doubling goes
    to the output index with the most points a thread left (the square-ish register tile
    `out_threads.split_threads` prefers), up to the thread budget."""
    n = T.shape[0]
    outs = list(flat.out_indices)
    kv, lanes = _lanes(flat, T, hw)
    dot = kv is not None and kv not in outs
    if not outs:
        reads = np.full(n, len(flat.inputs) * 1.0)
        return np.ones(n), lanes.astype(np.float64), reads, np.full(n, float(hw.threads)), \
            reads * -(-hw.threads // 32), np.zeros(n), np.zeros(n)
    units = T[:, outs].astype(np.float64)
    if kv in outs:
        j = outs.index(kv)
        units[:, j] = units[:, j] / lanes
    th = np.ones_like(units)
    rows = np.arange(n)
    for _ in range(max(1, hw.threads.bit_length())):
        left = np.where(th < units, units / th, 0.0)
        pick = left.argmax(axis=1)
        grow = (left[rows, pick] > 0) & (th.prod(axis=1) * 2 <= hw.threads)
        th[rows[grow], pick[grow]] *= 2
    pts = np.ceil(units / th)
    if kv in outs:
        pts[:, outs.index(kv)] *= lanes
    acc = pts.prod(axis=1)
    fmas = acc * (lanes if dot else 1)
    reads = np.zeros(n)
    for t in flat.inputs:
        vals = np.ones(n)
        for j, k in enumerate(outs):
            if t.strides[k] != 0:
                vals = vals * pts[:, j]
        if not dot:
            vec = kv is not None and t.strides[kv] == 1
            vals = vals / (lanes if vec else RUN)
        reads += np.ceil(vals) * _read_slots(flat, t)
    out_threads = th.prod(axis=1)
    threads = np.where(2 * out_threads >= hw.threads, out_threads, float(hw.threads))
    # Local-memory passes are not counted here (no schedule): a pass a warp's read, no stores.
    return acc, fmas, reads, threads, reads * np.ceil(threads / 32), np.zeros(n), np.zeros(n)


def _register_tiles(flat: FlatContraction, T: np.ndarray, hw: HwModel):
    """Per row, from the schedule the kernel will have (`schedule.make_schedule`): accumulator
    points a work-item holds, its multiply-adds a reduction step (points x vector lanes: the
    accumulator registers), its local reads a step (vectors along the vector index and runs
    count once), the work-items of a group, and a warp's local-memory passes a reduction step
    and a reduction tile (`local_banks`)."""
    uniq, inv = np.unique(T, axis=0, return_inverse=True)
    per = np.array([_schedule_facts(flat, tuple(int(v) for v in row), hw) for row in uniq])
    got = per[inv.reshape(-1)]
    return tuple(got[:, j] for j in range(7))


@functools.lru_cache(maxsize=1 << 14)
def _schedule_facts(flat: FlatContraction, tile: tuple[int, ...],
                    hw: HwModel) -> tuple[float, ...]:
    s = make_schedule(flat, tile, hw)
    outs = list(flat.out_indices)
    acc_counts = s.acc_counts()
    w, vi = s.vec, s.vec_index
    pts = {k: acc_counts[k] * (w if k == vi else 1) for k in outs}  # scalar points
    acc = float(np.prod([pts[k] for k in outs])) if outs else 1.0
    fmas = acc * (w if s.dot else 1)
    reads = local_reads = 0.0
    padded = _padded_at_staging(s, hw)
    for i, t in enumerate(flat.inputs):
        vals = float(np.prod([pts[k] for k in outs if t.strides[k] != 0])) if outs else 1.0
        if vi is not None and not s.dot and t.strides[vi] != 0:
            vals /= w  # vectors along the output's vector index
        if s.run is not None and s.run.input == i:
            vals /= RUN  # runs (`gpu_form`)
        reads += np.ceil(vals) * _read_slots(flat, t, padded)
        if s.staged and s.staged[i] is not None:  # not read through the cache
            local_reads += np.ceil(vals)
    banks = wavefronts(s)
    step_passes, tile_passes = banks if banks is not None else \
        (local_reads * -(-s.wg_threads // 32), 0.0)
    # A split reduction's threads take every split-th step of the tile each.
    step_passes /= s.split
    return acc, fmas, reads, float(s.wg_threads), step_passes, tile_passes, \
        float(s.staged_bytes)


def bottleneck_of(line: str) -> str:
    """The limiting resource a cost-log `Predicted:` line names."""
    return line.split("limited by ", 1)[1].split(" (", 1)[0] if "limited by " in line else ""


def corrected(pred: dict[str, np.ndarray], hw: HwModel) -> dict[str, np.ndarray]:
    """The prediction times the hardware model's correction for each row's limiting resource
    (`tune.correction`, fitted from measured tiles; 1 where none is known)."""
    factors = np.array([hw.correction(b) for b in BOTTLENECKS])
    if (factors == 1.0).all():
        return pred
    out = dict(pred)
    out["time"] = pred["time"] * factors[pred["bottleneck"].astype(np.int64)]
    return out


def _swept(pred: dict[str, np.ndarray], row: int) -> str:
    n = int(pred["sweep"][row]) if "sweep" in pred else 1
    return f", {n} tiles a work-item" if n > 1 else ""


def explain_line(pred: dict[str, np.ndarray], row: int) -> str:
    """One cost-log line: the predicted time, its limit and the terms behind it (a GPU's or,
    with L1 terms, a CPU's: `predict_cpu`)."""
    b = BOTTLENECKS[int(pred["bottleneck"][row])]
    cpu = "l1_s" in pred
    if b == "registers":
        what = "vector registers" if cpu else "accumulator registers"
        return (f"  Predicted: spills, limited by registers ({int(pred['acc_regs'][row])} "
                f"{what} a work-item; {int(pred['reg_cap'][row])} fit)")
    us = {k: pred[k][row] * 1e6 for k in ("time", "compute_s", "l2_s", "dram_s", "fixed_s")}
    head = (f"  Predicted: {us['time']:.1f} us, limited by {b} (compute {us['compute_s']:.1f} "
            f"us at issue {pred['issue'][row]:.2f}")
    if cpu:
        rate = f" at {pred['read_gbs'][row]:.0f} GB/s" if "read_gbs" in pred else ""
        return (f"{head}, L1 {pred['l1_s'][row] * 1e6:.1f} us, L2 {us['l2_s']:.1f} us, DRAM "
                f"{us['dram_s']:.1f} us{rate}, fixed {us['fixed_s']:.1f} us; "
                f"{int(pred['waves'][row])} waves of {int(pred['cycles'][row])} cycles, "
                f"{int(pred['acc'][row])} accumulators{_swept(pred, row)})")
    return (f"{head} x latency {pred['latency'][row]:.2f}, local memory "
            f"{pred['local_s'][row] * 1e6:.1f} us, round trips {pred['latency_s'][row] * 1e6:.1f}"
            f" us, L2 {us['l2_s']:.1f} us, DRAM {us['dram_s']:.1f} us, fixed "
            f"{us['fixed_s']:.1f} us; "
            f"{int(pred['resident'][row])} groups resident a compute unit, "
            f"{int(pred['acc'][row])} accumulators a work-item{_compiled(pred, row)})")


def _compiled(pred: dict[str, np.ndarray], row: int) -> str:
    """The registers the device's compiler gave the kernel, where it was asked."""
    counted = pred.get("compiled_regs")
    if counted is None or not counted[row]:
        return ""
    return f", {int(counted[row])} registers as compiled"
