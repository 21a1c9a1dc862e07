"""plaidml/op.py (0.7.0), second half: Gemm .. ReflectionPadding."""

# ruff: noqa: E501  (Tile lines are kept as PlaidML writes them, some over 100 columns)

from __future__ import annotations

import numpy as np

from . import oracles as ora
from .case import Case
from .tilegen import agg_subs

OP = "plaidml/op.py"


def _case(name, cls, program, inputs, oracle, notes="", **params):
    return Case(f"op.{name}", f"{OP}:{cls}", program, inputs, oracle, params, notes)


def _f32(shape):
    return (tuple(shape), "float32")


def _f64(x):
    return np.asarray(x, np.float64)


# ------------------------------------------------------------------ Gemm
def gemm():
    out = []
    for tag, a, b, c, alpha, beta, ta, tb in [
        ("plain_bias_row", (3, 4), (4, 5), (5,), None, None, False, False),
        ("transA_transB_alpha_beta", (4, 3), (5, 4), (3, 5), 0.5, 2.0, True, True),
        ("transB_beta", (2, 6), (3, 6), (2, 3), None, 1.5, False, True),
    ]:
        text = f"""
        function (A[{'MID, ROW' if ta else 'ROW, MID'}], B[{'COL, MID' if tb else 'MID, COL'}], C) -> (O) {{
          OM[row, col : ROW, COL] = +(A[{'mid, row' if ta else 'row, mid'}] * B[{'col, mid' if tb else 'mid, col'}]);
          OA = {f'OM * {alpha}' if alpha else 'OM'};
          CB = {f'C * {beta}' if beta else 'C'};
          O = OA + CB;
        }}"""

        def oracle(A, B, C, ta=ta, tb=tb, alpha=alpha, beta=beta):
            am = _f64(A).T if ta else _f64(A)
            bm = _f64(B).T if tb else _f64(B)
            return {"O": ora.f32((alpha or 1.0) * am @ bm + (beta or 1.0) * _f64(C))}

        out.append(_case(f"gemm.{tag}", "Gemm", text,
                         {"A": _f32(a), "B": _f32(b), "C": _f32(c)}, oracle,
                         "C broadcasts numpy-style against the (ROW, COL) product.",
                         via="op.gemm (ONNX Gemm)", transA=ta, transB=tb, alpha=alpha, beta=beta))
    return out


# ------------------------------------------------------------------ Hardmax / IsMax / LogSoftmax / Softmax
def max_like():
    out = []
    hard = """
        function (I[X, Y]) -> (O) {
            MAXX[x : X] = >(I[x, y]);
            MAX[x, y : X, Y] = =(MAXX[x]);
            O = (MAX == I ? 1.0 : 0.0);
        }"""
    for shape in [(3, 5), (6, 2)]:
        def oracle(I):
            return {"O": (I == I.max(axis=1, keepdims=True)).astype(np.float32)}
        out.append(_case(f"hardmax.{shape[0]}x{shape[1]}", "Hardmax", hard, {"I": _f32(shape)},
                         oracle, "n-d inputs go through reshape to 2-d (op.hardmax).",
                         via="op.hardmax"))
    for shape, axes in [((3, 4), [1]), ((2, 3, 4), [0, 2]), ((4, 5), [0, 1])]:
        _, s = agg_subs(len(shape), axes, True)
        text = f"""function (I[{s['src_ranges']}]) -> (O) {{
                    MAX[{s['dest_indices']}{s['dest_sep']}{s['dest_ranges']}] = >(I[{s['src_indices']}]);
                    O = (MAX == I);
                }}"""

        def oracle(I, axes=tuple(axes)):
            return {"O": I == I.max(axis=axes, keepdims=True)}

        out.append(_case(f"ismax.{len(shape)}d_ax{''.join(map(str, axes))}", "IsMax", text,
                         {"I": _f32(shape)}, oracle, via="op.ismax", axes=axes))
    for cls, builtin, fn in [("Softmax", "builtin_softmax", ora.softmax),
                             ("LogSoftmax", "builtin_logsoftmax", ora.log_softmax)]:
        text = f"""
        function (I[X, Y]) -> (O) {{
            O = {builtin}(I, X, Y);
        }}"""
        for shape in [(3, 7), (5, 4)]:
            out.append(_case(f"{cls.lower()}.{shape[0]}x{shape[1]}", cls, text, {"I": _f32(shape)},
                             lambda I, fn=fn: {"O": ora.f32(fn(I, axis=1))},
                             "Row-wise over the second axis; n-d inputs are reshaped to 2-d "
                             "by separate Reshape programs (op.softmax, keras softmax).",
                             via=f"op.{cls.lower().replace('logsoftmax', 'log_softmax')}",
                             gen={"I": ("signed", 0.1, 3.0)}))
    return out


