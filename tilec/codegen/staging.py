"""A GPU contraction's staging: the local buffers, the copies of each input tile into them, and
the coordinates each thread's copies need, computed once where they are few.

Which elements a thread copies does not change between reduction tiles, so when each thread
copies at most `PRECOMPUTED_COPIES` elements their coordinates are computed once, in the
prologue; the copy itself is then one add, one bounds test and one load per element.  There
too the padding the copy applies (`staged_masks`) is one bit a copied element."""

from __future__ import annotations

from ..plan.gpu_form import RUN
from ..plan.local_banks import staging_copy
from ..plan.staged_pad import PRECOMPUTED_COPIES, copies
from . import clexpr
from .copy import vector_copy
from .kernel_text import _lin, buf, prod
from .pipeline import copy_plan, half
from .staged_masks import condition, invariant


def staging(con) -> tuple[list[str], list[dict], list[str]]:
    """Local buffers, the copy blocks run per reduction tile, and prologue lines of
    contraction `con` (`codegen.contraction`); fills `con.copies` for the pipelined loop."""
    if not con.sched.staged or all(x is None for x in con.sched.staged):
        return [], [], []
    f = con.flat
    T = con.sched.wg_threads
    bufs, blocks, pre = [], [], []
    for st in con.sched.staged:
        if st is None:  # read through the cache (see `make_schedule`'s split)
            continue
        i = st.input
        t = f.inputs[i]
        base_terms = [(t.strides[k], f"o_{f.names[k]}") for k in con.out_idx]
        base_terms += [(t.strides[k], con.red_var(k)) for k in con.red_idx]
        zero = sum(z * gs for _, gs, _, z in st.merged)
        elems = prod(m[0] for m in st.merged)
        load = clexpr.load(buf(t.name), "g", t.dtype)
        fill = clexpr.literal(0, t.dtype)
        # Tiles that never reach past the tensor's ends copy without a bounds test.
        safe, vw = staging_copy(con.sched, i)
        masks = con.stage_masks.get(i, ())
        once = bool(masks) and invariant(con, masks)  # the test computed in the prologue
        in_range = "" if safe else f"g >= 0 && g < {t.size}"

        def store_for(cond: str, i=i, load=load, fill=fill, in_range=in_range) -> str:
            test = " && ".join(x for x in (cond, in_range) if x)
            return (f"s_{i}[{{l}}] = ({test}) ? {load} : {fill};" if test else
                    f"s_{i}[{{l}}] = {load};")

        per = copies(st, T, vw)
        # Local buffers hold 4-byte compute types; runs (and vectors) read them RUN or W
        # at a time, which needs that alignment (NVIDIA faults on a misaligned float4).
        align = 4 * max(RUN, con.W)
        if con.pipe:  # two halves (`pipeline`), copied through registers
            mask = None
            if masks and once:
                def mask(prefix: str, q: int, i=i) -> str:
                    return f"((sm{i} >> {q}) & 1)"
            elif masks:
                def mask(prefix: str, q: int, i=i, masks=masks) -> str:
                    return condition(con, masks, lambda mi: f"sc{i}_{q}_{mi}",
                                     lambda ki: con.origin(ki, prefix))
            con.copies[i] = copy_plan(con, st, safe, vw, per, elems // vw, zero, mask)
        size = 2 * half(st.elems) if con.pipe else st.elems
        bufs.append(f"{clexpr.COMPUTE[t.dtype]} s_{i}[{size}] "
                    f"__attribute__((aligned({align})))")
        dims = " x ".join(str(m[0]) for m in st.merged)
        comment = f"stage {t.name}: {dims} (padded to {st.elems})"
        base = f"const int sb{i} = {_lin(base_terms, t.offset - zero)};"
        if per <= PRECOMPUTED_COPIES:
            body = [base]
            units = elems // vw  # vectors (or elements) to copy
            if once and per > 1:
                pre.append(f"int sm{i} = 0;")
            for q in range(per):
                e = f"se{i}_{q}"
                pre.append(f"const int {e} = get_local_id(0) + {q * T};")
                g_terms, l_terms, step = [], [], 1
                coords = []
                for j, (rng, gs, ls, _) in enumerate(st.merged):
                    r = rng // vw if j == 0 else rng
                    c = f"(({e} / {step}) % {r})" if step > 1 else f"({e} % {r})"
                    coords.append(c if r > 1 else "0")
                    if r == 1:  # one vector wide: no term
                        continue
                    if j == 0 and vw > 1:
                        c = f"{vw} * {c}"
                    g_terms.append((gs, c))
                    l_terms.append((ls, c))
                    step *= r
                pre.append(f"const int sg{i}_{q} = {_lin(g_terms)};")
                pre.append(f"const int sl{i}_{q} = {_lin(l_terms)};")
                mcoords = {m: coords[m] for _, lams, _ in masks for m, _ in lams}
                if once:  # one bit a copied element: a register for them all
                    test = condition(con, masks, mcoords.__getitem__, con.origin)
                    pre.append(f"const int sm{i} = {test};" if per == 1 else
                               f"sm{i} |= ({test}) << {q};")
                else:
                    pre += [f"const int sc{i}_{q}_{m} = {c};"
                            for m, c in sorted(mcoords.items())]
                cond = f"((sm{i} >> {q}) & 1)" if once else condition(
                    con, masks, lambda mi, i=i, q=q: f"sc{i}_{q}_{mi}",
                    con.origin) if masks else ""
                if vw > 1:  # the tests hold for the whole vector (`copy_width`)
                    test = " && ".join(x for x in (cond, in_range) if x)
                    copy = f"{{ const int g = sb{i} + sg{i}_{q}; " \
                        + vector_copy(st, t, i, vw, f"sl{i}_{q}", test) + " }"
                else:
                    copy = f"{{ const int g = sb{i} + sg{i}_{q}; " \
                        + store_for(cond).format(l=f"sl{i}_{q}") + " }"
                if (q + 1) * T > units:
                    copy = f"if ({e} < {units}) " + copy
                body.append(copy)
            blocks.append({"comment": comment, "loop": False, "body": body})
            continue
        body = ["int rest = e;"]
        g_terms, l_terms = [], []
        for m, (rng, gs, ls, _) in enumerate(st.merged):
            last = m == len(st.merged) - 1
            body.append(f"const int c{m} = rest" + ("" if last else f" % {rng}") + ";")
            if not last:
                body.append(f"rest /= {rng};")
            g_terms.append((gs, f"c{m}"))
            l_terms.append((ls, f"c{m}"))
        body.append(f"const int g = sb{i} + {_lin(g_terms)};")
        # (no padding test here: `staged_pad` takes none past PRECOMPUTED_COPIES)
        body.append(store_for("").format(l=_lin(l_terms)))
        blocks.append({"comment": comment, "loop": True, "elems": elems, "body": body,
                       "pre": [base]})
    return bufs, blocks, pre
