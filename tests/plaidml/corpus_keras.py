"""plaidml/keras/backend.py (0.7.0): the Tile programs the Keras backend writes itself."""

# ruff: noqa: E501  (Tile lines are kept as PlaidML writes them, some over 100 columns)

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from . import oracles as ora
from .case import Case

KB = "plaidml/keras/backend.py"


def _case(name, fn, program, inputs, oracle, notes="", **params):
    return Case(f"keras.{name}", f"{KB}:{fn}", program, inputs, oracle, params, notes)


def _f32(shape):
    return (tuple(shape), "float32")


def _f64(x):
    return np.asarray(x, np.float64)


# ------------------------------------------------------------------ BatchDot
def _batch_dot_theano(xn, yn, axes):
    xd = [f"M{i}" for i in range(xn)]
    xd[0], xd[axes[0]] = "B", "D"
    yd = [f"N{i}" for i in range(yn)]
    yd[0], yd[axes[1]] = "B", "D"
    od = [d for d in xd if d != "D"] + [d for d in yd[1:] if d != "D"]
    j = ", ".join
    return f"""
                function (X[{j(xd)}], Y[{j(yd)}]) -> (O) {{
                    O[{j(d.lower() for d in od)}: {j(od)}] = +(X[{j(d.lower() for d in xd)}] * Y[{j(d.lower() for d in yd)}]);
                }}"""


def _batch_dot_tf(xs, ys, axes):
    xn, yn = len(xs), len(ys)
    x_excl = xs[:axes[0]] + xs[axes[0] + 1:]
    y_excl = ys[:axes[1]] + ys[axes[1] + 1:]
    xd = [f"M{i}" for i in range(xn)]
    xd[0], xd[axes[0]] = "B", "D"
    yd = [f"N{i}" for i in range(yn)]
    yd[0], yd[axes[1]] = "B", "D"
    m_only = [m for m in xd if m.startswith("M")]
    n_only = [n for n in yd if n.startswith("N")]
    pairs = OrderedDict()
    if len(y_excl) > len(x_excl):
        for i in range(len(m_only)):
            pairs[n_only[i]] = m_only[i]
    elif len(y_excl) == len(x_excl):
        for i in range(len(m_only) - 1):
            pairs[n_only[i]] = m_only[i]
    else:
        for i in range(len(n_only)):
            pairs[n_only[i]] = m_only[i]
    xi = [xd[n].lower() if xs[n] >= 1 else "0" for n in range(xn)]
    yi = [yd[n].lower() if ys[n] >= 1 else "0" for n in range(yn)]
    if pairs:
        yi = [pairs[v.upper()].lower() if v.upper() in pairs else v for v in yi]
    od = ["B"] + [f"O{n + 1}" for n in range(len(pairs))]
    oi = ["b"]
    if len(m_only) > len(n_only):
        od += m_only[len(n_only):]
        oi += [v.lower() for v in m_only[len(n_only):]]
    elif len(n_only) > len(m_only):
        od += n_only[len(m_only):]
        oi += [v.lower() for v in n_only[len(m_only):]]
    else:
        od += [v for v in m_only if v not in pairs.values()]
        od += [v for v in n_only if v not in pairs.keys()]
        oi += [v.lower() for v in m_only]
        oi += [v.lower() for v in n_only if v not in pairs.keys()]
    cmds = " ".join(f"O{i + 1} = broadcast({v},{k});" for i, (k, v) in enumerate(pairs.items()))
    j = ", ".join
    return f"""
                function (X[{j(xd)}], Y[{j(yd)}]) -> (O) {{
                    {cmds}
                    O[{j(oi)}: {j(od)}] = +(X[{j(xi)}] * Y[{j(yi)}]);
                }}"""