# ------------------------------------------------------------------ MatMul
def matmul():
    out = []
    for tag, a, b in [("1d_1d", (6,), (6,)), ("2d_1d", (3, 5), (5,)), ("3d_1d", (2, 3, 4), (4,)),
                      ("2d_2d", (3, 4), (4, 2)), ("3d_3d", (2, 3, 4), (2, 4, 5))]:
        an, bn = len(a), len(b)
        if an == 1 and bn == 1:
            ar, ai, br, bi, cr, ci = ["S"], ["s"], ["S"], ["s"], [], []
        elif bn == 1:
            ar = [f"I{n}" for n in range(an - 1)] + ["S"]
            ai = [f"i{n}" for n in range(an - 1)] + ["s"]
            br, bi = ["S"], ["s"]
            cr = [f"I{n}" for n in range(an - 1)]
            ci = [f"i{n}" for n in range(an - 1)]
        else:
            ar = [f"I{n}" for n in range(an - 1)] + ["S"]
            ai = [f"i{n}" for n in range(an - 1)] + ["s"]
            br = [f"I{n}" for n in range(bn - 2)] + ["S", f"I{bn - 1}"]
            bi = [f"i{n}" for n in range(bn - 2)] + ["s", f"i{bn - 1}"]
            cr = [f"I{n}" for n in range(an)]
            ci = [f"i{n}" for n in range(an)]
        j = ", ".join
        text = f"""function(A[{j(ar)}], B[{j(br)}]) -> (C) {{
                        C[{j(ci)} : {j(cr)}] = +(A[{j(ai)}] * B[{j(bi)}]);
                    }}"""
        out.append(_case(f"matmul.{tag}", "MatMul", text, {"A": _f32(a), "B": _f32(b)},
                         lambda A, B: {"C": ora.f32(np.matmul(_f64(A), _f64(B)))},
                         "numpy.matmul semantics; PlaidML's 1-d x n-d branch has Python errors "
                         "(b.dims, range + list) and its n-d x m-d branch only names dims "
                         "consistently for equal ranks, so only these shapes are instantiated.",
                         via="op.matmul (ONNX MatMul)"))
    return out


