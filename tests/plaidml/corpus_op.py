"""plaidml/op.py (0.7.0): reductions, element-wise ops, shape ops.  Convolutions and pooling
are in corpus_conv.py, the remaining shape-building ops in corpus_op2.py."""

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


# ------------------------------------------------------------------ All / Any
def all_any():
    out = []
    for fn, shape, axis, keepdims in [("all", (3, 4), None, False), ("all", (2, 3, 4), [1], True),
                                      ("any", (4, 5), [0], False), ("any", (2, 3, 4), [2, 0], True)]:
        ax = list(range(len(shape))) if axis is None else axis
        _, s = agg_subs(len(shape), ax, keepdims)
        if fn == "all":
            text = f"""function (I[{s['src_ranges']}]) -> (O) {{
                   Temp = (I == 0.0 ? 0.0 : 1.0);
                   M[{s['dest_indices']}{s['dest_sep']}{s['dest_ranges']}] = *(Temp[{s['src_indices']}]);
                   O = as_uint(M, 8);
               }}"""
        else:
            text = f"""
            function (I[{s['src_ranges']}]) -> (O) {{
                Temp = (I == 0.0 ? 0.0 : 1.0);
                S[{s['dest_indices']}{s['dest_sep']}{s['dest_ranges']}] = +(Temp[{s['src_indices']}]);
                F = (S == 0.0 ? 0.0 : 1.0);
                O = as_uint(F, 8);
            }}"""
        npfn = np.all if fn == "all" else np.any

        def oracle(I, npfn=npfn, ax=tuple(ax), keepdims=keepdims):
            return {"O": npfn(I != 0, axis=ax, keepdims=keepdims).astype(np.uint8)}

        tag = f"{len(shape)}d_ax{''.join(map(str, ax))}{'_keep' if keepdims else ''}"
        out.append(_case(f"{fn}.{tag}", fn.capitalize(), text, {"I": _f32(shape)}, oracle,
                         via=f"op.{fn} / keras {fn}", axis=axis, keepdims=keepdims,
                         gen={"I": ("choice", [0.0, 1.0, 2.0, -1.5, 3.0, 0.5])}))
    return out


# ------------------------------------------------------------------ ArgMax
def argmax():
    out = []
    for shape, axis in [((4, 6), -1), ((5, 3), 0), ((2, 4, 5), 1)]:
        _, s = agg_subs(len(shape), [axis], False)
        text = f"""
        function (I[{s['src_ranges']}], One[]) -> (O) {{
            Max[{s['dest_indices']}{s['dest_sep']}{s['dest_ranges']}] = >(I[{s['src_indices']}]);
            IndexT[{s['reduce_indices']} : {s['reduce_ranges']}] = =(One[]);
            Index = index(IndexT, 0);
            AM[{s['dest_indices']}{s['dest_sep']}{s['dest_ranges']}] = >(I[{s['src_indices']}] == Max[{s['dest_indices']}] ? Index[{s['reduce_indices']}]);
            O = as_uint(AM, 32);
        }}"""

        def oracle(I, One, axis=axis):
            return {"O": np.argmax(I, axis=axis).astype(np.uint32)}

        out.append(_case(f"argmax.{len(shape)}d_axis{axis}", "ArgMax", text,
                         {"I": _f32(shape), "One": _f32(())}, oracle,
                         "PlaidML declares the output INT64 but the program's last step is "
                         "as_uint(AM, 32), so the expected dtype is uint32.  Ties resolve to "
                         "the largest index (max over matching indices) where np.argmax takes "
                         "the first; random floats have no ties.",
                         via="op.argmax / keras argmax (keras argmin = argmax(-x))", axis=axis,
                         gen={"One": ("fixed", 1.0)}))
    return out


# ------------------------------------------------------------------ BinaryCrossentropy
def binary_crossentropy():
    out = []
    for shape in [(3, 4), (2, 3, 4)]:
        dims = ",".join(f"I{i}" for i in range(len(shape)))
        prod = "*".join(f"I{i}" for i in range(len(shape)))
        text = f"""
            function (O[{dims}], T[{dims}]) -> (R) {{
                R = builtin_binary_crossentropy(O,T,{prod});
            }}"""

        def oracle(O, T):
            O, T = O.astype(np.float64), T.astype(np.float64)
            return {"R": ora.f32(-T * np.log(O) - (1 - T) * np.log(1 - O))}

        out.append(_case(f"binary_crossentropy.{len(shape)}d", "BinaryCrossentropy", text,
                         {"O": _f32(shape), "T": _f32(shape)}, oracle,
                         "O is the already clipped prediction (the clip is two separate "
                         "ClipMin/ClipMax programs); element-wise, no mean.",
                         via="op.binary_crossentropy / keras binary_crossentropy",
                         gen={"O": ("uniform", 0.05, 0.95), "T": ("uniform", 0.0, 1.0)}))
    return out


