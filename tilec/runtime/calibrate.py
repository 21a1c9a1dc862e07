"""Measuring what a device does fast: a second-long micro-benchmark run once per device and
driver (`tilec devices --calibrate`, or the first compile with nothing stored for it), kept
next to the device probe's result (`devices/calibrated.json` in the user cache directory).

What it times (OpenCL event time, rounds interleaved; kernels in `calibrate_kernels`):

- `fma(a,b,c)`, `mad(a,b,c)` and `a*b+c` on float vectors of every width the probe passed,
  eight independent accumulator chains a work-item, 4 work-groups a compute unit;
- the same chains multiplied by a vector read each step through vloadN or a plain pointer
  (where vloadN is a library call the chains are stored and reloaded around it);
- reads of a buffer 4x the last-level cache (DRAM), of half the L2 and half the L1 a
  work-group (repeated), and of local memory; on CPUs, reads of working sets from twice
  the aggregate L2 up to the DRAM buffer, doubling (`plan.read_curve`);
- an empty kernel (event and wall time) and the same with many work-groups, at the start and
  at the end (the quieter kept);
- the chosen mul-add once more at the end: where it runs SETTLE faster than it was measured,
  the machine was slowed for a while and the compute rates are measured again.

Measured on an AMD EPYC (Zen 4, 2 vCPUs), best-width GFLOP/s fma / mad / a*b+c:
PoCL 3.1 Debian (LLVM 15): 230 / 185 / 232 (mad is a separate multiply and add);
PyPI PoCL 3.0 (LLVM 14): 25 / 25 / 232 (fma and mad are calls: plan/calibration.py says why).
The host of that VM halves every rate for hundreds of milliseconds at a time, which is why
forms are compared within rounds (`choose_form`).

Whether compiles use it (Config.calibrate): None, the default, uses a calibration already
stored for the device and measures a CPU that has none on its first use (a GPU only when
asked); the stored facts stay, so a compile's output is the same every time until the user
calibrates again; True measures any device on first use; False ignores it.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DeviceError
from ..plan.calibration import (
    ACCESS_FORMS,
    Calibration,
    Round,
    choose_access,
    choose_form,
    form_table,
)
from ..plan.hw import HwModel
from ..plan.hw_device import _host_caches
from ..plan.read_curve import ladder, non_increasing
from . import calibrate_kernels as ck

FORMAT = 5  # bump when the kernels or the meaning of a field change: old entries are ignored
ROUNDS = 3
ACCESS_ROUNDS = 5  # the access form must win every round (plan.calibration.choose_access)
FLOP_TARGET_S = 0.002  # each mul-add kernel's launch; long enough that launch cost is noise
READ_TARGET_S = 0.003
CURVE_ROUNDS = 5  # the read curve's rounds (interleaved over its working sets)
SETTLE = 1.15  # a mul-add rate this much faster at the end: measure compute again
SETTLE_TRIES = 2


def calibrated_path() -> Path:
    from ..memo import default_cache_root

    return default_cache_root() / "devices" / "calibrated.json"


def _key(info: Any) -> str:
    from .. import memo

    return memo.digest("calibrate", FORMAT, *info.facts_key)


def stored(info: Any, path: Path | None = None) -> Calibration | None:
    """The calibration stored for this device and driver (`DeviceInfo`), or None: none made
    yet, or an entry that is corrupt, foreign or from an older tilec."""
    from .. import memo

    found = memo.read_json(path or calibrated_path(), "calibrated")
    entry = found.get(_key(info)) if isinstance(found, dict) else None
    if not isinstance(entry, dict):
        return None
    try:
        return Calibration.from_json(entry.get("calibration"))
    except ValueError:
        return None


def remember(info: Any, cal: Calibration, path: Path | None = None) -> bool:
    """Store `cal` for this device (the file is rewritten through a temporary file and
    os.replace, so a reader sees the old file or the new one); False if unwritable."""
    from .. import memo

    path = path or calibrated_path()
    found = memo.read_json(path, "calibrated")
    found = found if isinstance(found, dict) else {}
    found[_key(info)] = {"label": info.label, "calibration": cal.to_json()}
    return memo.write_json(path, "calibrated", found)


def calibration_for(runtime: Any, measure: bool, path: Path | None = None) -> Calibration | None:
    """The stored calibration of the runtime's device; when there is none and `measure`,
    measure it now and store it."""
    cal = stored(runtime.info, path)
    if cal is None and measure:
        cal = calibrate(runtime.context, runtime.device, runtime.vector_limit,
                        runtime.info.label)
        remember(runtime.info, cal, path)
    return cal


def apply(model: HwModel, cal: Calibration | None) -> HwModel:
    """`model` with the measured fields of `cal` (unchanged without one)."""
    if cal is None:
        return model
    return replace(model, **cal.model_fields(),
                   source=f"{model.source}; measured by `tilec devices --calibrate`")


# -- measuring ---------------------------------------------------------------------------------

def calibrate(context: Any, device: Any, vector_limit: int | None, label: str = ""
              ) -> Calibration:
    """Measure `device` (about 1-2 s on a 2-core CPU, most of it PoCL compiling the kernels;
    0.3 s when PoCL's kernel cache has them or `warm` ran).  `label` names it in reports."""
    return _calibrate(context, device, vector_limit, label, dry=False)


def warm(context: Any, device: Any, vector_limit: int | None) -> None:
    """Every launch `calibrate` makes, made once with one iteration and small buffers: the
    program is built and each kernel's code generated for the work-group counts it will run
    with (PoCL generates a kernel's machine code at its first launch of a size), so that the
    calibration that follows only measures.  Meant for a thread while the compile reads its
    program (`device_model.open_ahead`); nothing is timed."""
    _calibrate(context, device, vector_limit, "", dry=True)


# Calibration programs built by `warm`, for `calibrate` in the same process, by (id of the
# context, text); each entry keeps its context, so that the id is not another's later.
_BUILT: dict[tuple[int, str], tuple[Any, Any]] = {}
_BUILT_LOCK = threading.Lock()


def _program(cl: Any, context: Any, text: str) -> Any:
    key = (id(context), text)
    with _BUILT_LOCK:
        found = _BUILT.get(key)
    if found is not None:
        return found[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # -w: PoCL's compiler prints its warnings to the process's stderr itself (on AVX2
        # CPUs "25 warnings generated." for the float16 kernels, whose calls change the
        # ABI), where a user's first compile would show them; the kernels are tilec's own.
        prg = _Kernels(cl, cl.Program(context, text).build(options=["-w"]))
    with _BUILT_LOCK:
        _BUILT[key] = (context, prg)
    return prg


class _Kernels:
    """A built program's kernels by attribute, each created once: `warm` and `calibrate`
    launch the same kernel objects (a kernel's generated code stays with it)."""

    def __init__(self, cl: Any, program: Any):
        self._cl, self._program = cl, program
        self._made: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._made:
            self._made[name] = self._cl.Kernel(self._program, name)
        return self._made[name]


def _calibrate(context: Any, device: Any, vector_limit: int | None, label: str, *,
               dry: bool) -> Calibration:
    import pyopencl as cl

    start = time.perf_counter()
    if not vector_limit:
        raise DeviceError(f"{label or device.name} failed the device probe: nothing to "
                          "calibrate")
    is_cpu = bool(int(device.type) & cl.device_type.CPU)
    cus = max(1, int(device.max_compute_units))
    # Widths the probe saw computed correctly, and no wider: the PyPI PoCL's LLVM 14 aborts
    # the process (not an error: "Cannot select ... fma") compiling a float16 fma on Zen 4.
    widths = tuple(w for w in ck.WIDTHS if w <= vector_limit)
    read_w = min(16 if is_cpu else 4, max(widths))
    # exp() at the width a row kernel walks with: a CPU's widest, a GPU's scalar.
    exp_w = max(widths) if is_cpu else 1
    # CPUs: one work-item a group, so that PoCL neither vectorises across work-items nor
    # loops over many; GPUs: full groups.
    local = 1 if is_cpu else min(256, 1 << (int(device.max_work_group_size).bit_length() - 1))
    queue = cl.CommandQueue(context, properties=cl.command_queue_properties.PROFILING_ENABLE)
    prg = _program(cl, context, ck.source(widths, read_w, exp_w))
    m = _Meter(cl, context, queue, local, dry)
    first_launch = _launch_costs(m, prg, cus)
    rounds = _muladd_rounds(m, prg, widths, 4 * cus)
    form, width, peak = choose_form(rounds)
    access = _access_rounds(m, prg, max(widths), 4 * cus)
    dram, l2, l1, lmem, curve = _bandwidths(m, prg, device, is_cpu, cus, read_w)
    exps = _exp_rate(m, prg, exp_w, 4 * cus)
    # Settled: a machine that ran the mul-adds slowly for a while (a shared VM's other
    # tenant: a 2-core Zen 4 measured 118 and 234 GFLOP/s in two calibrations a minute
    # apart, its bandwidths alike) runs them again at the end; where the rate has risen by
    # SETTLE, the compute measurements are taken again, the faster kept.
    for _ in range(SETTLE_TRIES):
        again = _muladd_rounds(m, prg, (width,), 4 * cus, (form,), 1)[0][(form, width)]
        if again < peak * SETTLE:
            break
        rounds = _muladd_rounds(m, prg, widths, 4 * cus)
        form, width, remeasured = choose_form(rounds)
        peak = max(again, remeasured)
        exps = max(exps, _exp_rate(m, prg, exp_w, 4 * cus))
    # Launch costs at the start and the end: the quieter of the two (a launch's cost is
    # threads waking, which a busy moment stretches: 0.26-1.55 us between processes).
    launch, wall, group = min(first_launch, _launch_costs(m, prg, cus))
    start_us = _start_cost(m, prg, cus) if is_cpu else 0.0
    return Calibration(
        muladd=form, muladd_vec=width, peak_gflops=peak, dram_gbs=dram, l2_gbs=l2, l1_gbs=l1,
        local_gbs=lmem, launch_us=launch, launch_wall_us=wall, group_us=group, exp_gops=exps,
        start_us=start_us,
        form_gflops=form_table(rounds), vector_access=choose_access(access),
        access_gflops=tuple(round(statistics.median(r[i] for r in access), 1)
                            for i in range(2)), read_gbs=curve,
        seconds=round(time.perf_counter() - start, 2), label=label)


class _Meter:
    """Launches with event timing."""

    def __init__(self, cl: Any, context: Any, queue: Any, local: int, dry: bool = False):
        self.cl, self.context, self.queue, self.local = cl, context, queue, local
        self.out = cl.Buffer(context, cl.mem_flags.READ_WRITE, 4 << 20)
        # Dry (`warm`): every count argument (iterations, vectors, repetitions) is 1, so a
        # launch reads a few vectors at the start of its buffer; times are a stand-in.
        self.dry = dry

    def run(self, kernel: Any, groups: int, *args: Any, local: int | None = None) -> float:
        """Seconds of device time of one launch of `groups` work-groups."""
        size = local or self.local
        if self.dry:
            args = tuple(np.int32(1) if isinstance(a, np.int32) else a for a in args)
        event = kernel(self.queue, (groups * size,), (size,), self.out, *args)
        event.wait()
        return 1e-3 if self.dry else (event.profile.end - event.profile.start) * 1e-9

    def buffer(self, nbytes: int) -> Any:
        if self.dry:
            nbytes = min(nbytes, 64 << 20)
        buf = self.cl.Buffer(self.context, self.cl.mem_flags.READ_WRITE, nbytes)
        # Zeros: fresh pages, and no denormals or NaNs to slow the additions.
        self.cl.enqueue_fill_buffer(self.queue, buf, np.float32(0), 0, nbytes).wait()
        return buf


def _scaled(t: float, n: int, target: float, lo: int, hi: int, step: int = 1) -> int:
    """An iteration count that makes a launch of `n` iterations taking `t` last `target`."""
    want = int(n * target / max(t, 1e-7))
    return max(lo, min(hi, want // step * step))


def _chain_rounds(m: _Meter, kernels: dict[Any, tuple[Any, int]], groups: int,
                  args: tuple[Any, ...], rounds: int) -> list[dict[Any, float]]:
    """GFLOP/s of chain kernels (`calibrate_kernels._chains_kernel`: key -> (kernel, vector
    width)), each launch sized to FLOP_TARGET_S, in `rounds` rounds that launch every kernel
    once (interleaved: a busy host slows a round's kernels alike)."""
    iters = {}
    for key, (k, _) in kernels.items():
        m.run(k, groups, *args, np.int32(64))  # PoCL compiles a kernel on its first launch
        t = m.run(k, groups, *args, np.int32(2048))
        iters[key] = _scaled(t, 2048, FLOP_TARGET_S, 256, 1 << 24)
    out = []
    for _ in range(rounds):
        r = {}
        for key, (k, w) in kernels.items():
            t = m.run(k, groups, *args, np.int32(iters[key]))
            r[key] = 2 * ck.CHAINS * w * iters[key] * groups * m.local / t * 1e-9
        out.append(r)
    return out


def _muladd_rounds(m: _Meter, prg: Any, widths: tuple[int, ...], groups: int,
                   forms: tuple[str, ...] = ck.FORMS, rounds: int = ROUNDS) -> list[Round]:
    kernels = {(f, w): (getattr(prg, ck.muladd_name(f, w)), w) for f in forms for w in widths}
    a, b = np.float32(0.999), np.float32(0.001)  # c <- c*a + b stays finite forever
    return _chain_rounds(m, kernels, groups, (a, b), rounds)


def _access_rounds(m: _Meter, prg: Any, w: int, groups: int) -> list[tuple[float, float]]:
    """(vloadN, plain pointer) GFLOP/s of the access kernels, ACCESS_ROUNDS rounds."""
    kernels = {f: (getattr(prg, ck.access_name(f)), w) for f in ACCESS_FORMS}
    vectors = m.buffer(64 * w * 4)  # zeros: c <- c*0 + 0.5 stays finite
    rounds = _chain_rounds(m, kernels, groups, (vectors, np.float32(0.5)), ACCESS_ROUNDS)
    return [(r["vload"], r["plain"]) for r in rounds]


def _exp_rate(m: _Meter, prg: Any, w: int, groups: int) -> float:
    """Billions of exp() a second (lanes), the best of ROUNDS launches."""
    k = prg.tilec_cal_exp
    a = np.float32(-1.0)
    m.run(k, groups, a, np.int32(16))  # PoCL compiles a kernel on its first launch
    t = m.run(k, groups, a, np.int32(256))
    n = _scaled(t, 256, FLOP_TARGET_S, 16, 1 << 22)
    per = ck.CHAINS * w * n * groups * m.local
    return max(per / m.run(k, groups, a, np.int32(n)) for _ in range(ROUNDS)) * 1e-9


def _read_rate(m: _Meter, kernel: Any, groups: int, chunk_bytes: int, w: int, buf: Any,
               reps: int | None, *extra: Any) -> float:
    """GB/s of `groups` groups each reading `chunk_bytes` `reps` times (None: as many as
    make a READ_TARGET_S launch)."""
    launch, nbytes = _read_launch(m, kernel, groups, chunk_bytes, w, buf, reps, *extra)
    return nbytes / statistics.median(launch() for _ in range(ROUNDS)) * 1e-9


def _read_launch(m: _Meter, kernel: Any, groups: int, chunk_bytes: int, w: int, buf: Any,
                 reps: int | None, *extra: Any) -> tuple[Any, int]:
    """(a launch of the read kernel returning its seconds, the bytes it reads), compiled,
    first touched and sized (`reps` None: to last READ_TARGET_S)."""
    n = max(4, chunk_bytes // (4 * w * m.local) // 4 * 4)  # vectors a work-item, 4 chains
    per = groups * m.local * n * 4 * w

    def once(r: int) -> float:
        return m.run(kernel, groups, buf, np.int32(n), np.int32(r), *extra)

    once(1)  # compile and first touch
    if reps is None:
        reps = _scaled(once(4), 4, READ_TARGET_S, 1, 1 << 20)
    return (lambda: once(reps)), per * reps


def _bandwidths(m: _Meter, prg: Any, device: Any, is_cpu: bool, cus: int, w: int
                ) -> tuple[float, float, float, float, tuple[tuple[float, float], ...]]:
    llc = int(device.global_mem_cache_size or 0)
    l1, l2 = _host_caches() if is_cpu else (16 << 10, llc)
    if is_cpu and not l2:
        l2 = min(llc, 1 << 20)
    l1 = l1 or 32 << 10
    read = prg.tilec_cal_read
    # DRAM: 4x the last-level cache, at least 64 MiB, within what one allocation may hold.
    # A GPU reads 64 MiB in tens of microseconds, too short to leave the launch's ramp behind:
    # it reads 512 MiB.
    least = 64 << 20 if is_cpu else 512 << 20
    dram_bytes = min(max(4 * llc, least), int(device.max_mem_alloc_size) // 2, 512 << 20)
    groups = 4 * cus
    big = m.buffer(dram_bytes)
    dram = _read_rate(m, read, groups, dram_bytes // groups, w, big, 1)
    if not is_cpu:
        # A GPU reaches its DRAM bandwidth only with many reads in flight (Little's law):
        # four groups a compute unit read 2.6 TB/s on an H200 whose kernels move 4 TB/s.
        many = 16 * cus
        dram = max(dram, _read_rate(m, read, many, dram_bytes // many, w, big, 1))
    # Caches: each group reads its own half-L1 / half-L2 chunk over and over; on a GPU the
    # L2 is shared, so the groups split half of it between them.
    l2_chunk = l2 // 2 if is_cpu else max(1 << 12, l2 // 2 // groups)
    l2_rate = _read_rate(m, read, groups, l2_chunk, w, big, None) if l2 else 0.0
    l1_rate = _read_rate(m, read, groups, l1 // 2, w, big, None)
    local_bytes = min(int(device.local_mem_size) // 2, 16 << 10)
    lmem = 0.0
    if local_bytes >= 4 * w * m.local * 4:
        n = max(4, local_bytes // (4 * w * m.local) // 4 * 4)
        lmem = _read_rate(m, prg.tilec_cal_local, groups, local_bytes, w, big, None,
                          m.cl.LocalMemory(n * m.local * 4 * w))
    curve = _read_curve(m, prg.tilec_cal_pass, groups, l2 * cus, dram_bytes, dram, w, big) \
        if is_cpu else ()
    return dram, l2_rate, l1_rate, lmem, curve


def _read_curve(m: _Meter, read: Any, groups: int, l2_total: int, dram_bytes: int,
                dram: float, w: int, big: Any) -> tuple[tuple[float, float], ...]:
    """(MiB, GB/s) of the groups reading the first `size` bytes of `big` over and over, a
    group a different chunk of it each pass (`calibrate_kernels.read_kernels`), for the
    sizes of `read_curve.ladder`; the largest is the DRAM read already measured, and the
    curve is made non-increasing.  Where the last-level cache ends is what this finds: a
    CPU's reported cache size can be far from it (`plan.read_curve`)."""
    # A step about half way round, coprime with the groups: every chunk is read once a pass.
    step = next(s for s in range(groups // 2 + 1, 2 * groups + 2) if math.gcd(s, groups) == 1)
    sizes = ladder(l2_total, dram_bytes)
    launches = {size: _read_launch(m, read, groups, size // groups, w, big, None,
                                   np.int32(step))
                for size in sizes if size != dram_bytes}
    # Rounds that read every size once, medians per size: a host's slow phase of a second or
    # two then falls on one round of every point, not on every round of a few.
    times: dict[int, list[float]] = {size: [] for size in launches}
    for _ in range(CURVE_ROUNDS):
        for size, (launch, _) in launches.items():
            times[size].append(launch())
    out = []
    for size in sizes:
        rate = dram if size == dram_bytes else \
            launches[size][1] / statistics.median(times[size]) * 1e-9
        out.append((size / 2**20, rate))
    return tuple((m, round(g, 1)) for m, g in non_increasing(tuple(out)))


def _start_cost(m: _Meter, prg: Any, cus: int, n: int = 2000) -> float:
    """Device us a kernel of short groups pays to set every compute unit to work: one group a
    unit against one group, each a serial chain of `n` mul-adds (the empty kernels of
    `_launch_costs` do not see it: one thread runs all their groups before the others wake).
    PoCL 5.0 on a 16-core Xeon: 22 us on one group, 45 us on sixteen; PoCL 3.1 on a 2-core
    Zen 4: 3.4 and 4.5 us."""
    if cus < 2:
        return 0.0
    spin, count = prg.tilec_cal_spin, np.int32(n)
    one, all_ = [], []
    for _ in range(2):
        m.run(spin, 1, count, local=1)
        m.run(spin, cus, count, local=1)
    for _ in range(9):
        one.append(m.run(spin, 1, count, local=1))
        all_.append(m.run(spin, cus, count, local=1))
    return max(0.0, statistics.median(all_) - statistics.median(one)) * 1e6


def _launch_costs(m: _Meter, prg: Any, cus: int) -> tuple[float, float, float]:
    """(event us, wall us) of an empty one-group kernel, and device us per extra group."""
    empty = prg.tilec_cal_empty
    m.run(empty, 1, local=1)
    events, walls = [], []
    for _ in range(15):
        t0 = time.perf_counter()
        events.append(m.run(empty, 1, local=1))
        walls.append(time.perf_counter() - t0)
    many = 256 * cus
    m.run(empty, many, local=1)
    big = statistics.median(m.run(empty, many, local=1) for _ in range(5))
    one = statistics.median(events)
    return one * 1e6, statistics.median(walls) * 1e6, max(0.0, big - one) / (many - 1) * 1e6