# ------------------------------------------------------------------ reductions
def reductions():
    out = []
    red = [("MaxReduce", ">", np.max, "max_reduce", "keras max"),
           ("MinReduce", "<", np.min, "min_reduce", "keras min"),
           ("Summation", "+", np.sum, "summation", "keras sum"),
           ("Prod", "*", np.prod, "prod", "keras prod")]
    params = [((3, 4), None, False), ((2, 3, 4), [1], True), ((2, 3, 4), [-1, 0], False),
              ((4, 5), [0], True)]
    for cls, agg, npfn, fn, kfn in red:
        for shape, axes, keep in params:
            ax = list(range(len(shape))) if axes is None else axes
            _, s = agg_subs(len(shape), ax, keep)
            if cls in ("MaxReduce", "MinReduce"):
                text = f"""function (I[{s['src_ranges']}]) -> (O) {{
                   O[{s['dest_indices']}{s['dest_sep']}{s['dest_ranges']}] = {agg}(I[{s['src_indices']}]);
               }}"""
            else:
                text = f"""
               function (I[{s['src_ranges']}]) -> (O) {{
                   O[{s['dest_indices']}{s['dest_sep']}{s['dest_ranges']}] = {agg}(I[{s['src_indices']}]);
               }}"""

            axn = tuple(a % len(shape) for a in ax)

            def oracle(I, npfn=npfn, ax=axn, keep=keep):
                return {"O": ora.f32(npfn(_f64(I), axis=ax, keepdims=keep))}

            tag = f"{len(shape)}d_{'all' if axes is None else 'ax' + '_'.join(map(str, axes))}"
            out.append(_case(f"{fn}.{tag}{'_keep' if keep else ''}", cls, text,
                             {"I": _f32(shape)}, oracle, via=f"op.{fn} / {kfn}", axes=axes,
                             keepdims=keep, gen={"I": ("signed", 0.5, 1.5)}))
    # Mean
    for shape, axes, keep in params:
        ax = list(range(len(shape))) if axes is None else axes
        sorted_axes, s = agg_subs(len(shape), ax, keep)
        mean_ranges = "*".join(f"X{i}" for i in sorted_axes)
        text = f"""
            function (I[{s['src_ranges']}]) -> (O) {{
                SO[{s['dest_indices']}{s['dest_sep']}{s['dest_ranges']}] = +(I[{s['src_indices']}]);
                 O = SO / ({mean_ranges});
            }}"""

        axn = tuple(a % len(shape) for a in ax)

        def oracle(I, ax=axn, keep=keep):
            return {"O": ora.f32(np.mean(_f64(I), axis=ax, keepdims=keep))}

        tag = f"{len(shape)}d_{'all' if axes is None else 'ax' + '_'.join(map(str, axes))}"
        out.append(_case(f"mean.{tag}{'_keep' if keep else ''}", "Mean", text,
                         {"I": _f32(shape)}, oracle, via="op.mean / keras mean", axes=axes,
                         keepdims=keep))
    # Variance (the mean M is PlaidML's Mean(keepdims=True) output, passed in)
    for shape, axes, keep in params:
        ax = list(range(len(shape))) if axes is None else axes
        sorted_axes, s = agg_subs(len(shape), ax, keep)
        prod = "*".join(f"X{i}" for i in sorted_axes)
        mr = ", ".join(f"Y{i}" for i in range(len(shape)))
        text = f"""
            function (I[{s['src_ranges']}], M[{mr}]) -> (O) {{
                DIFF_SQ = (I - M) * (I - M);
                SUM[{s['dest_indices']}{s['dest_sep']}{s['dest_ranges']}] = +(DIFF_SQ[{s['src_indices']}]);
                O = SUM / ({prod});
            }}"""
        axn = tuple(a % len(shape) for a in ax)
        mshape = tuple(1 if i in axn else d for i, d in enumerate(shape))

        def oracle(I, M, axn=axn, keep=keep):
            return {"O": ora.f32(np.var(_f64(I), axis=axn, keepdims=keep))}

        tag = f"{len(shape)}d_{'all' if axes is None else 'ax' + '_'.join(map(str, axes))}"
        out.append(_case(
            f"variance.{tag}{'_keep' if keep else ''}", "Variance", text,
            {"I": _f32(shape), "M": _f32(mshape)}, oracle,
            "M is the output of op.mean(x, axes, keepdims=True), made from I by the input "
            "generator; population variance (divides by n).", via="op.variance / keras var, std",
            axes=axes, keepdims=keep,
            gen={"M": ("derived", lambda a, axn=axn: np.mean(_f64(a["I"]), axis=axn,
                                                              keepdims=True))}))
    return out


