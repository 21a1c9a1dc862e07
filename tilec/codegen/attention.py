"""OpenCL C for an attention kernel (`plan.attention.AttentionKernel`): the scores, their
softmax and the product with V in one kernel, the scores never stored.

One work-item owns one query row: its row of Q and its row of the output stay in registers.  A
work-group holds `rows` query rows of one batch (they read the same K and V) and walks the keys
in blocks of `keys`: the block's K and V rows are loaded once into local memory by all the
work-items together, then every work-item computes its scores against them (each key row read
by all work-items at once: one local-memory read serves the whole group), updates its running
maximum m and sum l, rescales its accumulator by exp(m_old - m_new) once a block, and adds each
key's exp(score - m) * V row.  The output is the accumulator over l.

Where a whole row is -inf (all masked) the reference gives NaN (0/0 after exp(-inf - -inf));
so does this kernel: exp is taken against 0 while the maximum is still -inf, which gives p = 0
and l = 0, and the final 0/0 is NaN.  The same guard keeps a row whose first blocks are all
masked from turning NaN before its first real score arrives."""

from __future__ import annotations

import math

from ..lang import ir
from ..plan.attention import Access, AttentionKernel
from ..plan.hw import HwModel
from . import clexpr
from .kernel_text import (
    KernelArg,
    KernelSource,
    arg_decl,
    buf,
    check_int_offsets,
    row_major_strides,
    template_env,
)


def size_of(k: AttentionKernel, names) -> int:
    return math.prod(k.range(n) for n in names)


def shape_for(k: AttentionKernel, hw: HwModel, rows: int | None = None) -> tuple[int, int]:
    """(query rows a work-group, keys a block).  GPUs: 64 rows (two or more warps or
    wavefronts a group, so several groups share a compute unit) and 32 keys (32 scores in
    registers; the K and V blocks take 32 * (D + E) floats of local memory).  CPUs: 16 rows,
    the width PoCL vectorises the work-items of a group over."""
    queries = size_of(k, k.query)
    want = rows or (64 if hw.kind != "cpu" else 16)
    cap = hw.max_work_group_size or 256
    r = 1 << int(math.log2(max(1, min(want, cap))))
    while r > 8 and r // 2 >= queries:  # do not leave most of a group idle
        r //= 2
    return r, 32


def strides_of(t: ir.Tensor, acc: Access) -> dict[str, int]:
    return dict(zip(acc.names, row_major_strides(t.shape), strict=True))


def linear(terms: list[tuple[str, int]]) -> str:
    parts = [v if s == 1 else f"{v} * {s}" for v, s in terms if s]
    return " + ".join(parts) if parts else "0"


def decode(var: str, names: tuple[str, ...], k: AttentionKernel, prefix: str) -> list[str]:
    """`const int x_n = ...;` for `names` from the mixed-radix number `var` (last fastest)."""
    out, inner = [], 1
    for i, n in enumerate(reversed(names)):
        coord = var if inner == 1 else f"({var} / {inner})"
        if i < len(names) - 1:
            coord = f"{coord} % {k.range(n)}"
        out.append(f"const int {prefix}{n} = {coord};")
        inner *= k.range(n)
    return out[::-1]


