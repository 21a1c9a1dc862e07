"""A CPU contraction kernel's time, predicted in seconds from the device's calibrated facts,
with the resource that limits it: the CPU half of the time model (`predict` dispatches here for
hardware models of kind "cpu").

The kernel is the one `schedule` and `codegen` make for a CPU: one work-item per output tile,
the tile a register tile of float vectors (v lanes), the reduction walked in chunks of the
tile, work-groups spread over the compute units (cores).  Its terms are those of the cycle
model in `cost_cpu` (`many_cpu`), with this module's coefficients in place of its constants:

    step    = max(fma ops / FMA_PORTS, loads / LOAD_PORTS, latency) + load issue x loads
              + stream x streams + line x L2 lines a step
              (fma ops: accumulator vectors x the instructions a v-lane vector takes where the
              core's full-speed width is narrower)
    item    = il x (red x step + chunk + loop x trips of the loops around the innermost
              + partial x accumulators where swept) + tile + store_run x (output runs - 1)
              + page x (pages its reads span - 1) cycles of one tile (il chunks; runs:
              `output_runs`; pages: `read_pages`)
    compute = ceil(wg / sweep / cores) x sweep x item / clock
              work-items (`sweep` tiles each) in waves over the cores
    L1      = operand bytes the steps load / the calibrated L1 bandwidth / active
    L2      = cost's L2 bytes (panels, outputs) / the calibrated L2 bandwidth / active
    DRAM    = (each input once x (run + run_bytes) / run + the output once) / the rate the
              device reads a working set of their size at (`read_curve`: calibrated; else
              the L3's, llc x L2, up to llc_mib and the DRAM bandwidth past it)
              + cost's panel re-reads past L2 / the L3's bandwidth, all / active
              (run: the bytes of the longest contiguous run a work-item reads, `input_runs`;
              active: the share of the cores the work-items occupy, at most 1)
    time    = launch + wg x group + start (every core set to work) + |compute, L1, L2, DRAM|_p

The clock is the one at which the cores reach the calibrated peak with two FMA pipes at their
full-speed vector width (`muladd_vec`, else vec_size), so a tile's compute term is its cycle
count against an ideal microkernel at the measured peak.  A tile cost rejects (over regs) is
predicted infinitely slow.  The coefficients are shared by every CPU (what differs between
CPUs comes from their calibration) and were fitted to tile sweeps of two of them together
(`CpuCoefficients`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cost_cpu import cpu_consts, input_streams, vector_lanes, vector_reads
from .edges import edge_work
from .flat import FlatContraction
from .hw import HwModel
from .layout import output_order, thread_split
from .read_curve import rate_at
from .schedule import distinct_points, windowed

PAGE_BYTES = 4096  # a memory page: hardware prefetchers follow a stream within one
# Indices into `predict.BOTTLENECKS` (compute, L2, DRAM, launch, registers, L1).
_COMPUTE, _L2, _DRAM, _LAUNCH, _REGS, _L1 = range(6)


@dataclass(frozen=True)
class CpuCoefficients:
    # Fitted by `benchmarks/fit_cpu.py` (coordinate descent on log error, regret and rank) to
    # 27 tile sweeps of two CPUs at once: a 2-core Zen 3 with the PyPI PoCL 3.0 and a 16-core
    # Skylake-AVX-512 Xeon with Debian's PoCL 5.0 (matrix products from 1x1024x4096 to 2048^3,
    # 3x3 convolutions at stride 1 and 2, a 1x1 convolution, a depthwise convolution, two max
    # pools), each machine's calibration giving its peak, bandwidths and launch costs.  The
    # coefficients before, fitted to one VM's tiles, predicted the larger matrix products
    # 1.15-1.56x slow on the Zen 3 and 1.23-1.26x on the Xeon.
    fma_ports: float = 2.0  # vector FMAs a core issues a cycle (the clock is derived from it)
    load_ports: float = 1.0  # operand loads a cycle (broadcasts and vloads of PoCL's code)
    latency: float = 1.6  # cycles of a step at least (FMA latency: few accumulators wait)
    load_issue: float = 0.075  # issue cycles an operand load adds (addresses, selects)
    stream: float = 1.6  # cycles per extra contiguous run an input's tile loads a step
    chunk: float = 0.23  # cycles per reduction chunk (loop set-up, pointer arithmetic)
    loop: float = 5.2  # cycles per trip of a loop around the innermost (masks, addresses)
    line: float = 0.005  # cycles a step waits per cache line it brings from L2 (not from L1)
    llc: float = 0.62  # bandwidth of re-reads from past L2 (the L3) over the L2 bandwidth
    llc_mib: float = 16.0  # tensors this small come from the L3, not DRAM (dev VM: 32 MiB)
    tile: float = 17.7  # cycles per work-item (indices, stores)
    partial: float = 0.7  # cycles per accumulator vector a swept tile keeps between chunks
    store_run: float = 10.0  # cycles per extra contiguous run a tile's stores write (addresses)
    # Cycles per extra page a work-item's tile reads an input across (a stream the hardware
    # prefetcher starts again): not in the 27-sweep fit; chosen by a scan over 17 sweeps of
    # both CPUs (objective 0.875 at 0 -> 0.778 at 8; panel copies and the depthwise layer).
    page: float = 8.0
    overlap: float = 2.45  # p of the p-norm joining compute and memory (inf: perfect overlap)
    # Bytes of a contiguous run at which reading a tensor from DRAM or L3 takes twice its
    # bytes' time (a run of r bytes reads at r / (r + run_bytes) of the bandwidth).
    run_bytes: float = 15.0
    launch_us: float = 5.0  # a launch, where the device was not calibrated
    group_us: float = 0.01  # a work-group's dispatch, where the device was not calibrated


DEFAULT = CpuCoefficients()


def predict_many_cpu(flat: FlatContraction, tiles: np.ndarray, hw: HwModel,
                     stats: dict[str, np.ndarray], dtype: str = "float32",
                     coeff: CpuCoefficients = DEFAULT) -> dict[str, np.ndarray]:
    """Predicted seconds ("time"), the limiting resource ("bottleneck", an index into
    `predict.BOTTLENECKS`) and every term for each row of `tiles`; `stats` are
    `cost.score_many`'s for the same rows (same keys as `predict.predict_many`, plus "l1_s",
    "waves" and "cycles": one work-item's)."""
    T = np.ascontiguousarray(tiles, dtype=np.int64)
    n = T.shape[0]
    es = hw.elem_size(dtype)
    me = max(1, hw.mem_width // es)
    c = cpu_consts(flat, hw, es, me)
    u, vmax, dot = c["u"], c["v"], c["dot"]
    outs = output_order(flat)
    v = vector_lanes(T[:, u], flat.ranges[u], vmax, c["shift"]) if u is not None \
        else np.ones(n, np.int64)
    # The threads split as in cost.score_many (one a group on CPUs: A is the tile itself).
    if outs:
        full = np.ones_like(T)
        full[:, outs] = T[:, outs]
        A = -(-T[:, outs] // thread_split(flat, full, hw.threads, me)[:, outs])
    else:
        A = np.ones((n, 0), np.int64)
    vecs = {j: (-(-A[:, j] // v) if k == u else A[:, j]) for j, k in enumerate(outs)}
    acc = np.ones(n, np.int64)
    for j in vecs:
        acc = acc * vecs[j]
    # A v-lane vector takes v / native instructions where the core's full-speed width is
    # narrower (float16 on Zen 4's two 256-bit pipes: calibrated full speed from float8).
    native = hw.muladd_vec or vmax
    width = np.maximum(1.0, v / native)
    nld = np.zeros(n)
    pages = np.zeros(n)  # past the first, over the inputs
    load_bytes = np.zeros(n)
    streams = np.zeros(n)
    # The loops of a chunk run the vector (or last unconstrained) index innermost; every trip
    # of the loops around it sets up masks and addresses again (a 3x3 convolution's i, j).
    reds = list(flat.reduce_indices)
    inner = max(reds, key=lambda k: (k == u, k not in windowed(flat), k), default=None)
    for t in flat.inputs:
        o = np.ones(n, np.int64)
        reads = vector_reads(t, u)
        for j, k in enumerate(outs):
            if t.strides[k] != 0:
                o = o * (vecs[j] if (k == u and reads) else A[:, j])
        o = o * window_share(flat, t, outs, A, T, inner, u)
        nld += o * (reads * width if reads else 1.0)
        load_bytes += o * (reads * v * es if reads else es)
        streams += input_streams(flat, t, outs, A)
        pages += read_pages(t, outs, A, es) - 1
    red = np.prod(T[:, list(flat.reduce_indices)], axis=1) if flat.reduce_indices \
        else np.ones(n, np.int64)
    if dot:
        red = red // v  # a step covers v lanes of the reduction
    fma = acc * width
    wg = stats["wg"].astype(np.float64)
    il = stats["il"].astype(np.float64)
    steps = wg * il * red
    lines = stats["l2_bytes"] / hw.mem_width / np.maximum(steps, 1)
    step = np.maximum(np.maximum(fma / coeff.fma_ports, nld / coeff.load_ports),
                      coeff.latency) + coeff.load_issue * nld + coeff.stream * streams \
        + coeff.line * lines
    trips = np.prod(T[:, [k for k in reds if k != inner]], axis=1) if len(reds) > 1 \
        else np.ones(n, np.int64)
    # A swept work-item (`sweep`) runs `swept` tiles in turn and keeps each one's partial
    # sums in private memory between reduction chunks: a vector stored and loaded again per
    # accumulator and chunk.
    swept = stats.get("sweep", np.ones(n, np.int64)).astype(np.float64)
    item = il * (red * step + coeff.chunk + coeff.loop * trips
                 + np.where(swept > 1, coeff.partial * acc, 0.0)) + coeff.tile \
        + coeff.store_run * (output_runs(flat, outs, A) - 1) + coeff.page * pages
    cores = max(1, hw.compute_units or hw.goal_groups // 4)
    clock = hw.peak_gflops * 1e9 / (cores * 2.0 * 2.0 * native)
    items = wg / swept  # work-items, each `swept` tiles
    waves = np.ceil(items / cores)
    compute = waves * swept * item / clock * edge_work(flat, T, u, distinct_points(flat))

    l1_bw = (hw.l1_gbs or 4 * hw.bandwidth_gbs) * 1e9
    l2_bw = (hw.l2_gbs or 2 * hw.bandwidth_gbs) * 1e9
    # Fewer work-items than cores leave the idle cores' caches and their share of DRAM's
    # bandwidth unused (a matrix-vector product in 8 work-items on 16 cores ran 2x slower
    # than in 16).
    active = np.minimum(1.0, items / cores)
    l1 = steps * load_bytes / l1_bw / active
    l2 = stats["l2_bytes"] / l2_bw / active
    # cost's DRAM bytes count every panel re-read past L2 as DRAM traffic; the CPUs have an
    # L3 that serves those re-reads, so only the tensors' own bytes come at DRAM bandwidth.
    unique = float(sum(c["sizes"]) + c["out_bytes"])
    beyond = np.maximum(stats["dram_bytes"] - unique, 0.0)
    # The first pass over the tensors at the rate the device reads a working set of their
    # size (its calibrated curve); without one, the L3's rate up to llc_mib and DRAM's past it.
    if hw.read_gbs:
        first_bw = rate_at(hw.read_gbs, unique) * 1e9
        if unique <= hw.read_gbs[0][0] * 2**20:
            # Below the smallest working set measured (twice the cores' L2s together) the
            # cores' L2s hold part of it: at least the L3's rate.
            first_bw = max(first_bw, coeff.llc * l2_bw)
    else:
        first_bw = coeff.llc * l2_bw if unique <= coeff.llc_mib * 2**20 \
            else hw.bandwidth_gbs * 1e9
    # Short runs read below the bandwidth: a work-item reading 64 B of each 256 B pixel (a
    # max pool's 16 of 64 channels) ran 1.5-2x slower than one reading whole pixels.
    first = np.full(n, float(c["out_bytes"]))
    for t, size in zip(flat.inputs, c["sizes"], strict=True):
        run = input_runs(flat, t, T) * es
        first = first + size * (run + coeff.run_bytes) / run
    dram = (first / first_bw + beyond / (coeff.llc * l2_bw)) / active
    # Setting every core to work costs the driver time the empty kernels of the launch's
    # calibration do not show (PoCL 5.0 on 16 cores: 22 us).  A kernel launched alone pays it
    # where its work-items reach several cores; a model's call runs its kernels in one phase
    # launch (`codegen.phases`) and pays it once.  It is charged to every tile alike, so that
    # it moves the predicted time and never trades cores for it in the ranking.
    fixed = ((hw.launch_us or coeff.launch_us) + items * (hw.group_us or coeff.group_us)
             + hw.start_us) * 1e-6
    terms = np.stack([compute, l2, dram, l1], axis=1)
    body = (terms ** coeff.overlap).sum(axis=1) ** (1.0 / coeff.overlap)
    over = stats["status"] != 0
    which = np.array([_COMPUTE, _L2, _DRAM, _L1])[terms.argmax(axis=1)]
    bottleneck = np.where(over, _REGS, np.where(fixed > body, _LAUNCH, which))
    time = np.where(over, np.inf, body + fixed)
    return {"time": time, "bottleneck": bottleneck, "compute_s": compute, "l1_s": l1,
            "l2_s": l2, "dram_s": dram, "fixed_s": fixed,
            "local_s": np.zeros(n), "latency_s": np.zeros(n), "issue": fma / coeff.fma_ports / step,
            "latency": np.minimum(1.0, fma / coeff.fma_ports / coeff.latency),
            "resident": np.ones(n), "acc": acc.astype(np.float64),
            "acc_regs": stats.get("vregs", acc).astype(np.float64),
            "reg_cap": np.full(n, float(hw.registers)), "waves": waves,
            "cycles": swept * item, "sweep": swept,
            # the rate the first pass over the tensors was read at (the read curve's, `tilec
            # explain` shows it beside the DRAM term)
            "read_gbs": np.full(n, first_bw / 1e9),
            # the GPU model's register terms: vector registers; no staging copies; no
            # local-memory reads
            "regs": stats.get("vregs", acc).astype(np.float64), "copies": np.zeros(n),
            "reads": np.zeros(n), "compiled_regs": np.zeros(n)}


def window_share(flat: FlatContraction, t, outs: list[int], A: np.ndarray, T: np.ndarray,
                 inner: int | None, u: int | None) -> np.ndarray:
    """The share of input t's loads a reduction step makes that are not repeats, per row: a
    window's innermost reduction index (unrolled) and the output index it slides with read
    the same elements at neighbouring points, and the compiler keeps one load of each where
    no bounds test stands between them (a bordered or unpadded input).  A 5x5 depthwise
    window over a tile of 7 pixels reads 7 + 4 pixels a row, not 7 x 5: mnasnet's 14x14x240
    layer on the Zen 4 measured 19-24 us where the loads counted apart predicted 35; read
    with bounds tests (each window point's own block) the same tile measured 33 us."""
    share = np.ones(A.shape[0])
    if flat.constraints or inner is None or not t.strides[inner]:
        return share
    step = t.strides[inner]
    # The output index the window slides along: the nearest multiple of its stride (a row's
    # stride is a multiple too, by the row's length, and shares nothing).
    slides = [(t.strides[k] // step, j) for j, k in enumerate(outs)
              if k != u and t.strides[k] and t.strides[k] * step > 0
              and t.strides[k] % step == 0]
    if not slides:
        return share
    s, j = min(slides)  # s: the window's stride, in steps of the reduction index
    a, r = A[:, j].astype(np.float64), T[:, inner].astype(np.float64)
    distinct = np.where(r >= s, s * (a - 1) + r, a * r)
    return share * distinct / (a * r)


def input_runs(flat: FlatContraction, t, T: np.ndarray) -> np.ndarray:
    """Elements of the longest contiguous run input t's reads make in one work-item's tile,
    per row of T (a tile over every index); overlapping windows merge too: a 3x3 stride-2
    pool's 2y+j over 7 y's and 3 j's is 15 pixels."""
    return _contiguous(t.strides, T)[0]


def read_pages(t, outs: list[int], A: np.ndarray, es: int) -> np.ndarray:
    """Pages input t's reads span in one work-item's tile, per row of A: along each output
    index it reads, its points a page or more apart each start a stream of their own, and
    nearer ones share a page in proportion (a panel copy reading 4 rows of a 4 KB-row matrix
    spans 4 pages, of a 2 KB-row one 2.5; 4 neighbouring pixels, about 1)."""
    o = np.ones(A.shape[0])
    for j, k in enumerate(outs):
        share = min(1.0, abs(t.strides[k]) * es / PAGE_BYTES)
        if share:
            o = o * (1.0 + (A[:, j] - 1) * share)
    return o


def output_runs(flat: FlatContraction, outs: list[int], A: np.ndarray) -> np.ndarray:
    """Contiguous runs of memory a work-item's output tile writes, per row of A (its points
    along `outs`): a 7 x 64 tile of a [.., 7, 64] block is one run of 448 floats; 7 rows a
    plane apart are 7 runs."""
    return _contiguous([flat.output.strides[k] for k in outs], A)[1]


def _contiguous(strides, extents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(length of the first run, number of runs) of the points a tile of `extents` (a column
    per stride) covers, per row: the indices by stride, each extending the run below it
    where its stride is at most that run's length, until one does not while its tile has
    several points; every index after that multiplies the runs."""
    n = extents.shape[0]
    runs, length = np.ones(n, np.int64), np.ones(n, np.int64)
    whole = np.ones(n, bool)  # the run so far is one dense block
    for j in sorted(range(len(strides)), key=lambda j: abs(strides[j])):
        s, e = abs(strides[j]), extents[:, j]
        if s == 0:
            continue
        grow = whole & (s <= length)
        length = np.where(grow, (e - 1) * s + length, length)
        runs = np.where(grow | (e == 1), runs, runs * e)
        whole = grow | (e == 1) & whole
    return length, runs