# ------------------------------------------------------------------ Cast
def cast():
    out = []
    for tag, shape, src, base, bits, dst, gen in [
        ("f32_to_i32", (3, 5), "float32", "int", 32, "int32", ("signed", 0.2, 40.0)),
        ("f32_to_u8", (4, 4), "float32", "uint", 8, "uint8", ("uniform", 0.0, 250.0)),
        ("i32_to_f32", (2, 3, 4), "int32", "float", 32, "float32", ("int", -50, 50)),
        ("f32_to_bool", (3, 4), "float32", "bool", 1, "bool", ("choice", [0.0, 1.5, -2.0])),
        ("f32_to_i16", (6,), "float32", "int", 16, "int16", ("signed", 0.2, 300.0)),
    ]:
        text = f"function (I) -> (O) {{ O = as_{base}(I, {bits}); }}"

        def oracle(I, dst=dst):
            if dst == "bool":
                return {"O": I != 0}
            if np.dtype(dst).kind in "iu":
                return {"O": np.trunc(I).astype(dst)}
            return {"O": I.astype(dst)}

        out.append(_case(f"cast.{tag}", "Cast", text, {"I": (shape, src)}, oracle,
                         "Float to integer conversion truncates toward zero (C conversion); "
                         "inputs stay inside the target range.", via="op.cast / keras cast",
                         dtype=dst, gen={"I": gen}))
    return out


# ------------------------------------------------------------------ element-wise unary (tile.unary_op)
_UNARY = [
    ("ceiling", "ceil(I)", np.ceil, ("signed", 0.1, 3.0)),
    ("cos", "cos(I)", np.cos, ("signed", 0.1, 3.0)),
    ("exp", "exp(I)", np.exp, ("signed", 0.1, 3.0)),
    ("floor", "floor(I)", np.floor, ("signed", 0.1, 3.0)),
    ("log", "log(I)", np.log, ("uniform", 0.05, 5.0)),
    ("sigmoid", "sigmoid(I)", lambda x: 1 / (1 + np.exp(-x)), ("signed", 0.1, 4.0)),
    ("sin", "sin(I)", np.sin, ("signed", 0.1, 3.0)),
    ("tanh", "tanh(I)", np.tanh, ("signed", 0.1, 3.0)),
]


def unary():
    out = []
    for fn, expr, npfn, gen in _UNARY:
        for shape in [(3, 4), (2, 3, 5)]:
            def oracle(I, npfn=npfn):
                return {"O": ora.f32(npfn(I.astype(np.float64)))}

            out.append(Case(f"op.{fn}.{len(shape)}d", f"{OP}:{fn}",
                            f"function (I) -> (O) {{ O = {expr}; }}", {"I": _f32(shape)},
                            oracle, dict(via=f"op.{fn} (text from tile.unary_op)", gen={"I": gen})))
    return out


# ------------------------------------------------------------------ ClipMin / ClipMax
def clip():
    out = []
    for cls, shape, bound in [("ClipMin", (3, 4), -0.3), ("ClipMin", (2, 3, 2), 0.25),
                              ("ClipMax", (3, 4), 0.4), ("ClipMax", (5,), -0.2)]:
        if cls == "ClipMin":
            text = """
               function (I, MIN_VAL) -> (O) {
                   O = (MIN_VAL < I ? I : MIN_VAL);
               }"""
            inputs = {"I": _f32(shape), "MIN_VAL": _f32(())}

            def oracle(I, MIN_VAL):
                return {"O": np.maximum(I, MIN_VAL)}
            gen = {"MIN_VAL": ("fixed", bound)}
        else:
            text = """
               function (I, MAX_VAL) -> (O) {
                   O = (I < MAX_VAL ? I : MAX_VAL);
               }"""
            inputs = {"I": _f32(shape), "MAX_VAL": _f32(())}

            def oracle(I, MAX_VAL):
                return {"O": np.minimum(I, MAX_VAL)}
            gen = {"MAX_VAL": ("fixed", bound)}
        out.append(_case(f"clip.{cls.lower()}_{len(shape)}d", cls, text, inputs, oracle,
                         "The bound is a Python float that PlaidML turns into a 0-d tensor.",
                         via="op.clip / keras clip", bound=bound, gen=gen))
    return out