# ------------------------------------------------------------------ Pow / Relu / Sqrt
def pow_relu_sqrt():
    out = []
    for tag, pshape, gen in [("scalar_exp", (), ("fixed", 2.5)), ("tensor_exp", (3, 4),
                                                                 ("signed", 0.1, 2.0))]:
        out.append(_case(f"pow.{tag}", "Pow", "function (I, P) -> (O) { O = pow(I, P); }",
                         {"I": _f32((3, 4)), "P": _f32(pshape)},
                         lambda I, P: {"O": ora.f32(np.power(_f64(I), _f64(P)))},
                         via="op.pow / keras pow", gen={"I": ("uniform", 0.1, 3.0), "P": gen}))
    for tag, alpha, max_value, thresh in [("plain", None, None, 0.0), ("alpha", 0.1, None, 0.0),
                                          ("alpha_max", 0.2, 0.6, 0.0), ("max", None, 0.5, 0.0),
                                          ("thresh_alpha", 0.3, None, 0.2),
                                          ("thresh_max", None, 0.7, -0.1)]:
        inputs = {"X": _f32((3, 5))}
        gen = {}
        if alpha is not None:
            inputs["Alpha"] = _f32(())
            gen["Alpha"] = ("fixed", alpha)
            low = "Alpha*{X}"
        else:
            low = "0.0"
        if max_value is not None:
            inputs["MaxValue"] = _f32(())
            gen["MaxValue"] = ("fixed", max_value)
            clip, main = "\n    Y = (M < MaxValue ? M : MaxValue);", "M"
        else:
            clip, main = "", "Y"
        if thresh != 0.0:
            inputs["Thresh"] = _f32(())
            gen["Thresh"] = ("fixed", thresh)
            fcn = f"\n    {main} = (X < Thresh ? {low.format(X='(X - Thresh)')} : X);"
        else:
            fcn = f"\n    {main} = (X < 0.0 ? {low.format(X='X')} : X);"
        if alpha is None and max_value is None and thresh == 0.0:
            text = "function (X) -> (Y) { Y = relu(X); }"
        else:
            text = f"function ({', '.join(inputs)}) -> (Y) {{ {fcn}{clip}\n}}"

        def oracle(X, Alpha=0.0, MaxValue=None, Thresh=0.0):
            x = _f64(X)
            y = np.where(x < Thresh, _f64(Alpha) * (x - Thresh), x)
            if MaxValue is not None:
                y = np.minimum(y, MaxValue)
            return {"Y": ora.f32(y)}

        out.append(_case(f"relu.{tag}", "Relu", text, inputs, oracle,
                         "Alpha, MaxValue, Thresh are Python floats PlaidML turns into 0-d "
                         "tensors.", via="op.relu / keras relu", alpha=alpha,
                         max_value=max_value, threshold=thresh, gen=gen))
    sq = """
            function (I) -> (O) {
                IC = (I < 0 ? 0 : I);
                O = sqrt(IC);
            }"""
    for shape in [(3, 4), (2, 2, 5)]:
        out.append(_case(f"sqrt.{len(shape)}d", "Sqrt", sq, {"I": _f32(shape)},
                         lambda I: {"O": ora.f32(np.sqrt(np.maximum(_f64(I), 0)))},
                         "Negative inputs give 0 (clamped), so half the inputs are negative.",
                         via="op.sqrt / keras sqrt"))
    return out


# ------------------------------------------------------------------ Reshape
def reshape():
    out = []
    for tag, shape, dims, sym in [("2d_to_3d", (4, 6), (2, 3, 4), []),
                                  ("squeeze", (3, 1, 5), (3, 5), []),
                                  ("unsqueeze", (3, 5), (3, 1, 5, 1), []),
                                  ("symbolic_dim0", (6, 4), (6, 2, 2), [0])]:
        inputs = {"I": _f32(shape)}
        dstrs = [str(d) for d in dims]
        gen = {}
        for i in sym:
            inputs[f"D{i}"] = ((), "int32")
            gen[f"D{i}"] = ("fixed", dims[i])
            dstrs[i] = f"D{i}"
        text = (f"function ({', '.join(inputs)}) -> (O) "
                f"{{ O = reshape(I, {', '.join(dstrs)}); }}")

        def oracle(I, dims=dims, **_):
            return {"O": I.reshape(dims)}

        out.append(_case(f"reshape.{tag}", "Reshape", text, inputs, oracle,
                         "A target dim that is a symbolic size (tile.Value) becomes an extra "
                         "input D<i>, bound by PlaidML as an integer constant; here a 0-d int32 "
                         "input with a fixed value." if sym else "",
                         via="op.reshape / op.squeeze / op.unsqueeze / keras reshape, squeeze",
                         dims=dims, gen=gen))
    return out


