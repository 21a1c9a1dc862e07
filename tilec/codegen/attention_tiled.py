"""The GPU form of the attention kernel: both products as register-tiled matrix products.

The row form (`attention`) reads one local-memory value per multiply-add; a GPU issues local
reads several times slower than multiply-adds, so that form is bound by them (H200, B=8 H=12
T=512 d=64: 15 TFLOP/s).  Here a work-group of 128 work-items takes 64 query rows and walks the
keys 32 at a time, as 16 x 8 work-items:

- scores: each work-item computes a 4 x 4 block (rows ty*4.., keys tx*4..) from Q^T and K^T
  blocks in local memory, a float4 of each per depth step: 16 multiply-adds per 2 reads; K^T
  and V take turns in one local array (the group's local memory decides how many groups a
  compute unit holds: H200, d=64: 37 KB, six groups, where separate arrays allowed four);
- the score statements run on the 4 x 4 block; a row's maximum is met in local memory (the 8
  work-items of a row write their partial maxima, each reads the 8); the running sum stays
  per work-item (it is linear: rescaled by the same factor, summed once at the end);
- exp(score - max) goes to local memory as P^T; the output block of 4 rows x E/8 values is
  updated from P^T and the V block: 4 E/8 multiply-adds per 1 + E/32 reads;
- global reads overlap the arithmetic: V's block is read into registers before the scores are
  computed and stored after them, the next K block while the softmax and the value product
  run.

Shapes it takes (`tiled_rows`): depth and value sizes multiples of 4 and 32 (values at most
128), local memory for Q^T (64 rows, or 32 rows on 64 work-items for larger heads), K^T or V
(32 keys), P^T and the maxima within the device's limit.  Others use the row form.  Masked
rows and NaN: as the row form (see `attention`)."""

from __future__ import annotations

import math
from dataclasses import replace

from ..lang import ir
from ..plan.attention import AttentionKernel
from ..plan.attention_time import Form, choose
from ..plan.hw import HwModel
from . import clexpr
from .attention import (
    AttentionText,
    assemble,
    attention_source,
    decode,
    join_offsets,
    linear,
    shape_for,
    size_of,
    strides_of,
)
from .kernel_text import KernelSource, buf

BN, TX, RM = 32, 8, 4  # keys a block, work-items along them, rows a work-item
CN = BN // TX  # keys of a work-item's score block (4 x 4 with RM)
GROUPS = (16, 8)  # work-items along the rows, 64 rows a group first, else 32
PAD = 4  # keeps float4 alignment and spreads the transposed writes over the banks


def local_floats(D: int, E: int, ty: int) -> int:
    bm = ty * RM
    return D * (bm + PAD) + max(D * (BN + PAD), BN * E) + BN * (bm + PAD) + bm * TX


def tiled_rows(D: int, E: int, hw: HwModel) -> int | None:
    """Work-items along the rows (`GROUPS`: 64 query rows a group where local memory allows,
    32 for larger heads, d=128: 42 KB), or None where the tiled form does not fit."""
    limit = hw.local_mem_bytes or 48 * 1024
    if hw.kind == "cpu" or D % 4 or E % 32 or E // TX > 16:
        return None
    for ty in GROUPS:
        if local_floats(D, E, ty) * 4 <= limit and (hw.max_work_group_size or 1024) >= TX * ty:
            return ty
    return None