# ------------------------------------------------------------------ Concatenate
def concatenate():
    out = []
    for tag, shapes, axis, symbolic in [
            ("axis1_3in", [(4, 3, 2), (4, 5, 2), (4, 1, 2)], 1, False),
            ("axis0", [(2, 3), (3, 3)], 0, False),
            ("axis_last", [(2, 2, 3), (2, 2, 1)], -1, False),
            ("symbolic_axis0_3in", [(2, 3), (1, 3), (3, 3)], 0, True)]:
        rank = len(shapes[0])
        ax = axis % rank
        offsets = [0]
        if symbolic:  # a symbolic size on the concatenation axis: offsets are sums of A<i>
            offsets += ["+".join(f"A{j}" for j in range(i + 1)) for i in range(len(shapes))]
        else:
            for s in shapes:
                offsets.append(offsets[-1] + s[ax])
        odims = [f"N{i}" for i in range(rank)]
        odims[ax] = offsets[-1]
        odims_s = ", ".join(str(d) for d in odims)
        ins = []
        for i in range(len(shapes)):
            d = list(odims)
            d[ax] = f"A{i}"
            ins.append(f"I{i}[{', '.join(str(x) for x in d)}]")
        beg = "a" if ax == 0 else ", ".join(f"n{i}" for i in range(ax)) + ", a"
        end = "" if ax == rank - 1 else ", " + ", ".join(f"n{i}" for i in range(ax + 1, rank))
        body = "".join(f"  T{i}[{beg}+{offsets[i]}{end}: {odims_s}] = =(I{i}[{beg}{end}]);\n"
                       for i in range(len(shapes)))
        body += "  O = " + " + ".join(f"T{i}" for i in range(len(shapes))) + ";"
        text = f"function ({', '.join(ins)}) -> (O) {{\n{body}\n}}"

        def oracle(ax=ax, **arrays):
            return {"O": np.concatenate([arrays[f"I{i}"] for i in range(len(arrays))], axis=ax)}

        out.append(_case(f"concatenate.{tag}", "Concatenate", text,
                         {f"I{i}": _f32(s) for i, s in enumerate(shapes)}, oracle,
                         "An input with a symbolic size on the axis makes PlaidML write the "
                         "offsets and the output size as sums of the A<i> size symbols."
                         if symbolic else "",
                         via="op.concatenate / keras concatenate, stack", axis=axis,
                         symbolic_axis=symbolic))
    return out


# ------------------------------------------------------------------ CumulativeSum / Prod
def cumulative():
    out = []
    for cls, agg, shape, axis in [("CumulativeSum", "+", (4, 5), 0),
                                  ("CumulativeSum", "+", (2, 3, 6), 2),
                                  ("CumulativeProd", "*", (5, 4), 1),
                                  ("CumulativeProd", "*", (3, 4, 2), 0)]:
        ranges = ", ".join(f"N{n}" for n in range(len(shape)))
        dest = ", ".join(f"i{n}" for n in range(len(shape)))
        src = [f"i{n}" for n in range(len(shape))]
        src[axis] += " - k"
        text = f"""
            function (I[{ranges}]) -> (O) {{
                O[{dest}: {ranges}] = {agg}(I[{', '.join(src)}]), k < N{axis};
            }}"""
        npfn = np.cumsum if agg == "+" else np.cumprod

        def oracle(I, npfn=npfn, axis=axis):
            return {"O": ora.f32(npfn(I.astype(np.float64), axis=axis))}

        out.append(_case(f"{cls.lower()}.{len(shape)}d_axis{axis}", cls, text,
                         {"I": _f32(shape)}, oracle,
                         via=f"op.{'cumulative_sum' if agg == '+' else 'cumulative_prod'} / "
                             f"keras {'cumsum' if agg == '+' else 'cumprod'}", axis=axis,
                         gen={"I": ("signed", 0.5, 1.5)}))
    return out


# ------------------------------------------------------------------ Dot
def dot():
    out = [_case("dot.1d_1d", "Dot", "function (X[I], Y[I]) -> (R) { R[i:I] = +(X[i] * Y[i]); }",
                 {"X": _f32((7,)), "Y": _f32((7,))}, lambda X, Y: {"R": X * Y},
                 "For two vectors PlaidML's Dot is the element-wise product with the vector's "
                 "shape (the op declares x.shape as the output), not numpy's scalar dot; the "
                 "oracle follows PlaidML's declared meaning.", via="op.dot / keras dot")]
    for xs, ys in [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 3)), ((2, 3), (4, 3, 2))]:
        xn, yn = len(xs), len(ys)
        dest_i = [f"x{i}" for i in range(xn - 1)] + [f"y{i}" for i in list(range(yn - 2)) + [yn - 1]]
        dest_r = [f"X{i}" for i in range(xn - 1)] + [f"Y{i}" for i in list(range(yn - 2)) + [yn - 1]]
        x_i = [f"x{i}" for i in range(xn - 1)] + ["z"]
        y_i = [f"y{i}" for i in range(yn - 2)] + ["z", f"y{yn - 1}"]
        text = f"""function(X[{', '.join(f'X{i}' for i in range(xn))}], Y[{', '.join(f'Y{i}' for i in range(yn))}]) -> (R) {{
                       R[{', '.join(dest_i)} : {', '.join(dest_r)}] = +(X[{', '.join(x_i)}] * Y[{', '.join(y_i)}]);
                   }}"""
        out.append(_case(f"dot.{xn}d_{yn}d", "Dot", text, {"X": _f32(xs), "Y": _f32(ys)},
                         lambda X, Y: {"R": ora.f32(np.dot(X.astype(np.float64), Y))},
                         via="op.dot / keras dot"))
    return out


