"""plaidml/onnx-plaidml (HEAD 26dd4ab, version 0.3.4, June 2018), onnx_plaidml/opset_onnx.py:
the Tile programs that module writes itself (its other ONNX ops call plaidml.op, covered in
corpus_op*.py; its Gemm is op.Gemm's text).  Older than PlaidML 0.7.0, but the same language."""

# ruff: noqa: E501  (Tile lines are kept as PlaidML writes them, some over 100 columns)

from __future__ import annotations

import numpy as np

from . import oracles as ora
from .case import Case

OX = "onnx_plaidml/opset_onnx.py"


def _case(name, cls, program, inputs, oracle, notes="", **params):
    return Case(f"onnx.{name}", f"{OX}:{cls}", program, inputs, oracle, params, notes)


def _f32(shape):
    return (tuple(shape), "float32")


def _f64(x):
    return np.asarray(x, np.float64)


def convolution():
    out = []
    for tag, x, k, group, strides, dil, pads, auto_pad in [
        ("valid", (1, 3, 6, 6), (4, 3, 3, 3), 1, (1, 1), (1, 1), None, None),
        ("groups2_pads_s2", (1, 4, 7, 7), (6, 2, 3, 3), 2, (2, 2), (1, 1), [1, 1, 1, 1], None),
        ("same_lower_d2_1d", (2, 2, 9), (3, 2, 3), 1, (1,), (2,), None, "SAME_LOWER"),
        ("groups3_pads1", (1, 3, 5, 4), (3, 1, 2, 2), 3, (1, 1), (1, 1), [1], None),
    ]:
        rank = len(x) - 2
        padding = ({"SAME_UPPER": "same_upper", "SAME_LOWER": "same_lower"}[auto_pad]
                   if auto_pad else ("explicit" if pads else "valid"))
        if pads is not None:  # _extend_pads
            pads = list(pads) + [0] * max(0, rank - len(pads))
            if len(pads) < 2 * rank:
                pads += pads[len(pads) - rank:rank]
        sym_out, pad_amt, num_out = [], [], []
        for i in range(rank):
            fs = dil[i] * (k[i + 2] - 1) + 1
            s = strides[i]
            sym = f"L{i}"
            if pads:
                pre, post = pads[i], pads[i + rank]
                sym_out.append(f"({sym} + {pre} + {post} - {fs} + {s}) / {s}")
                pad_amt.append(pre)
                num_out.append((x[i + 2] + pre + post - fs + s) // s)
            elif padding == "valid":
                sym_out.append(f"({sym} - {fs} + {s}) / {s}")
                pad_amt.append(0)
                num_out.append((x[i + 2] - fs + s) // s)
            else:
                o = f"({sym} + {s} - 1) / {s}"
                inner = f"max(0, ({o} - 1) * {s} + {fs} - {sym})"
                sym_out.append(o)
                pad_amt.append(f"({inner}) / 2" if padding == "same_upper"
                               else f"(({inner}) + 1) / 2")
                num_out.append((x[i + 2] + s - 1) // s)
        in_idx = [f"{strides[i]}*x{i} + {dil[i]}*k{i} - {pad_amt[i]}" for i in range(rank)]
        j = ", ".join
        sp = [f"L{i}" for i in range(rank)]
        if group == 1:
            in_dims, out_dims, out_idx = ["N", "C"] + sp, ["N", "M"] + sym_out, ["n", "m"]
            in_i, k_i, reshape = ["n", "c"], ["m"], "GO"
        else:
            in_dims = ["N", "GC"] + sp
            out_dims = ["N", str(group), f"M/{group}"] + sym_out
            out_idx = ["n", "g", "m"]
            in_i = ["n", f"(g * (GC/{group})) + c"]
            k_i = [f"(g*(M/{group}))+m"]
            reshape = f"reshape(GO, {j(str(o) for o in [x[0], k[0]] + num_out)})"
        out_idx += [f"x{i}" for i in range(rank)]
        text = f"""
        function (I[{j(in_dims)}], K[M, C, {j(f'LK{i}' for i in range(rank))}]) -> (O) {{
            GO[{j(out_idx)} : {j(out_dims)}] = +(I[{j(in_i + in_idx)}]*K[{j(k_i + ['c'] + [f'k{i}' for i in range(rank)])}]);
            O = {reshape};
        }}"""

        def oracle(I, K, strides=strides, dil=dil, padding=padding, pads=pads, group=group):
            return {"O": ora.conv(I, K, data_format="channels_first", strides=strides,
                                  dilations=dil, padding=padding, pads=pads, groups=group)}

        extra, note = {}, "ONNX Conv (NCHW data, (M, C/group, *K) kernel)."
        if auto_pad:
            extra["plaidml_fails"] = "its parser rejects max( inside an index polynomial"
            note += ("  With auto_pad SAME this module (unlike op.py) writes the padding "
                     "formula, max(...) included, straight into the input's index; PlaidML "
                     "0.7.0's parser rejects that (syntax error at 'max('); the oracle is the "
                     "convolution it means.")
        out.append(_case(f"conv.{tag}", "Convolution", text, {"I": _f32(x), "K": _f32(k)},
                         oracle, note, via="ONNX Conv", group=group, strides=strides,
                         dilations=dil, pads=pads, auto_pad=auto_pad, **extra))
    return out


def misc():
    out = []
    for shape, size in [((1, 7, 3, 3), 5), ((2, 4, 5), 3)]:
        rank = len(shape) - 2
        dims = ", ".join(["N", "C"] + [f"D{i}" for i in range(rank)])
        oidx = ", ".join(["n", "c"] + [f"d{i}" for i in range(rank)])
        iidx = ", ".join(["n", f"c-{size // 2}+z"] + [f"d{i}" for i in range(rank)])
        text = f"""
        function (I[{dims}]) -> (O) {{
          O[{oidx} : {dims}] = +(I[{iidx}]), z < {size};
        }}"""

        def oracle(I, size=size):
            x = _f64(I)
            half = size // 2
            o = np.zeros_like(x)
            for c in range(x.shape[1]):
                o[:, c] = x[:, max(0, c - half):min(x.shape[1], c - half + size)].sum(1)
            return {"O": ora.f32(o)}

        out.append(_case(f"local_channel_sum.{len(shape)}d_size{size}", "LocalChannelSum", text,
                         {"I": _f32(shape)}, oracle,
                         "Sum over the channel window [c - size//2, c - size//2 + size), "
                         "clipped at the edges (the LRN denominator's sum; its input is X*X).",
                         via="ONNX LRN", size=size))
    for n, shape in [(2, (3, 4)), (3, (2, 3, 2))]:
        names = [f"I{i}" for i in range(n)]
        text = f"""
        function ({','.join(names)}) -> (O) {{
            O = (({'+'.join(names)}) / {n});
        }}
        """
        out.append(_case(f"mean.{n}inputs", "Mean", text, {nm: _f32(shape) for nm in names},
                         lambda **a: {"O": ora.f32(sum(_f64(v) for v in a.values()) / len(a))},
                         via="ONNX Mean", n_inputs=n))
    text = """
            function (I) -> (O) {
                O = cmp_eq(I, 0);
            } """
    for shape in [(3, 4), (2, 2, 3)]:
        out.append(_case(f"not.{len(shape)}d", "Not", text, {"I": (shape, "bool")},
                         lambda I: {"O": np.logical_not(I)}, via="ONNX Not"))
    for shape, axis in [((2, 3, 4), 1), ((3, 4), 0), ((2, 2, 3), 3)]:
        nd = len(shape)
        left = "*".join(["1"] + [f"N{i}" for i in range(axis)])
        right = "*".join(["1"] + [f"N{i}" for i in range(axis, nd)])
        text = (f"function (I[{', '.join(f'N{i}' for i in range(nd))}]) -> (O) "
                f"{{ O = reshape(I, {left}, {right}); }}")
        out.append(_case(f"flatten.{nd}d_axis{axis}", "Flatten", text, {"I": _f32(shape)},
                         lambda I, axis=axis: {"O": I.reshape(int(np.prod(I.shape[:axis])), -1)},
                         via="ONNX Flatten", axis=axis))
    for tag, shape, pads, value in [("zeros_2d", (3, 4), [1, 0, 2, 1], None),
                                    ("value_2d", (2, 3), [0, 2, 1, 1], 1.5),
                                    ("value_3d", (2, 2, 3), [1, 0, 1, 0, 1, 2], -0.5)]:
        rank = len(shape)
        in_dims = [f"D{d}" for d in range(rank)]
        out_dims, in_idxs = list(in_dims), [f"d{d}" for d in range(rank)]
        out_idxs = list(in_idxs)
        for i in range(rank):
            s, e = pads[i], pads[i + rank]
            if s + e:
                out_dims[i] = f"D{i}+{s + e}"
            if s:
                out_idxs[i] = f"d{i}+{s}"
        j = ", ".join
        inputs = {"I": _f32(shape)}
        gen = {}
        if value:
            text = f"""
            function (I[{j(in_dims)}], One[], V[]) -> (O) {{
                Ones[{j(out_idxs)} : {j(in_dims)}] = =(One[]);
                InMask[{j(out_idxs)} : {j(out_dims)}] = =(Ones[{j(in_idxs)}]);
                ValMask = 1 - InMask;
                Vals = ValMask * V;
                Ins[{j(out_idxs)} : {j(out_dims)}] = =(I[{j(in_idxs)}]);
                O = Ins+Vals;
            }}"""
            inputs["One"] = ((), "int32")
            inputs["V"] = _f32(())
            gen = {"One": ("fixed", 1), "V": ("fixed", value)}
        else:
            text = f"""
            function (I[{j(in_dims)}]) -> (O) {{
                O[{j(out_idxs)} : {j(out_dims)}] = =(I[{j(in_idxs)}]);
            }}"""
        widths = [(pads[i], pads[i + rank]) for i in range(rank)]

        def oracle(I, widths=widths, value=value or 0.0, **_):
            return {"O": np.pad(I, widths, constant_values=value)}

        out.append(_case(f"pad_constant.{tag}", "PadConstant", text, inputs, oracle,
                         "One is the Python int 1 and V the pad value (PlaidML constants).  "
                         "Ones[...] is written through the shifted output indices, which range "
                         "over negative values too, so it is all ones." if value else "",
                         via="ONNX Pad(mode='constant')", pads=pads, value=value, gen=gen))
    for alpha, gamma in [(1.6732, 1.0507), (0.5, 2.0)]:
        text = f"""
        function (X) -> (Y) {{
            Y = (X <= 0.0 ? ({gamma}*({alpha}*exp(X)-{alpha})) : ({gamma}*X));
        }}
        """

        def oracle(X, alpha=alpha, gamma=gamma):
            x = _f64(X)
            return {"Y": ora.f32(np.where(x <= 0, gamma * (alpha * np.exp(x) - alpha), gamma * x))}

        out.append(_case(f"selu.a{alpha}_g{gamma}", "Selu", text, {"X": _f32((3, 5))}, oracle,
                         via="ONNX Selu", alpha=alpha, gamma=gamma))
    text = """
            function (I) -> (O) {
                O = sqrt(I);
            } """
    for shape in [(4, 5), (2, 3, 2)]:
        out.append(_case(f"sqrt.{len(shape)}d", "Sqrt", text, {"I": _f32(shape)},
                         lambda I: {"O": ora.f32(np.sqrt(_f64(I)))}, via="ONNX Sqrt",
                         gen={"I": ("uniform", 0.01, 4.0)}))
    for alpha in [1.0, 0.25]:
        text = f"""
        function (X) -> (Y) {{ Y = (X <= {alpha} ? 0.0 : X); }}
        """
        out.append(_case(f"thresholded_relu.a{alpha}", "ThresholdedRelu", text,
                         {"X": _f32((4, 5))},
                         lambda X, alpha=alpha: {"Y": np.where(X <= alpha, 0.0, X).astype(np.float32)},
                         via="ONNX ThresholdedRelu", alpha=alpha,
                         gen={"X": ("signed", 0.1, 2.0)}))
    for shape, perm in [((3, 4), None), ((2, 3, 4), (1, 2, 0))]:
        nd = len(shape)
        p = list(range(nd - 1, -1, -1)) if perm is None else list(perm)
        j = ", ".join
        text = f"""
        function (I[{j(f'D{d}' for d in range(nd))}]) -> (O) {{
            O[{j(f'd{p[d]}' for d in range(nd))} : {j(f'D{p[d]}' for d in range(nd))}] = =(I[{j(f'd{d}' for d in range(nd))}]);
        }}"""
        out.append(_case(f"transpose.{nd}d", "Transpose", text, {"I": _f32(shape)},
                         lambda I, p=p: {"O": np.transpose(I, p)}, via="ONNX Transpose",
                         perm=perm))
    return out


def cases():
    return convolution() + misc()