def batch_dot():
    out = []
    for tag, xs, ys, axes, eq in [("3d_3d", (3, 4, 5), (3, 5, 2), (2, 1), "bmd,bdn->bmn"),
                                  ("2d_2d", (3, 5), (3, 5), (1, 1), "bd,bd->b"),
                                  ("4d_3d", (2, 3, 4, 5), (2, 6, 5), (3, 2), "bpqd,bnd->bpqn"),
                                  ("3d_3d_axes1", (2, 5, 3), (2, 5, 4), (1, 1), "bdm,bdn->bmn")]:
        out.append(_case(f"batch_dot.theano_{tag}", "BatchDot", _batch_dot_theano(len(xs), len(ys), axes),
                         {"X": _f32(xs), "Y": _f32(ys)},
                         lambda X, Y, eq=eq: {"O": ora.f32(np.einsum(eq, _f64(X), _f64(Y)))},
                         "Theano-style output (the default).  A 1-d result is then expanded by "
                         "a separate ExpandDims program.", via="keras batch_dot", axes=axes))
    for tag, xs, ys, axes, eq in [("3d_3d", (3, 4, 5), (3, 5, 2), (2, 1), "bmd,bdn->bmn"),
                                  ("4d_4d_bcast", (2, 3, 4, 5), (2, 3, 5, 6), (3, 2),
                                   "bmpd,bmdn->bmpn"),
                                  ("2d_2d", (3, 5), (3, 5), (1, 1), "bd,bd->b"),
                                  ("4d_2d", (2, 3, 4, 5), (2, 5), (3, 1), "bmpd,bd->bmp")]:
        out.append(_case(f"batch_dot.tf_{tag}", "BatchDot", _batch_dot_tf(xs, ys, axes),
                         {"X": _f32(xs), "Y": _f32(ys)},
                         lambda X, Y, eq=eq: {"O": ora.f32(np.einsum(eq, _f64(X), _f64(Y)))},
                         "With PLAIDML_BATCHDOT_TF_BEHAVIOR set: TensorFlow's output shape, "
                         "with broadcast(M,N) size builtins for paired dims (equal sizes here).",
                         via="keras batch_dot (PLAIDML_BATCHDOT_TF_BEHAVIOR=1)", axes=axes))
    return out


# ------------------------------------------------------------------ flatten / crossentropy / expand
def flatten_xent_expand():
    out = []
    for shape in [(2, 3, 4), (3, 2, 2, 2)]:
        idims = ", ".join(f"N{i}" for i in range(len(shape)))
        odims = "N0, " + "*".join(f"N{i}" for i in range(1, len(shape)))
        out.append(_case(f"batch_flatten.{len(shape)}d", "BatchFlatten",
                         f"function (I[{idims}]) -> (O) {{\n  O = reshape(I, {odims});\n}}",
                         {"I": _f32(shape)}, lambda I: {"O": I.reshape(I.shape[0], -1)},
                         via="keras batch_flatten"))
    one = """
                function (O[Y], T[Y]) -> (R) {
                    LO = log(O);
                    TR[] = +(T[y] * LO[y]);
                    R = -TR;
                }"""
    for shape in [(5,), (4, 3), (2, 3, 4)]:
        if len(shape) == 1:
            text = one
        else:
            fd = ",".join(f"X{i}" for i in range(len(shape) - 1))
            fi = ",".join(f"x{i}" for i in range(len(shape) - 1))
            text = f"""
                function (O[{fd},Y], T[{fd},Y]) -> (R) {{
                    LO = log(O);
                    TR[{fi}:{fd}] = +(T[{fi},y] * LO[{fi},y]);
                    R = -TR;
                }}"""
        out.append(_case(f"categorical_crossentropy.{len(shape)}d", "CategoricalCrossentropy",
                         text, {"O": _f32(shape), "T": _f32(shape)},
                         lambda O, T: {"R": ora.f32(-(_f64(T) * np.log(_f64(O))).sum(-1))},
                         "O is the normalised, clipped prediction (those steps are separate "
                         "programs).", via="keras categorical_crossentropy, "
                                           "sparse_categorical_crossentropy",
                         gen={"O": ("uniform", 0.05, 1.0), "T": ("uniform", 0.0, 1.0)}))
    for shape, axis in [((3, 4), -1), ((3, 4), 0), ((2, 3, 4), 1), ((5,), 1)]:
        nd = len(shape)
        ax = nd + 1 + axis if axis < 0 else axis
        sin = [f"S{i}" for i in range(nd)]
        iin = [f"i{i}" for i in range(nd)]
        sout = sin[:ax] + ["1"] + sin[ax:]
        iout = iin[:ax] + ["0"] + iin[ax:]
        text = f"""
            function (IN[{', '.join(sin)}]) -> (OUT) {{
                OUT[{', '.join(iout)} : {', '.join(sout)}] = =(IN[{', '.join(iin)}]);
            }}"""
        out.append(_case(f"expand_dims.{nd}d_axis{axis}", "ExpandDims", text, {"IN": _f32(shape)},
                         lambda IN, ax=ax: {"OUT": np.expand_dims(IN, ax)},
                         via="keras expand_dims, batch_dot", axis=axis))
    return out