# ------------------------------------------------------------------ SliceTensor
def slice_tensor():
    out = []
    for tag, shape, symbolic, axes, starts, ends in [
        ("axis1", (3, 6), False, [1], [1], [4]),
        ("clamped_end", (5, 4, 3), False, [0, 2], [2, 1], [100, 3]),
        ("neg_end", (3, 5), False, [1], [1], [-1]),
        ("neg_end_from0", (4, 3), False, [0], [0], [-2]),
        ("symbolic", (6, 5), True, [0, 1], [1, 0], [4, 3]),
    ]:
        nd = len(shape)
        in_dims = [f"D{d}" for d in range(nd)]
        out_dims = list(in_dims)
        in_idxs = [f"d{d}" for d in range(nd)]
        for axis, start, end in zip(axes, starts, ends, strict=True):
            if symbolic:
                cs, ce = f"min({start}, D{axis})", f"min({end}, D{axis})"
                delta = f"{ce}-{cs}"
            else:
                cs, ce = str(min(start, shape[axis])), str(min(end, shape[axis]))
                delta = str(min(end, shape[axis]) - min(start, shape[axis]))
            if end > 0:
                out_dims[axis] = delta
            elif start - end > 0:
                out_dims[axis] = f"D{axis}+({delta})"
            if start:
                in_idxs[axis] = f"d{axis}+{cs}"
        j = ", ".join
        text = f"""
        function (I[{j(in_dims)}]) -> (O) {{
            O[{j(f'd{d}' for d in range(nd))} : {j(out_dims)}] = =(I[{j(in_idxs)}]);
        }}"""

        def oracle(I, axes=axes, starts=starts, ends=ends):
            key = [slice(None)] * I.ndim
            for a, s, e in zip(axes, starts, ends, strict=True):
                key[a] = slice(s, e)
            return {"O": I[tuple(key)].copy()}

        extra = {}
        if symbolic:
            extra["plaidml_fails"] = "its parser rejects min( in an output size"
        out.append(_case(f"slice_tensor.{tag}", "SliceTensor", text, {"I": _f32(shape)},
                         oracle, "Symbolic input dims (tile.Value) make PlaidML write the "
                         "clamps as min(...) size expressions.  PlaidML 0.7.0's own parser "
                         "rejects this text (syntax error at 'min(' in the output sizes); the "
                         "oracle is the slice it means." if symbolic else "",
                         via="op.slice_tensor (ONNX Slice)", axes=axes, starts=starts,
                         ends=ends, symbolic_dims=symbolic, **extra))
    return out


