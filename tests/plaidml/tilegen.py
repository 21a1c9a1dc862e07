"""Text generators that reproduce how PlaidML 0.7.0 (plaidml/op.py, plaidml/tile.py) spells the
Tile code of its parametrised ops: the same index and size names, the same padding formulas,
the same statement order.  Written from reading the generated text's structure; only the
text matters here.
"""

# ruff: noqa: E501  (Tile lines are kept as PlaidML writes them, some over 100 columns)

from __future__ import annotations

VALID, SAME_UPPER, SAME_LOWER, EXPLICIT = "valid", "same_upper", "same_lower", "explicit"
CF, CL = "channels_first", "channels_last"
FULL_OUT_GROUP_IN, GROUP_GROUP_OUT, GROUP_GROUP_OUT_GROUP_IN = "FOGI", "GGO", "GGOGI"


# --------------------------------------------------------------------------- aggregations
def agg_subs(ndims: int, axes, keepdims: bool):
    """tile.compute_aggregation_axes: (output dims as ranks, axes sorted descending, subs)."""
    if axes is None:
        axes = ndims - 1
    if isinstance(axes, (list, tuple)):
        axes = [ndims + a if a < 0 else a for a in axes]
    else:
        axes = [ndims + axes if axes < 0 else axes]
    axes.sort(reverse=True)
    src_i = [f"x{i}" for i in range(ndims)]
    src_r = [f"X{i}" for i in range(ndims)]
    dst_i, dst_r = src_i[:], src_r[:]
    red_i = [dst_i[a] for a in axes]
    red_r = [dst_r[a] for a in axes]
    for a in axes:
        if keepdims:
            dst_i[a] = "s" + dst_i[a]
            dst_r[a] = "1"
        else:
            del dst_i[a]
            del dst_r[a]
    subs = {
        "src_indices": ", ".join(src_i),
        "src_ranges": ", ".join(src_r),
        "dest_indices": ", ".join(dst_i),
        "dest_ranges": ", ".join(dst_r),
        "dest_sep": " : " if dst_i else "",
        "reduce_indices": ", ".join(red_i),
        "reduce_ranges": ", ".join(red_r),
    }
    return axes, subs