# ------------------------------------------------------------------ element-wise one-liners
def elementwise():
    out = []
    hs = "function (X) -> (R) { R = (X < -2.5 ? 0 : (X > 2.5 ? 1 : 0.2 * X + 0.5)); }"
    for shape in [(4, 5), (2, 3, 4)]:
        out.append(_case(f"hard_sigmoid.{len(shape)}d", "hard_sigmoid", hs, {"X": _f32(shape)},
                         lambda X: {"R": ora.f32(np.clip(0.2 * _f64(X) + 0.5, 0, 1))},
                         via="keras hard_sigmoid", gen={"X": ("signed", 0.1, 4.0)}))
    for shape in [(3, 4), (2, 5, 2)]:
        out.append(Case(f"keras.round.{len(shape)}d", f"{KB}:round",
                        "function (I) -> (O) { O = round(I); }", {"I": _f32(shape)},
                        lambda I: {"O": ora.f32(ora.round_half_away(I))},
                        dict(via="keras round (tile.unary_op)",
                             gen={"I": ("choice", [-2.5, -1.7, -0.5, 0.2, 0.5, 1.5, 2.49, 3.6])}),
                        "Halves round away from zero (C/OpenCL round()), not to even."))
        out.append(Case(f"keras.sign.{len(shape)}d", f"{KB}:sign",
                        "function (I) -> (O) { O = I == 0 ? 0 : (I > 0 ? 1 : -1); }",
                        {"I": _f32(shape)}, lambda I: {"O": np.sign(I).astype(np.int32)},
                        dict(via="keras sign (tile.unary_op)",
                             gen={"I": ("choice", [-2.0, -0.5, 0.0, 0.7, 3.0])}),
                        "The branches are integer literals, so the result is int32 (PlaidML "
                        "0.7.0 gives int32; tile.unary_op declares the input's float32)."))
        out.append(Case(f"keras.abs.{len(shape)}d", f"{KB}:abs",
                        "function (I) -> (O) { O = abs(I); }", {"I": _f32(shape)},
                        lambda I: {"O": np.abs(I)},
                        dict(via="keras abs -> builtins.abs -> tile.Value.__abs__")))
    rg = "function (L, R) -> (O) { O = reverse_grad(L, R); }"
    for shape, coeff in [((3, 4), 1.0), ((2, 3, 2), 0.5)]:
        out.append(Case(f"keras.reverse_gradient.{len(shape)}d", f"{KB}:reverse_gradient", rg,
                        {"L": _f32(shape), "R": _f32(())}, lambda L, R: {"O": L.copy()},
                        dict(via="keras reverse_gradient (tile.binary_op)", coeff=coeff,
                             gen={"R": ("fixed", coeff)}),
                        "Forward value is the identity (PlaidML builtin reverse_grad(X1, X2) = "
                        "X1); R only scales the gradient."))
    sw = "function (C, T, E) -> (O) { O = (C ? T : E); }"
    for tag, cshape in [("scalar_cond", ()), ("tensor_cond", (3, 4))]:
        out.append(_case(f"switch.{tag}", "Switch", sw,
                         {"C": (cshape, "bool"), "T": _f32((3, 4)), "E": _f32((3, 4))},
                         lambda C, T, E: {"O": np.where(C, T, E)},
                         via="keras switch, in_train_phase", gen={"C": ("bool", 0.5)}))
    return out


def cases():
    from . import corpus_keras2

    return batch_dot() + flatten_xent_expand() + elementwise() + corpus_keras2.cases()