# ------------------------------------------------------------------ Elu
def elu():
    out = []
    for alpha, shape in [(1.0, (3, 4)), (0.5, (2, 3, 4))]:
        if alpha == 1:
            text = """
                   function (X) -> (R) {
                       A = exp(X)-1;
                       R = (X < 0 ? A : X);
                   }"""
        else:
            text = f"""
                   function (X) -> (R) {{
                       A = {alpha}*exp(X) - {alpha};
                       R = X < 0 ? A : X;
                   }}"""

        def oracle(X, alpha=alpha):
            x = X.astype(np.float64)
            return {"R": ora.f32(np.where(x < 0, alpha * (np.exp(x) - 1), x))}

        out.append(_case(f"elu.alpha{alpha}", "Elu", text, {"X": _f32(shape)}, oracle,
                         via="op.elu / keras elu", alpha=alpha))
    return out


# ------------------------------------------------------------------ Equal / NotEqual
def equal():
    out = []
    vals = ("choice", [0.0, 1.0, 2.0])
    for cls, sym, npfn in [("Equal", "==", np.equal), ("NotEqual", "!=", np.not_equal)]:
        for tag, lshape, rhs in [("same_shape", (3, 4), (3, 4)), ("broadcast", (3, 4), (4,)),
                                 ("scalar_rhs", (2, 5), 2)]:
            if isinstance(rhs, tuple):
                text = f"function (L, R) -> (O) {{ O = (L {sym} R); }}"
                inputs = {"L": _f32(lshape), "R": _f32(rhs)}

                def oracle(L, R, npfn=npfn):
                    return {"O": npfn(L, R)}
            else:
                text = f"function (L) -> (O) {{ O = (L {sym} {rhs}); }}"
                inputs = {"L": _f32(lshape)}

                def oracle(L, npfn=npfn, rhs=rhs):
                    return {"O": npfn(L, rhs)}
            out.append(_case(f"{cls.lower()}.{tag}", cls, text, inputs, oracle,
                             via=f"op.{cls.lower().replace('notequal', 'not_equal')} / keras",
                             rhs=rhs if not isinstance(rhs, tuple) else None,
                             gen={"L": vals, "R": vals}))
    return out


# ------------------------------------------------------------------ Flatten / Gather / Identity
def flatten_gather_identity():
    out = []
    for shape in [(2, 3, 4), (5, 2)]:
        idims = ", ".join(f"N{i}" for i in range(len(shape)))
        odims = "*".join(f"N{i}" for i in range(len(shape)))
        out.append(_case(f"flatten.{len(shape)}d", "Flatten",
                         f"function (I[{idims}]) -> (O) {{ O = reshape(I, {odims}); }}",
                         {"I": _f32(shape)}, lambda I: {"O": I.reshape(-1)},
                         via="op.flatten / keras flatten"))
    for vshape, ishape in [((5, 3), (4,)), ((6,), (2, 3)), ((4, 2, 3), (3, 2))]:
        out.append(_case(f"gather.v{len(vshape)}d_i{len(ishape)}d", "Gather",
                         "function (V, I) -> (O) { O = gather(V, I); }",
                         {"V": _f32(vshape), "I": (ishape, "int32")},
                         lambda V, I: {"O": np.take(V, I, axis=0)},
                         via="op.gather / keras gather", gen={"I": ("int", 0, vshape[0])}))
    for shape in [(3, 4), (2, 2, 3)]:
        out.append(_case(f"identity.{len(shape)}d", "Identity",
                         "function (X) -> (Y) { Y = X; }", {"X": _f32(shape)},
                         lambda X: {"Y": X.copy()}, via="op.identity / keras identity"))
    return out


def cases():
    return (all_any() + argmax() + binary_crossentropy() + cast() + unary() + clip()
            + concatenate() + cumulative() + dot() + elu() + equal() + flatten_gather_identity())