# ------------------------------------------------------------------ ImagePatches
def image_patches():
    out = []
    for tag, shape, ks, st, rates, padding in [
        ("valid", (2, 5, 6, 3), (1, 2, 2, 1), (1, 1, 2, 1), (1, 1, 1, 1), "VALID"),
        ("same_s2", (1, 6, 5, 2), (1, 3, 3, 1), (1, 2, 2, 1), (1, 1, 1, 1), "SAME"),
        ("valid_rate2", (1, 7, 7, 2), (1, 2, 3, 1), (1, 2, 1, 1), (1, 2, 2, 1), "VALID"),
    ]:
        ry_eff = ks[1] + (ks[1] - 1) * (rates[1] - 1)
        rx_eff = ks[2] + (ks[2] - 1) * (rates[2] - 1)
        if padding == "VALID":
            ny = -(-(shape[1] - ry_eff + 1) // st[1])
            nx = -(-(shape[2] - rx_eff + 1) // st[2])
            pad = "PAD = I;"
        else:
            ny, nx = -(-shape[1] // st[1]), -(-shape[2] // st[2])
            pt = max(0, ((ny - 1) * st[1] + ry_eff - shape[1]) // 2)
            pl = max(0, ((nx - 1) * st[2] + rx_eff - shape[2]) // 2)
            pad = f"""PAD[b, y, x, d : B, Y + {pt} * 2 + 1, X + {pl} * 2 + 1, D] =
                        =(I[b, y - {pt}, x - {pl}, d]);"""
        text = f"""function (I[B,Y,X,D]) -> (O) {{
                    {pad}
                    TMP[b, ny, nx, y, x, d: B, {ny}, {nx}, {ks[1]}, {ks[2]}, D] =
                        =(PAD[b, ny * {st[1]} + y * {rates[1]}, nx * {st[2]} + x * {rates[2]}, d]);
                    O = reshape(TMP, B, {ny}, {nx}, {ks[1]} * {ks[2]} * D);
                }}
        """

        def oracle(I, ks=ks, st=st, rates=rates, padding=padding):
            return {"O": ora.extract_image_patches(I, ks, st, rates, padding)}

        out.append(_case(f"extract_image_patches.{tag}", "ImagePatches", text,
                         {"I": _f32(shape)}, oracle,
                         "tf.extract_image_patches semantics (patch elements in (ky, kx, depth) "
                         "order).  For SAME PlaidML pads 2*pad+1 extra rows/columns and places "
                         "the image at the computed top/left pad; the oracle uses TF's split "
                         "(floor half before).",
                         via="op.extract_image_patches", ksizes=ks, strides=st, rates=rates,
                         padding=padding))
    return out


# ------------------------------------------------------------------ ReflectionPadding
def reflection_padding():
    out = []
    for tag, shape, paddings, symbolic in [("2d", (3, 5), [(1, 2), (2, 1)], False),
                                           ("3d_int_pads", (2, 4, 4), [0, 2, (0, 3)], False),
                                           ("symbolic_dim0", (4, 3), [(2, 1), 0], True)]:
        pads = [(p, p) if isinstance(p, int) else p for p in paddings]
        nd = len(shape)
        out_sizes = [f"N{i}" if (symbolic and i == 0) else shape[i] for i in range(nd)]
        in_sizes = list(out_sizes)
        body, src = [], "I"
        idx = [f"n{i}" for i in range(nd)]
        for axis, (pre, post) in enumerate(pads):
            if pre + post == 0:
                continue
            if isinstance(out_sizes[axis], str):
                out_sizes[axis] += f" + {pre + post}"
            else:
                out_sizes[axis] += pre + post
            dims = ",".join(map(str, out_sizes))
            concats = f"TA{axis}"
            if pre:
                s_idx = list(idx)
                s_idx[axis] = f"{pre} - n{axis}"
                body.append(f"TS{axis}[{','.join(idx)} : {dims}] = =({src}[{','.join(s_idx)}]), "
                            f"n{axis} < {pre};")
                concats += f" + TS{axis}"
            if post:
                s_idx, d_idx = list(idx), list(idx)
                s_idx[axis] = f"{in_sizes[axis]} - n{axis} - 2"
                d_idx[axis] = f"n{axis} + {out_sizes[axis]} - {post}"
                body.append(f"TE{axis}[{','.join(d_idx)} : {dims}] = =({src}[{','.join(s_idx)}]), "
                            f"n{axis} < {post};")
                concats += f" + TE{axis}"
            d_idx = list(idx)
            d_idx[axis] = f"{pre} + n{axis}"
            body.append(f"TA{axis}[{','.join(d_idx)} : {dims}] = =({src}[{','.join(idx)}]), "
                        f"n{axis} < {out_sizes[axis]} - {post};")
            body.append(f"TC{axis} = {concats};")
            src = f"TC{axis}"
            in_sizes = list(out_sizes)
        body.append(f"O = {src};")
        text = ("function (I[" + ",".join(f"N{i}" for i in range(nd)) + "]) -> (O) {\n\t"
                + "\n\t".join(body) + "\n}")

        def oracle(I, pads=pads):
            return {"O": np.pad(I, pads, mode="reflect")}

        out.append(_case(f"reflection_padding.{tag}", "ReflectionPadding", text,
                         {"I": _f32(shape)}, oracle,
                         "numpy's 'reflect' mode (the edge is not repeated).", via="op.reflection_padding",
                         paddings=paddings, symbolic_dims=symbolic))
    return out


def cases():
    return (gemm() + max_like() + matmul() + reductions() + pow_relu_sqrt() + reshape()
            + slice_tensor() + image_patches() + reflection_padding())