class AttentionText:
    def __init__(self, k: AttentionKernel, program: ir.Program, rows: int, keys: int,
                 direct: bool = False, muladd: str = "fma"):
        self.k, self.program, self.R, self.B = k, program, rows, keys
        self.muladd = muladd  # the hardware model's mul-add form (clexpr.muladd)
        # CPUs: K and V read where they are (the caches hold them); no local memory, no
        # barrier (PoCL runs a group's work-items as a loop, split at every barrier).
        self.direct = direct
        self.t = program.tensors
        self.score = k.score_names()
        self.D, self.E = size_of(k, k.depth), size_of(k, k.values)
        self.NK = k.range(k.key)
        self.stmt = {op.output: op for op in k.ops}

    def coord(self, n: str) -> str:
        return "kj" if n == self.k.key else f"x_{n}"

    def offset(self, acc: Access, skip: tuple[str, ...] = ()) -> str:
        s = strides_of(self.t[acc.tensor], acc)
        return linear([(self.coord(n), s[n]) for n in acc.names if n not in skip])

    def flat(self, acc: Access, names: tuple[str, ...], var: str) -> str:
        """Offset of the flattened `names` (mixed radix, `var`) within `acc`'s tensor."""
        s = strides_of(self.t[acc.tensor], acc)
        if len(names) == 1:
            return linear([(var, s[names[0]])])
        terms, inner = [], 1
        for n in reversed(names):
            terms.append((f"(({var} / {inner}) % {self.k.range(n)})" if inner > 1
                          else f"({var} % {self.k.range(n)})", s[n]))
            inner *= self.k.range(n)
        return linear(terms[::-1])

    def broadcast(self, name: str) -> str:
        """Offset of a tensor broadcast to the scores, at (row, kj)."""
        shape = self.t[name].shape
        full = self.k.full
        lead = len(full) - len(shape)
        strides = row_major_strides(shape)
        return linear([(self.coord(self.score[lead + a]), strides[a])
                     for a in range(len(shape)) if shape[a] > 1])

    def ref(self, name: str) -> str:
        if name == self.k.qk.output:
            return "dot"
        if name in self.stmt:
            return f"f_{name}"
        return clexpr.load(buf(name), self.broadcast(name), self.t[name].dtype)

    def positional(self, x: ir.Op, _consts: list[str]) -> str:
        if x.op != "index":
            raise ValueError(f"{x.op} in an attention kernel")
        axis = int(x.args[0].value)  # type: ignore[union-attr]
        if x.shape[axis] == 1:
            return "0"
        return self.coord(self.score[len(self.k.full) - len(x.shape) + axis])

    def scores(self) -> list[str]:
        out = []
        for n in self.k.scores:
            op = self.stmt[n]
            ctype = clexpr.COMPUTE[self.t[n].dtype]
            text = clexpr.expr(op.expr, self.ref, positional=self.positional)
            out.append(f"const {ctype} f_{n} = {text};  /* {op.text} */".replace("*/;", "*/"))
        return out

    def key_bound(self) -> str:
        """How many keys the group visits: all, or up to the causal bound of its last row."""
        k = self.k
        if k.causal is None:
            return str(self.NK)
        a, c = k.causal
        if a.denominator != 1 or c.denominator != 1:
            return str(self.NK)
        q = size_of(k, k.query)
        first = f"qb * {self.R}"
        last = f"min({first} + {self.R - 1}, {q - 1})"
        n = k.range(k.query[-1])
        if len(k.query) > 1:
            # The query index of the group's last (first) row, or its extreme when the
            # group's rows wrap around it (they run over the slower query indices too).
            same = f"({first}) / {n} == ({last}) / {n}"
            last = f"({same} ? ({last}) % {n} : {n - 1})"
            first = f"({same} ? ({first}) % {n} : 0)"
        edge = last if a >= 0 else first
        scaled = edge if a == 1 else f"({edge}) * {int(a)}"
        return f"clamp({scaled} + {int(c) + 1}, 0, {self.NK})"

    def groups(self) -> list[str]:
        """`bt` (the batch) and `qb` (the block of query rows) of this work-group: the
        blocks of one batch next to each other (they read the same K and V: H200, B=8 H=12
        T=512, 0.28 ms against 0.31 the other way round), except under a causal bound, where
        the last blocks of every batch (the most keys) go first, so that the short ones fill
        the gaps at the end instead of a long one running alone (0.218 -> 0.175 ms)."""
        nb, nqb = size_of(self.k, self.k.batch), self.nqb
        what = f"/* the batch: {', '.join(self.k.batch) or 'one'} */"
        if self.k.causal and self.k.causal[0] >= 0:
            return [f"const int bt = blk % {nb};  {what}",
                    f"const int qb = {nqb - 1} - blk / {nb};  /* the block of query rows */"]
        return [f"const int bt = blk / {nqb};  {what}",
                f"const int qb = blk % {nqb};  /* the block of query rows */"]

    @property
    def nqb(self) -> int:
        return -(-size_of(self.k, self.k.query) // self.R)

    def body(self) -> tuple[list[str], list[str]]:
        k, R, B, D, E = self.k, self.R, self.B, self.D, self.E
        qdt, kdt, vdt = (self.t[a.tensor].dtype for a in (k.q, k.k, k.v))
        nq = size_of(k, k.query)
        decls = [] if self.direct else [
            f"__local float lk[{B * D}];  /* a block of {B} rows of {k.k.tensor} */",
            f"__local float lv[{B * E}];  /* and of {k.v.tensor} */"]
        lines = ["const int lid = get_local_id(0);", "const int blk = get_group_id(0);",
                 *self.groups(),
                 f"const int qn = qb * {R} + lid;  /* the query row: "
                 f"{', '.join(k.query)} */"]
        if k.batch:
            lines += decode("bt", k.batch, k, "x_")
        lines += decode("qn", k.query, k, "x_")
        lines.append(f"const bool live = qn < {nq};")
        qrow = self.offset(k.q, k.depth)
        lines += [f"float q[{D}];", "#pragma unroll", f"for (int d = 0; d < {D}; ++d)",
                  f"    q[d] = live ? {clexpr.load(buf(k.q.tensor), qrow + ' + ' + self.flat(k.q, k.depth, 'd'), qdt)} : 0.0f;",  # noqa: E501
                  f"float acc[{E}];", "#pragma unroll", f"for (int e = 0; e < {E}; ++e)",
                  "    acc[e] = 0.0f;",
                  "float m = -INFINITY;  /* the running maximum */",
                  "float l = 0.0f;  /* the running sum of exp(score - m) */",
                  f"const int kend = {self.key_bound()};",
                  f"for (int j0 = 0; j0 < kend; j0 += {B}) {{"]
        kb = self.offset(k.k, (k.key, *k.depth)) if set(k.k.names) - {k.key, *k.depth} else "0"
        vb = self.offset(k.v, (k.key, *k.values)) if set(k.v.names) - {k.key, *k.values} \
            else "0"
        ks = strides_of(self.t[k.k.tensor], k.k)[k.key]
        vs = strides_of(self.t[k.v.tensor], k.v)[k.key]
        # Direct reads clamp the key into the tensor (past its end the score is -inf, p = 0):
        # the loops keep constant bounds, so they unroll and the rows stay in registers.
        kat = join_offsets(kb, linear([('kc', ks)]), self.flat(k.k, k.depth, 'd'))
        vat = join_offsets(vb, linear([('kc', vs)]), self.flat(k.v, k.values, 'e'))
        clamp = [f"    const int kc = min(kj, {self.NK - 1});"] if self.direct else []
        kval = (clexpr.load(buf(k.k.tensor), kat, kdt) if self.direct else
                f"lk[jj * {D} + d]")
        vval = (clexpr.load(buf(k.v.tensor), vat, vdt) if self.direct else
                f"lv[jj * {E} + e]")
        staged = [
            "barrier(CLK_LOCAL_MEM_FENCE);  /* the previous block is used up */",
            f"for (int t = lid; t < {B * D}; t += {R}) {{",
            f"    const int kj = j0 + t / {D};", f"    const int d = t % {D};",
            f"    lk[t] = kj < {self.NK} ? "
            f"{clexpr.load(buf(k.k.tensor), join_offsets(kb, linear([('kj', ks)]), self.flat(k.k, k.depth, 'd')), kdt)} : 0.0f;",  # noqa: E501
            "}",
            f"for (int t = lid; t < {B * E}; t += {R}) {{",
            f"    const int kj = j0 + t / {E};", f"    const int e = t % {E};",
            f"    lv[t] = kj < {self.NK} ? "
            f"{clexpr.load(buf(k.v.tensor), join_offsets(vb, linear([('kj', vs)]), self.flat(k.v, k.values, 'e')), vdt)} : 0.0f;",  # noqa: E501
            "}",
            "barrier(CLK_LOCAL_MEM_FENCE);"]
        loop = ([] if self.direct else staged) + [
            f"float s[{B}];", "float mb = -INFINITY;", "#pragma unroll",
            f"for (int jj = 0; jj < {B}; ++jj) {{",
            "    const int kj = j0 + jj;", *clamp,
            "    float dot = 0.0f;",
            "    #pragma unroll",
            f"    for (int d = 0; d < {D}; ++d)",
            f"        dot = {clexpr.muladd('q[d]', kval, 'dot', self.muladd)};  "
            f"/* {k.qk.text} */"
            .replace("*/;", "*/")]
        loop += [f"    {x}" for x in self.scores()]
        loop += [f"    s[jj] = kj < {self.NK} ? {self.ref(k.source)} : -INFINITY;",
                 "    mb = fmax(mb, s[jj]);", "}",
                 "const float mn = fmax(m, mb);",
                 "const float ms = mn == -INFINITY ? 0.0f : mn;  /* see the header */",
                 "const float alpha = exp(m - ms);", "l *= alpha;",
                 "#pragma unroll", f"for (int e = 0; e < {E}; ++e)", "    acc[e] *= alpha;",
                 "#pragma unroll", f"for (int jj = 0; jj < {B}; ++jj) {{",
                 "    const int kj = j0 + jj;", *clamp,
                 "    const float p = exp(s[jj] - ms);", "    l += p;",
                 "    #pragma unroll", f"    for (int e = 0; e < {E}; ++e)",
                 f"        acc[e] = {clexpr.muladd('p', vval, 'acc[e]', self.muladd)};", "}",
                 "m = mn;"]
        lines += [f"    {x}" for x in loop] + ["}"]
        orow = self.offset(k.out, k.values)
        lines += ["if (live) {", "    #pragma unroll", f"    for (int e = 0; e < {E}; ++e)",
                  "        " + clexpr.store(buf(k.out.tensor),
                                            join_offsets(orow, self.flat(k.out, k.values, 'e')),
                                            "acc[e] / l", self.t[k.out.tensor].dtype), "}"]
        return decls, lines


def join_offsets(*parts: str) -> str:
    return " + ".join(p for p in parts if p and p != "0") or "0"


def attention_source(k: AttentionKernel, program: ir.Program, hw: HwModel,
                     rows: int | None = None) -> KernelSource:
    """The row form: one work-item a query row (`rows` of them a group, or `shape_for`'s)."""
    R, B = shape_for(k, hw, rows)
    t = AttentionText(k, program, R, B, direct=hw.kind == "cpu", muladd=hw.muladd)
    decls, body = t.body()
    return assemble(k, program, t, decls, body, R, tiled=False)


def assemble(k: AttentionKernel, program: ir.Program, t: AttentionText, decls: list[str],
             body: list[str], threads: int, tiled: bool) -> KernelSource:
    R, B = t.R, t.B
    for name in set(k.reads()) | set(k.writes):
        check_int_offsets(f"tensor {name}", 0, program.tensors[name].size)
    ins = sorted(k.reads())
    args = [KernelArg(n, "in", program.tensors[n].dtype, program.tensors[n].size) for n in ins]
    args += [KernelArg(n, "out", program.tensors[n].dtype, program.tensors[n].size)
             for n in k.writes]
    nb = size_of(k, k.batch)
    how = (f"{R} query rows a work-group ({threads} work-items), keys in blocks of {B} "
           f"through local memory; " + ("both products register-tiled; " if tiled else "")
           + "online softmax" + ("; the key loop stops at the causal bound" if k.causal
                                  else ""))
    comment = [op.text.replace("*/", "* /") for op in (k.qk, *k.ops, k.pv)] + [
        f"{nb} batches x {size_of(k, k.query)} queries x {t.NK} keys, depth {t.D}, "
        f"values {t.E}; {how}"]
    ctx = {"title": f"{k.name}: attention kernel generated by tilec", "comment": comment,
           "name": k.name, "args": [arg_decl(a) for a in args], "wg": threads,
           "decls": decls, "head": [], "body": body}
    text = template_env().get_template("rows.cl.j2").render(k=ctx)
    groups = nb * t.nqb
    pairs = nb * size_of(k, k.query) * t.NK
    flops = 2 * pairs * (t.D + t.E)
    cost = (f"{k.name}: {how}; {groups} work-groups; the {nb}x{size_of(k, k.query)}x{t.NK} "
            f"scores are not stored")
    return KernelSource(k.name, "attention", text, tuple(args), groups * threads, threads,
                        {"rows": R, "keys": B}, cost, flops)