def attention_forms(k: AttentionKernel, hw: HwModel) -> list[Form]:
    """Every form this kernel can take on this device: the tiled one where it fits, then the
    row form at 16 to 128 query rows a work-group (each once)."""
    D, E = size_of(k, k.depth), size_of(k, k.values)
    out = []
    ty = tiled_rows(D, E, hw)
    if ty is not None:
        # Registers: the 4x4 scores, the 4 x E/8 output tile, addresses and the softmax's.
        out.append(Form("tiled", ty * RM, TX * ty, local_floats(D, E, ty) * 4,
                        RM * BN // TX + RM * E // TX + 32))
    seen = set()
    for want in (16, 32, 64, 128):
        rows, keys = shape_for(k, hw, want)
        if rows not in seen:
            seen.add(rows)
            # Registers: the query row, the output row and the rest.
            out.append(Form("rows", rows, rows, keys * (D + E) * 4, D + E + 32))
    return out


def attention_kernel(k: AttentionKernel, program: ir.Program, hw: HwModel,
                     rows: int | None = None, form: Form | None = None) -> KernelSource:
    """The kernel in `form`; with `rows` (forced), the row form with that many query rows a
    group; otherwise the form the time model predicts fastest (`plan.attention_time`)."""
    ranked: list[Form] = []
    if form is None and rows is not None:
        return attention_source(k, program, hw, rows)
    if form is None:
        form, ranked = choose(k, hw, attention_forms(k, hw))
    if form.form == "rows":
        src = attention_source(k, program, hw, form.rows)
    else:
        ty = form.rows // RM
        t = AttentionText(k, program, ty * RM, BN, muladd=hw.muladd)
        decls, body = tiled_body(t, k, ty)
        src = assemble(k, program, t, decls, body, TX * ty, tiled=True)
    if not math.isnan(form.predicted_s):
        src = replace(src, cost=src.cost + f"; predicted {form.predicted_s * 1e6:.4g} us, "
                      f"limited by {form.bottleneck}" + ("; next: " + ", ".join(
                          f"{f.describe()} {f.predicted_s * 1e6:.4g} us" for f in ranked[1:4])
                          if len(ranked) > 1 else ""))
    return src


def tiled_body(t: AttentionText, k: AttentionKernel, ty: int) -> tuple[list[str], list[str]]:
    """Declarations and body; `t` is the row form's text helper (`attention._Text`, made with
    `ty` * 4 rows a group), whose offsets, score statements and causal bound this form
    shares; `ty` rows of 8 work-items."""
    BM, WG = ty * RM, TX * ty
    D, E, NK = t.D, t.E, t.NK
    EN = E // TX
    QS, KS = BM + PAD, BN + PAD
    qdt, kdt, vdt = (t.t[a.tensor].dtype for a in (k.q, k.k, k.v))
    nq = size_of(k, k.query)

    def ma(a: str, b: str, c: str) -> str:
        return clexpr.muladd(a, b, c, t.muladd)

    decls = [f"__local float lq[{D * QS}] __attribute__((aligned(16)));  /* Q^T: depth x rows */",
             f"__local float lkv[{max(D * KS, BN * E)}] __attribute__((aligned(16)));  "
             "/* K^T (depth x keys), then V (keys x values) */",
             f"__local float lp[{BN * QS}] __attribute__((aligned(16)));  /* P^T: keys x rows */",
             f"__local float red[{BM * TX}] __attribute__((aligned(16)));  /* partial maxima */"]
    L = ["const int lid = get_local_id(0);", f"const int tx = lid % {TX};",
         f"const int ty = lid / {TX};", "const int blk = get_group_id(0);",
         *t.groups(), f"const int q0 = qb * {BM};  /* the group's first query row */"]
    if k.batch:
        L += decode("bt", k.batch, k, "x_")
    # Q^T into local memory once: element (row r, depth d) at lq[d * QS + r].
    L += [f"for (int t = lid; t < {BM * D}; t += {WG}) {{",
          f"    const int r = t / {D};", f"    const int d = t % {D};",
          "    const int qn = q0 + r;"]
    L += [f"    {x}" for x in decode("qn", k.query, k, "x_")]
    qrow = t.offset(k.q, k.depth)
    L += [f"    lq[d * {QS} + r] = qn < {nq} ? "
          f"{clexpr.load(buf(k.q.tensor), join_offsets(qrow, t.flat(k.q, k.depth, 'd')), qdt)}"
          " : 0.0f;",
          "}"]
    L += [f"float o[{RM}][{EN}];", f"float m[{RM}];", f"float l[{RM}];  /* this work-item's "
          "part of the running sum */", "#pragma unroll", f"for (int a = 0; a < {RM}; ++a) {{",
          "    m[a] = -INFINITY;", "    l[a] = 0.0f;", "    #pragma unroll",
          f"    for (int e = 0; e < {EN}; ++e)", "        o[a][e] = 0.0f;", "}"]
    L.append(f"const int kend = {t.key_bound()};")
    kb = t.offset(k.k, (k.key, *k.depth)) if set(k.k.names) - {k.key, *k.depth} else "0"
    vb = t.offset(k.v, (k.key, *k.values)) if set(k.v.names) - {k.key, *k.values} else "0"
    ks = strides_of(t.t[k.k.tensor], k.k)[k.key]
    vs = strides_of(t.t[k.v.tensor], k.v)[k.key]
    per = -(-BN * E // (WG))  # V elements each work-item carries into local memory
    kper = -(-BN * D // (WG))  # K elements each work-item carries

    def kfetch(start: str) -> list[str]:
        """The K block from key `start` into registers kr: one depth a work-item,
        consecutive work-items on consecutive depths (coalesced reads)."""
        at = join_offsets(kb, linear([("kj", ks)]), t.flat(k.k, k.depth, "d"))
        return ["#pragma unroll", f"for (int x = 0; x < {kper}; ++x) {{",
                f"    const int t = lid + x * {WG};",
                f"    const int kj = {start} + t / {D};", f"    const int d = t % {D};",
                f"    kr[x] = kj < {NK} && t < {BN * D} ? {clexpr.load(buf(k.k.tensor), at, kdt)}"
                " : 0.0f;", "}"]

    # The next K block is read while this one's softmax and value product run, and stored
    # (transposed: depth x keys) at the top of the next iteration.
    L += [f"float kr[{kper}];"] + kfetch("0")
    loop = ["barrier(CLK_LOCAL_MEM_FENCE);  /* the previous block is used up */",
            "#pragma unroll", f"for (int x = 0; x < {kper}; ++x) {{",
            f"    const int t = lid + x * {WG};",
            f"    if (t < {BN * D}) lkv[(t % {D}) * {KS} + t / {D}] = kr[x];", "}",
        "/* The V block is read now and stored into local memory once the scores are done",
        "   with K^T (the two share it): its latency hides behind the score product. */",
        f"float vr[{per}];", "#pragma unroll", f"for (int x = 0; x < {per}; ++x) {{",
        f"    const int t = lid + x * {WG};",
        f"    const int kj = j0 + t / {E};", f"    const int e = t % {E};",
        f"    vr[x] = kj < {NK} && t < {BN * E} ? "
        f"{clexpr.load(buf(k.v.tensor), join_offsets(vb, linear([('kj', vs)]), t.flat(k.v, k.values, 'e')), vdt)} : 0.0f;",  # noqa: E501
        "}",
        "barrier(CLK_LOCAL_MEM_FENCE);",
        f"float s[{RM}][{CN}];",
        "#pragma unroll", f"for (int a = 0; a < {RM}; ++a)", "    #pragma unroll",
        f"    for (int b = 0; b < {CN}; ++b)", "        s[a][b] = 0.0f;",
        "#pragma unroll 8", f"for (int d = 0; d < {D}; ++d) {{",
        f"    const float4 qa = *(__local const float4*)&lq[d * {QS} + ty * {RM}];",
        f"    const float4 kb = *(__local const float4*)&lkv[d * {KS} + tx * {CN}];",
        "    const float qv[4] = {qa.x, qa.y, qa.z, qa.w};",
        "    const float kv[4] = {kb.x, kb.y, kb.z, kb.w};",
        "    #pragma unroll", f"    for (int a = 0; a < {RM}; ++a)", "        #pragma unroll",
        f"        for (int b = 0; b < {CN}; ++b)",
        f"            s[a][b] = {ma('qv[a]', 'kv[b]', 's[a][b]')};  /* {k.qk.text} */"
        .replace("*/;", "*/"),
        "}",
        *kfetch(f"j0 + {BN}"),
        "#pragma unroll", f"for (int a = 0; a < {RM}; ++a) {{",
        "    const int qn = q0 + ty * 4 + a;"]
    loop += [f"    {x}" for x in decode("qn", k.query, k, "x_")]
    loop += ["    float mb = -INFINITY;", "    #pragma unroll",
             f"    for (int b = 0; b < {CN}; ++b) {{",
             f"        const int kj = j0 + tx * {CN} + b;",
             "        const float dot = s[a][b];"]
    loop += [f"        {x}" for x in t.scores()]
    loop += [f"        s[a][b] = kj < {NK} ? {t.ref(k.source)} : -INFINITY;",
             "        mb = fmax(mb, s[a][b]);", "    }",
             f"    red[(ty * {RM} + a) * {TX} + tx] = mb;", "}",
             "barrier(CLK_LOCAL_MEM_FENCE);  /* maxima written, K^T read */",
             "#pragma unroll", f"for (int x = 0; x < {per}; ++x)",
             f"    if (lid + x * {WG} < {BN * E}) lkv[lid + x * {WG}] = vr[x];",
             "#pragma unroll", f"for (int a = 0; a < {RM}; ++a) {{",
             f"    __local const float* rm = &red[(ty * {RM} + a) * {TX}];",
             "    float mb = rm[0];", "    #pragma unroll",
             f"    for (int x = 1; x < {TX}; ++x)", "        mb = fmax(mb, rm[x]);",
             "    const float mn = fmax(m[a], mb);",
             "    const float ms = mn == -INFINITY ? 0.0f : mn;  /* see `attention` */",
             "    const float alpha = exp(m[a] - ms);", "    m[a] = mn;",
             "    l[a] *= alpha;", "    #pragma unroll", f"    for (int e = 0; e < {EN}; ++e)",
             "        o[a][e] *= alpha;", "    #pragma unroll",
             f"    for (int b = 0; b < {CN}; ++b) {{",
             "        const float p = exp(s[a][b] - ms);", "        l[a] += p;",
             f"        lp[(tx * {CN} + b) * {QS} + ty * {RM} + a] = p;", "    }", "}",
             "barrier(CLK_LOCAL_MEM_FENCE);",
             "#pragma unroll 4", f"for (int j = 0; j < {BN}; ++j) {{",
             f"    const float4 pa = *(__local const float4*)&lp[j * {QS} + ty * {RM}];",
             "    const float pv[4] = {pa.x, pa.y, pa.z, pa.w};",
             f"    __local const float* vrow = &lkv[j * {E} + tx * {EN}];",
             "    #pragma unroll", f"    for (int e = 0; e < {EN}; e += 4) {{",
             "        const float4 vv = *(__local const float4*)&vrow[e];",
             "        #pragma unroll", f"        for (int a = 0; a < {RM}; ++a) {{",
             *(f"            o[a][e{o}] = {ma('pv[a]', f'vv.{c}', f'o[a][e{o}]')};"
               for o, c in (("", "x"), (" + 1", "y"), (" + 2", "z"), (" + 3", "w"))),
             "        }", "    }", "}"]
    L += [f"for (int j0 = 0; j0 < kend; j0 += {BN}) {{"] + [f"    {x}" for x in loop] + ["}"]
    # The row sums: each work-item's part, met in local memory.
    orow = t.offset(k.out, k.values)
    L += ["barrier(CLK_LOCAL_MEM_FENCE);", "#pragma unroll", f"for (int a = 0; a < {RM}; ++a)",
          f"    red[(ty * {RM} + a) * {TX} + tx] = l[a];", "barrier(CLK_LOCAL_MEM_FENCE);",
          "#pragma unroll", f"for (int a = 0; a < {RM}; ++a) {{",
          f"    const int qn = q0 + ty * {RM} + a;", f"    if (qn >= {nq}) continue;"]
    L += [f"    {x}" for x in decode("qn", k.query, k, "x_")]
    L += ["    float sum = 0.0f;", "    #pragma unroll", f"    for (int x = 0; x < {TX}; ++x)",
          f"        sum += red[(ty * {RM} + a) * {TX} + x];", "    #pragma unroll",
          f"    for (int e0 = 0; e0 < {EN}; ++e0) {{", f"        const int e = tx * {EN} + e0;",
          "        " + clexpr.store(buf(k.out.tensor),
                                    join_offsets(orow, t.flat(k.out, k.values, "e")),
                                    "o[a][e0] / sum", t.t[k.out.tensor].dtype), "    }", "}"]
    return decls, L
