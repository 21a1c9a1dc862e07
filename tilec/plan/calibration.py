"""What a device was measured to do fast (`tilec.runtime.calibrate` measures it): the frozen
record the hardware model takes its measured fields from, and the rules that turn raw timings
into choices (device-free, so that they are tested on synthetic timings).

The mul-add forms are the three ways OpenCL C spells `a * b + c`:

- "fma": `fma(a, b, c)`, one rounding; a builtin the driver must provide.
- "mad": `mad(a, b, c)`, any precision the driver likes.
- "mul_add": the plain expression, which the compiler may contract into an FMA instruction
  (OpenCL C contracts within an expression by default; tilec also builds with -cl-mad-enable).

They should all be one instruction.  They are not everywhere.  The PyPI PoCL 3.0 (LLVM 14)
on a Zen 4 (AMD EPYC, family 25 model 17) picks its kernel library by the host's features
(AVX-512: kernel-x86_64-...-avx512.bc, functions tagged target-cpu "skylake-avx512") but
compiles the kernel for "znver3", the newest AMD CPU LLVM 14 knows, which has no AVX-512.
LLVM inlines a callee only when its target features are a subset of the caller's, so the
library's `_Z7_cl_fmaDv8_fS_S_` (one `vfmadd213ps` behind push/mov/pop of a frame pointer)
stays a function: the kernel's loop is eight `call`s, each with every accumulator stored to
the stack and reloaded around it (POCL_LEAVE_KERNEL_COMPILER_TEMP_FILES=1 keeps the .so; see
its parallel.bc with llvm-dis-14).  `mad()` goes the same way (a call to vmulps + vaddps).
`a * b + c` never calls the library: clang contracts it into llvm.fmuladd, inlined as
`vfmadd213ps`.  Measured: float8 13-25 GFLOP/s with fma() against 116-232 with `a * b + c`
(both halve while the VM's host is busy; fma() stays 5-9x behind).  The same mismatch makes
LLVM 14 abort the process ("Cannot select ... fma") on a float16 `fma()`, which is why the
calibration stays within the widths the device probe passed (8 there).
Debian's PoCL 3.1 (LLVM 15, target skylake-avx512) inlines `fma()` but implements `mad()` as
a separate `vmulps` and `vaddps`: 182 GFLOP/s against 230 at float16.

vloadN/vstoreN are library functions too, and go the same way.  The PyPI PoCL 3.0 on an Intel
Xeon (family 6 model 167) compiles kernels for "rocketlake" (AVX-512, float16 vectors pass
the probe) and links the skylake-avx512 library, whose features (CLWB) rocketlake lacks: each
`vload16` in a matmul's k loop is a `call`, around which all 16 accumulators go to the stack
and back (tilec's 1024 matmul 78 GFLOP/s a core; read through a plain pointer, 193).  Where the
library inlines (Debian's PoCL 3.1, PoCL 5.0) the two forms compile alike, so the access form
("vload" or "plain") is measured like the mul-add form (`choose_access`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from .read_curve import describe_curve, normal_curve

MULADD_FORMS = ("fma", "mad", "mul_add")
DEFAULT_MULADD = "fma"  # what the codegen wrote before calibration existed
# Another form replaces the default only when it is this much faster: a calibration on a busy
# host must not flip the generated code on noise.
FORM_MARGIN = 1.2
# A vector width "runs at full speed" when it reaches this share of the form's best rate.
FULL_SPEED = 0.9
# How the codegen reads and writes whole vectors of global memory: vloadN/vstoreN, or a plain
# pointer to the vector type ("plain"; codegen/clexpr.py).  "" = not measured.
ACCESS_FORMS = ("vload", "plain")

# Timings of one calibration round: (form, vector width) -> GFLOP/s.
Round = Mapping[tuple[str, int], float]


@dataclass(frozen=True)
class Calibration:
    """One device's measured facts.  Rates in GFLOP/s and GB/s, times in microseconds;
    0 means not measured (a bandwidth the device's cache queries gave no size for)."""

    muladd: str  # the fastest mul-add form (MULADD_FORMS)
    muladd_vec: int  # the narrowest float vector width at full speed in that form
    peak_gflops: float  # that form at its best width, best round
    dram_gbs: float  # reading a buffer much larger than the last-level cache
    l2_gbs: float  # reading a working set of half the L2, repeatedly
    l1_gbs: float  # the same for half the L1
    local_gbs: float  # reading local memory (on PoCL CPUs local memory is ordinary memory)
    launch_us: float  # an empty kernel: device time (OpenCL event)
    launch_wall_us: float  # an empty kernel: enqueue to completion, seen from the host
    group_us: float  # device time per extra work-group of an empty kernel
    exp_gops: float = 0.0  # exp() a second, in billions of lanes (0: not measured)
    # What a kernel of short groups pays to set every compute unit to work (CPUs: one group
    # a core against one group; 0: not measured).
    start_us: float = 0.0
    vector_access: str = ""  # ACCESS_FORMS: the faster way to read a vector ("": unmeasured)
    # GFLOP/s of the access kernel in each form (vload, plain), for reports.
    access_gflops: tuple[float, float] = (0.0, 0.0)
    # (form, width, median GFLOP/s) of every kernel measured, for reports.
    form_gflops: tuple[tuple[str, int, float], ...] = ()
    # (MiB, GB/s): every compute unit reading a buffer of that size over and over, from twice
    # the aggregate L2 up to past the last-level cache (CPUs; `read_curve`).
    read_gbs: tuple[tuple[float, float], ...] = ()
    seconds: float = 0.0  # how long the calibration took
    label: str = ""  # the device, as `tilec devices` names it

    def __post_init__(self) -> None:
        if self.muladd not in MULADD_FORMS:
            raise ValueError(f"mul-add form {self.muladd!r} is not one of {MULADD_FORMS}")
        if self.vector_access not in ("", *ACCESS_FORMS):
            raise ValueError(f"vector access {self.vector_access!r} is not one of "
                             f"{ACCESS_FORMS}")
        object.__setattr__(self, "access_gflops", tuple(float(x) for x in self.access_gflops))
        object.__setattr__(self, "form_gflops",
                           tuple((str(f), int(w), float(r)) for f, w, r in self.form_gflops))
        object.__setattr__(self, "read_gbs", normal_curve(self.read_gbs))

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["form_gflops"] = [list(t) for t in self.form_gflops]
        out["access_gflops"] = list(self.access_gflops)
        out["read_gbs"] = [list(t) for t in self.read_gbs]
        return out

    @classmethod
    def from_json(cls, data: Any) -> Calibration:
        """The record `to_json` wrote; ValueError when it is not one (a corrupt or old file)."""
        if not isinstance(data, dict):
            raise ValueError("not a table")
        names = {f.name for f in fields(cls)}
        # Calibrations stored before exp() was measured are still whole.
        data = {"exp_gops": 0.0, "start_us": 0.0, "read_gbs": [], **data}
        if set(data) != names:
            raise ValueError(f"fields {sorted(set(data) ^ names)} differ")
        try:
            values = {k: v for k, v in data.items()
                      if k not in ("form_gflops", "access_gflops", "read_gbs")}
            floats = {f.name for f in fields(cls) if f.type == "float"}
            for k in floats:
                values[k] = float(values[k])
            vload, plain = data["access_gflops"]
            return cls(**values, form_gflops=tuple(tuple(t) for t in data["form_gflops"]),
                       access_gflops=(vload, plain),
                       read_gbs=tuple(tuple(t) for t in data["read_gbs"]))
        except (TypeError, ValueError) as exc:
            raise ValueError(str(exc)) from None

    def model_fields(self) -> dict[str, Any]:
        """The `HwModel` fields this calibration sets (`dataclasses.replace(model, **...)`)."""
        return dict(muladd=self.muladd, muladd_vec=self.muladd_vec,
                    peak_gflops=round(self.peak_gflops, 1),
                    bandwidth_gbs=round(self.dram_gbs, 1), l2_gbs=round(self.l2_gbs, 1),
                    l1_gbs=round(self.l1_gbs, 1), local_gbs=round(self.local_gbs, 1),
                    launch_us=round(self.launch_us, 2), group_us=round(self.group_us, 3),
                    exp_gops=round(self.exp_gops, 2), start_us=round(self.start_us, 2),
                    vector_access=self.vector_access,
                    read_gbs=tuple((mib, round(gbs, 1)) for mib, gbs in self.read_gbs))

    def describe(self) -> str:
        """Lines for `tilec devices`."""
        by_form: dict[str, list[str]] = {}
        for form, width, rate in self.form_gflops:
            by_form.setdefault(form, []).append(f"{width}:{rate:.0f}")
        rates = "; ".join(f"{f} " + " ".join(v) for f, v in by_form.items())
        bw = ", ".join(f"{name} {v:.1f} GB/s" for name, v in
                       (("DRAM", self.dram_gbs), ("L2", self.l2_gbs), ("L1", self.l1_gbs),
                        ("local", self.local_gbs)) if v > 0)
        return "\n".join([
            f"calibrated ({self.seconds:.1f} s): mul-add form {self.muladd}, full speed from "
            f"float{self.muladd_vec if self.muladd_vec > 1 else ''}, peak "
            f"{self.peak_gflops:.0f} GFLOP/s",
            f"  GFLOP/s by form and width: {rates}" if rates else "  (no rates)",
            f"  bandwidth: {bw}" if bw else "  bandwidth: not measured",
            *([f"  reads by working set: {describe_curve(self.read_gbs)}"]
              if self.read_gbs else []),
            f"  launch: {self.launch_us:.1f} us device, {self.launch_wall_us:.1f} us wall; "
            f"{self.group_us:.3f} us a work-group"
            + (f"; every core at work after {self.start_us:.1f} us" if self.start_us else "")
            + (f"; exp {self.exp_gops:.1f} G/s" if self.exp_gops else ""),
            *([f"  vector access: {self.vector_access} (vloadN {self.access_gflops[0]:.0f}, "
               f"plain pointer {self.access_gflops[1]:.0f} GFLOP/s)"]
              if self.vector_access else []),
        ])


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def choose_form(rounds: Sequence[Round]) -> tuple[str, int, float]:
    """(form, full-speed width, peak GFLOP/s) from rounds of interleaved timings.

    Forms are compared by the median over rounds of their rate relative to the default form
    within the same round, at the width where each does best: a host that slows the whole
    machine down for a while (a shared 2-core VM halves the rate for hundreds of milliseconds)
    slows every kernel of a round alike, so the ratio survives it.  The default ("fma") stays
    unless another form is FORM_MARGIN faster.  The width is the narrowest whose rate reaches
    FULL_SPEED of the chosen form's best width (ratios within rounds again); the peak is the
    best round's rate there, since the host's noise only ever takes time away."""
    # The form the codegen writes comes from here: on the PyPI PoCL 3.0 (Zen 4) it is
    # "mul_add", since its fma() and mad() are function calls (the module docstring says why);
    # on Debian's PoCL 3.1 fma() and a*b+c tie and "fma" stays.
    if not rounds:
        raise ValueError("no timings")
    keys = sorted({k for r in rounds for k in r})
    forms = [f for f in MULADD_FORMS if any(k[0] == f for k in keys)]
    widths = {f: sorted(w for g, w in keys if g == f) for f in forms}

    def ratio(a: tuple[str, int], b: tuple[str, int]) -> float:
        return _median([r[a] / r[b] for r in rounds if r.get(a, 0) > 0 and r.get(b, 0) > 0])

    def best_width(f: str) -> int:
        return max(widths[f], key=lambda w: (_median([r.get((f, w), 0.0) for r in rounds]), -w))

    base = DEFAULT_MULADD if DEFAULT_MULADD in forms else forms[0]
    base_key = (base, best_width(base))
    choice = base
    best_ratio = 1.0
    for f in forms:
        if f == base:
            continue
        rel = ratio((f, best_width(f)), base_key)
        if rel >= FORM_MARGIN and rel > best_ratio:
            choice, best_ratio = f, rel
    top = best_width(choice)
    width = next(w for w in widths[choice]
                 if w == top or ratio((choice, w), (choice, top)) >= FULL_SPEED)
    peak = max(r.get((choice, width), 0.0) for r in rounds)
    return choice, width, peak


def form_table(rounds: Sequence[Round]) -> tuple[tuple[str, int, float], ...]:
    """(form, width, median GFLOP/s) of every kernel, in form then width order."""
    keys = {k for r in rounds for k in r}
    order = sorted(keys, key=lambda k: (MULADD_FORMS.index(k[0]), k[1]))
    return tuple((f, w, round(_median([r[(f, w)] for r in rounds if (f, w) in r]), 1))
                 for f, w in order)


def choose_access(rounds: Sequence[tuple[float, float]]) -> str:
    """"vload" when vloadN was FORM_MARGIN faster than reading vectors through a plain
    pointer in every round (rates of the same kernel in both forms, measured one after the
    other), "plain" otherwise.  Where vloadN is a call the plain form wins by 3-4x every time;
    where it is inlined the two run alike, but PoCL's library writes vloadN lane by lane (16
    scalar loads that LLVM merges back into one), and generating a kernel's code took 2-5x
    longer with them (resnet50's 31 kernels: 10.6 s against 3.6 s of one core on PoCL 3.1,
    10.4 s against 3.6 s on PoCL 5.0; benchmarks/kernel_build_times.py).
    A host busy during some launches must not flip the generated code (the Xeon's PoCL 5.0,
    16 threads: one calibration measured vloadN 786 against 1326 GFLOP/s, the next 1434
    against 1438)."""
    if not rounds:
        raise ValueError("no timings")
    rel = min((v / p if p > 0 else 0.0) for v, p in rounds)
    return "vload" if rel >= FORM_MARGIN else "plain"