# --------------------------------------------------------------------------- padding
def pad_compute(sym: str, size: int, fs: int, s: int, padding: str, pads=None):
    """op.pad_compute: (output size as Tile text, pad-before as Tile text, numeric output)."""
    if pads:
        pre, post = pads
        return (f"({sym} + {pre} + {post} - {fs} + {s}) / {s}", pre,
                (size + pre + post - fs + s) // s)
    if padding == VALID:
        return f"({sym} - {fs} + {s}) / {s}", 0, (size - fs + s) // s
    if padding in (SAME_UPPER, SAME_LOWER):
        out = f"({sym} + {s} - 1) / {s}"
        inner = f"max(0, ({out} - 1) * {s} + {fs} - {sym})"
        pad = f"({inner}) / 2" if padding == SAME_UPPER else f"(({inner}) + 1) / 2"
        return out, pad, (size + s - 1) // s
    raise ValueError(padding)


def extend_pads(pads, rank):
    """op._extend_pads (used by Pool)."""
    if pads is None:
        return None
    pads = list(pads)
    if len(pads) < rank:
        pads += [0] * (rank - len(pads))
    if len(pads) < 2 * rank:
        pads += pads[len(pads) - rank:rank]
    return pads


# --------------------------------------------------------------------------- convolution
def conv_text(*, in_shape, kernel_shape, strides, dilations, padding, data_format,
              kernel_format, pads=None, grouping="none", groups=None, group_format=None,
              transposed=False):
    """The Tile text of op.Convolution (direct path) or, with transposed=True, of
    op.ConvolutionTranspose (in_shape is then the transposed conv's output_shape).
    Returns (text, numeric output spatial sizes)."""
    rank = len(in_shape) - 2
    fmt = group_format
    G = {FULL_OUT_GROUP_IN: "(CI/GCI)"}.get(fmt, "G")
    GCI = {GROUP_GROUP_OUT: "(CI/G)"}.get(fmt, "GCI")
    GCO = {FULL_OUT_GROUP_IN: "(CO*GCI/CI)"}.get(fmt, "GCO")
    CO = "CO" if fmt == FULL_OUT_GROUP_IN else "(G*GCO)"
    assertion = ""
    if grouping == "explicit" and groups != 1:
        assertion = f"Assert = assert_group_count({G} == {groups});\n    "
    elif grouping == "max":  # one group per input channel
        assertion = f"Assert = assert_group_count({G} == CI);\n    "
    auto = grouping == "max" or (grouping == "explicit" and groups != 1)
    k_reshape = auto and fmt in (FULL_OUT_GROUP_IN, GROUP_GROUP_OUT)
    o_reshape = auto

    # spatial axes of the data and kernel
    x_axes = list(range(2, rank + 2)) if data_format == CF else list(range(1, rank + 1))
    if kernel_format == CF:
        nch = 3 if (auto and fmt == GROUP_GROUP_OUT_GROUP_IN) else 2
        k_axes = [nch + i for i in range(rank)]
    else:
        k_axes = list(range(rank))
    outs, pad_amts, nums = [], [], []
    for i in range(rank):
        fs = dilations[i] * (kernel_shape[k_axes[i]] - 1) + 1
        sym = f"D{i}" if transposed else f"L{i}"
        pr = (pads[i], pads[i + rank]) if pads else None
        o, p, n = pad_compute(sym, in_shape[x_axes[i]], fs, strides[i], padding, pr)
        outs.append(o)
        pad_amts.append(p)
        nums.append(n)
    padding_str = "".join(f"Pad{i} = {pad_amts[i]};\n    " for i in range(rank))

    in_sp_dims = [f"D{i}" if transposed else f"L{i}" for i in range(rank)]
    in_sp_idxs = [f"{strides[i]}*x{i} + {dilations[i]}*k{i} - Pad{i}" for i in range(rank)]
    out_sp_dims = [f"L{i}" for i in range(rank)] if transposed else outs
    out_sp_idxs = [f"x{i}" for i in range(rank)]
    k_sp_dims = [f"LK{i}" for i in range(rank)]
    k_sp_idxs = [f"k{i}" for i in range(rank)]

    ci_idx = [f"g * ({GCI}) + gci"] if auto else ["ci"]
    if auto:
        k_ch_dims = {FULL_OUT_GROUP_IN: ["CO", "GCI"], GROUP_GROUP_OUT: ["G", "GCO"],
                     GROUP_GROUP_OUT_GROUP_IN: ["G", "GCO", "GCI"]}[fmt]
        ki_ch_idxs = ["g", "gco", "gci"]
        oi_ch_dims, oi_ch_idxs = [G, GCO], ["g", "gco"]
    else:
        k_ch_dims = ["CO", "CI"] if kernel_format == CF else ["CI", "CO"]
        ki_ch_idxs = ["co"] + ci_idx if kernel_format == CF else ci_idx + ["co"]
        oi_ch_dims, oi_ch_idxs = ["CO"], ["co"]

    def data_order(n, ch, sp):
        return ", ".join(n + ch + sp if data_format == CF else n + sp + ch)

    def kern_order(ch, sp):
        return ", ".join(ch + sp if kernel_format == CF else sp + ch)

    I_dims = data_order(["N"], ["CI"], in_sp_dims)
    I_idxs = data_order(["n"], ci_idx, in_sp_idxs)
    K_dims = kern_order(k_ch_dims, k_sp_dims)
    Ki_dims = kern_order([G, GCO, GCI], k_sp_dims) if k_reshape else K_dims
    Ki_idxs = kern_order(ki_ch_idxs, k_sp_idxs)
    Oi_dims = data_order(["N"], oi_ch_dims, out_sp_dims)
    Oi_idxs = data_order(["n"], oi_ch_idxs, out_sp_idxs)
    O_dims = data_order(["N"], [CO], out_sp_dims)
    Kitrn = "Kitrn" if k_reshape else "K"
    Oitrn = "Oitrn" if o_reshape else "O"

    if transposed:
        dim_input = ", " + ", ".join(f"D{i}" for i in range(rank))
        text = (f"function (O[{Oi_dims}], K[{K_dims}]{dim_input}) -> (I) {{\n"
                f"    {padding_str}I[{I_idxs}: {I_dims}] = +(O[{Oi_idxs}]*K[{Ki_idxs}]);\n"
                "}")
        return text, nums
    ker_reshape = f"{Kitrn} = reshape(K, {Ki_dims});\n    " if k_reshape else ""
    out_reshape = f"\n    O = reshape({Oitrn}, {O_dims});" if o_reshape else ""
    text = (f"function (I[{I_dims}], K[{K_dims}]) -> (O) {{\n"
            f"    {assertion}{padding_str}{ker_reshape}{Oitrn}[{Oi_idxs}: {Oi_dims}] = "
            f"+(I[{I_idxs}]*{Kitrn}[{Ki_idxs}]);{out_reshape}\n"
            "}")
    return text, nums


def winograd_text(padding: str, assert_expr: str = "BI - CI + 1 == BO"):
    """op.Convolution._winograd_code_template for a 3x3 stride-1 NHWC conv."""
    XO, XP, _ = pad_compute("X", 0, 3, 1, padding)
    YO, YP, _ = pad_compute("Y", 0, 3, 1, padding)
    return f"""
            function (I[N, X, Y, CI], K[S, S, CI, CO], A[BI, BO], B[BI, BI], G[BI, S] ) -> (O) {{
                Assert = assert_winograd_valid({assert_expr});
                XO = {XO};
                YO = {YO};
                XB = (XO + BO - 1) / BO;
                YB = (YO + BO - 1) / BO;
                XP = {XP};
                YP = {YP};
                U1[i, j, ci, co : BI, S, CI, CO] = +(G[i, k] * K[k, j, ci, co]);
                U[i, j, ci, co : BI, BI, CI, CO] = +(U1[i, k, ci, co] * G[j, k]);
                V1[n, i, j, x, y, ci : N, BI, BI, XB, YB, CI] = +(B[k, i] * I[n, BO*x + k - XP, BO*y + j - YP, ci]);
                V[n, i, j, x, y, ci : N, BI, BI, XB, YB, CI] = +(V1[n, i, k, x, y, ci] * B[k, j]);
                M[n, i, j, x, y, co : N, BI, BI, XB, YB, CO] = +(V[n, i, j, x, y, ci] * U[i, j, ci, co]);
                O1[n, i, j, x, y, co : N, BO, BI, XB, YB, CO] = +(A[k, i] * M[n, k, j, x, y, co]);
                O[n, BO*x + i, BO*y + j, co : N, XO, YO, CO] = +(O1[n, i, k, x, y, co] * A[k, j]) no_defract;
            }}"""


# --------------------------------------------------------------------------- pooling
def pool_text(*, in_shape, mode, kernel, strides, padding, data_format, pads=None):
    """op.Pool.  data_format CF = NCX, CL = NXC.  Returns (text, numeric output shape)."""
    rank = len(in_shape) - 2
    pads = extend_pads(pads, rank)
    sp = in_shape[2:] if data_format == CF else in_shape[1:rank + 1]
    outs, pad_amts, nums, in_sp_idxs = [], [], [], []
    for i in range(rank):
        pr = (pads[i], pads[i + rank]) if pads else None
        o, p, n = pad_compute(f"L{i}", sp[i], kernel[i], strides[i], padding, pr)
        outs.append(o)
        pad_amts.append(p)
        nums.append(n)
        in_sp_idxs.append(f"{strides[i]}*x{i} + k{i} - Pad{i}")
    in_sp_dims = [f"L{i}" for i in range(rank)]
    out_sp_idxs = [f"x{i}" for i in range(rank)]
    ones_sp = [f"o{i}" for i in range(rank)]
    padding_str = "\n            ".join(f"Pad{i} = {pad_amts[i]};" for i in range(rank))
    if data_format == CF:
        in_dims, in_idxs = ["N", "C"] + in_sp_dims, ["n", "c"] + in_sp_idxs
        out_dims, out_idxs = ["N", "C"] + outs, ["n", "c"] + out_sp_idxs
        ones_idxs = ["n", "c"] + ones_sp
        num_shape = tuple(in_shape[:2]) + tuple(nums)
    else:
        in_dims, in_idxs = ["N"] + in_sp_dims + ["C"], ["n"] + in_sp_idxs + ["c"]
        out_dims, out_idxs = ["N"] + outs + ["C"], ["n"] + out_sp_idxs + ["c"]
        ones_idxs = ["n"] + ones_sp + ["c"]
        num_shape = (in_shape[0],) + tuple(nums) + (in_shape[-1],)
    bounds = ", ".join(f"k{i} < {kernel[i]}" for i in range(rank))
    j = ", ".join
    if mode == "avg":
        op, out_name, extra = "+", "S", ", One[]"
        denom_gen = f"""
            Ones[{j(ones_idxs)} : {j(in_dims)}] = =(One[]);
            Count[{j(out_idxs)} : {j(out_dims)}] = +(Ones[{j(in_idxs)}]), {bounds};"""
        denom_div = """
            O = S / Count;"""
    else:
        op, out_name, extra, denom_gen, denom_div = ">", "O", "", "", ""
    text = f"""
        function (I[{j(in_dims)}]{extra}) -> (O) {{
            {padding_str}{denom_gen}
            {out_name}[{j(out_idxs)} : {j(out_dims)}] = {op}(I[{j(in_idxs)}]), {bounds}; {denom_div}
        }}"""
    return text, num_shape
