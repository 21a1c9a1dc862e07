"""The OpenCL C of the calibration (`calibrate`): one program, built once."""

from __future__ import annotations

from ..plan.calibration import ACCESS_FORMS, MULADD_FORMS

FORMS = MULADD_FORMS
WIDTHS = (1, 2, 4, 8, 16)
# Independent accumulator chains a work-item: a mul-add's latency (4 cycles on Zen 4) times
# the units that issue one (2) needs 8 in flight to keep them busy.
CHAINS = 8
_HEX = "0123456789abcdef"


def _vec(w: int) -> str:
    return f"float{w}" if w > 1 else "float"


def _lanes(var: str, w: int) -> str:
    return " + ".join(f"{var}.s{_HEX[i]}" for i in range(w)) if w > 1 else var


def muladd_name(form: str, w: int) -> str:
    return f"tilec_cal_{form}{w}"


def _step(form: str, c: str) -> str:
    return {"fma": f"{c} = fma({c}, a, b);", "mad": f"{c} = mad({c}, a, b);",
            "mul_add": f"{c} = {c} * a + b;"}[form]


def _chains_kernel(name: str, w: int, params: str, setup: str, start: str, step: str,
                   first: str = "") -> str:
    """`n` iterations of CHAINS independent chains `c = step(c)` of float`w`s; the sum is
    stored so that nothing is dead code.  `start` gives chain i's first value from `x` and
    `{i}`, `step` its update from `{c}`; `first` is a statement each iteration begins with."""
    t = _vec(w)
    init = "\n".join(f"    {t} c{i} = ({t})({start.format(i=i)});" for i in range(CHAINS))
    body = "\n".join("        " + line for line in [first] * bool(first) +
                     [step.format(c=f"c{i}") for i in range(CHAINS)])
    total = " + ".join(f"c{i}" for i in range(CHAINS))
    return (f"__kernel void {name}(__global float* out, {params}const int n) {{\n"
            f"    const float x = (float)get_global_id(0);\n{setup.format(t=t)}{init}\n"
            f"    for (int i = 0; i < n; ++i) {{\n{body}\n    }}\n"
            f"    const {t} s = {total};\n"
            f"    out[get_global_id(0)] = {_lanes('s', w)};\n}}\n")


def muladd_kernel(form: str, w: int) -> str:
    """CHAINS independent `c = c*a + b` chains in `form`."""
    return _chains_kernel(muladd_name(form, w), w, "const float a0, const float b0, ",
                          "    const {t} a = ({t})(a0);\n    const {t} b = ({t})(b0);\n",
                          "x + {i}.0f", _step(form, "{c}"))


def access_name(form: str) -> str:
    return f"tilec_cal_access_{form}"


def access_kernels(w: int) -> str:
    """CHAINS chains `c = c * v + b` of float`w`s whose `v` is a vector read from global memory
    each iteration (64 vectors, always in L1), once through vloadN and once through a plain
    pointer (`plain`: the buffer is aligned, every vector starts on a multiple of w).  Where
    vloadN is a library call the chains live across it and go to the stack and back."""
    t = _vec(w)
    reads = {"vload": f"vload{w}(0, a + (i & 63) * {w})" if w > 1 else "a[i & 63]",
             "plain": f"*((__global const {t}*)(a + (i & 63) * {w}))"}
    return "\n".join(
        _chains_kernel(access_name(form), w, "__global const float* a, const float b0, ",
                       "    const {t} b = ({t})(b0);\n", "x + {i}.0f", "{c} = {c} * v + b;",
                       first=f"const {t} v = {reads[form]};")
        for form in ACCESS_FORMS)


def read_kernels(w: int) -> str:
    """Sums of `n` vectors a work-item, `reps` times: from global memory (each group its own
    chunk, work-items interleaved so that a GPU's reads coalesce) and from local memory; and
    passes over a working set (`tilec_cal_pass`): each repetition a group reads the chunk
    `step` groups on, so that no group reads again what it has just read (its core's L2 would
    serve that) while the groups together read the whole working set each time."""
    t = _vec(w)
    head = "    const int L = get_local_size(0);\n    const int lid = get_local_id(0);\n"
    pass_p = ("        const int c = (get_group_id(0) + r * step) % get_num_groups(0);\n"
              f"        __global const {t}* p = a + c * L * n + lid;\n")
    return (f"__kernel void tilec_cal_read(__global float* out, __global const {t}* a, "
            f"const int n, const int reps) {{\n{head}"
            f"    __global const {t}* p = a + get_group_id(0) * L * n + lid;\n{_sums(t, w)}}}\n\n"
            "__kernel void tilec_cal_pass(__global float* out, __global const "
            f"{t}* a, const int n, const int reps, const int step) {{\n{head}"
            f"{_sums(t, w, pass_p)}}}\n\n"
            f"__kernel void tilec_cal_local(__global float* out, __global const {t}* a, "
            f"const int n, const int reps, __local {t}* buf) {{\n{head}"
            f"    for (int i = lid; i < n * L; i += L) buf[i] = a[get_group_id(0) * L * n + i];\n"
            "    barrier(CLK_LOCAL_MEM_FENCE);\n"
            f"    __local const {t}* p = buf + lid;\n{_sums(t, w)}}}\n")


def _sums(t: str, w: int, each_rep: str = "") -> str:
    """The read kernels' body: four chains summing `n` vectors of `p` (stride L), `reps`
    times, `each_rep` (lines) first in every repetition; the sum is stored."""
    return (f"    {t} s0 = ({t})(0.0f), s1 = s0, s2 = s0, s3 = s0;\n"
            f"    for (int r = 0; r < reps; ++r) {{\n{each_rep}"
            "        for (int i = 0; i < n; i += 4) {\n"
            "            s0 += p[i * L]; s1 += p[(i + 1) * L];\n"
            "            s2 += p[(i + 2) * L]; s3 += p[(i + 3) * L];\n"
            "        }\n    }\n"
            f"    const {t} s = s0 + s1 + s2 + s3;\n"
            f"    out[get_global_id(0)] = {_lanes('s', w)};\n")


def exp_kernel(w: int) -> str:
    """CHAINS independent `c = exp(c * a)` chains (a = -1: c settles near 0.567 and stays
    finite), the rate of exp() at width w as a kernel written by tilec uses it (row kernels:
    softmax's exp)."""
    return _chains_kernel("tilec_cal_exp", w, "const float a0, ",
                          "    const {t} a = ({t})(a0);\n", "x * 1e-9f + {i}.0f * 0.01f",
                          "{c} = exp({c} * a);")


EMPTY = "__kernel void tilec_cal_empty(__global float* out) { }\n"
# A serial chain of `n` multiply-adds a work-item (a microsecond or two at n = 2000): one
# group against one a compute unit, the time the driver takes to set every core to work.
SPIN = """__kernel void tilec_cal_spin(__global float* out, const int n) {
    float a = out[get_global_id(0)];
    for (int i = 0; i < n; ++i) a = a * 0.999f + 0.5f;
    out[get_global_id(0)] = a;
}
"""


def source(widths: tuple[int, ...], read_width: int, exp_width: int = 1) -> str:
    parts = [muladd_kernel(f, w) for f in FORMS for w in widths]
    return "\n".join([*parts, access_kernels(max(widths)), read_kernels(read_width),
                      exp_kernel(exp_width), EMPTY, SPIN])
