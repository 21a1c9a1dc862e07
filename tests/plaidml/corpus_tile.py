"""plaidml/tile.py (0.7.0): the programs op.py and the Keras backend get from tile.py itself:
Value arithmetic (binary_op), maximum/minimum, ShapeOf, slicing (_SliceOf, used by
Value.__getitem__, e.g. keras rnn's inputs[:, i]), symbolic dims and broadcast sizes."""

from __future__ import annotations

import numpy as np

from . import oracles as ora
from .case import Case

TP = "plaidml/tile.py"


def _f32(shape):
    return (tuple(shape), "float32")


def _f64(x):
    return np.asarray(x, np.float64)


def binary_ops():
    out = []
    for fn, expr, npfn, shapes, use in [
        ("__add__", "L + R", np.add, [((2, 3, 4), (4,)), ((3, 4), (3, 4))],
         "keras bias_add (channels_last), batch_normalization, update_add"),
        ("__sub__", "L - R", np.subtract, [((3, 4), (3, 4)), ((2, 3), ())],
         "keras batch_normalization, update_sub"),
        ("__mul__", "L * R", np.multiply, [((3, 4), ()), ((2, 1, 4), (3, 1))],
         "keras square, moving_average_update"),
        ("__truediv__", "L / R", np.divide, [((3, 4), (3, 1)), ((5,), (5,))],
         "keras l2_normalize, softsign"),
        ("__floordiv__", "floor(L / R)", lambda a, b: np.floor(a / b),
         [((3, 4), (3, 4)), ((2, 3), (3,))], "Value // Value"),
        ("maximum", "max(L, R)", np.maximum, [((3, 4), (3, 4)), ((2, 3), ())],
         "op.maximum / keras maximum"),
        ("minimum", "min(L, R)", np.minimum, [((2, 3), (3,)), ((4,), (4,))],
         "op.minimum / keras minimum"),
    ]:
        for k, (lshape, rshape) in enumerate(shapes):
            out.append(Case(f"tile.binary.{fn.strip('_')}.{k}", f"{TP}:{fn}",
                            f"function (L, R) -> (O) {{ O = {expr}; }}",
                            {"L": _f32(lshape), "R": _f32(rshape)},
                            lambda L, R, npfn=npfn: {"O": ora.f32(npfn(_f64(L), _f64(R)))},
                            dict(via=f"tile.binary_op; {use}"),
                            "Numpy-style broadcasting (tile.broadcast_dims); a 0-d R is a "
                            "Python scalar operand."))
    for fn, expr, npfn, use in [("__gt__", "L > R", np.greater, "keras greater"),
                                ("__ge__", "L >= R", np.greater_equal, "keras greater_equal"),
                                ("__lt__", "L < R", np.less, "keras less"),
                                ("__le__", "L <= R", np.less_equal, "keras less_equal")]:
        for k, (lshape, rshape) in enumerate([((3, 4), (4,)), ((2, 3), (2, 3))]):
            out.append(Case(f"tile.compare.{fn.strip('_')}.{k}", f"{TP}:{fn}",
                            f"function (L, R) -> (O) {{ O = {expr}; }}",
                            {"L": _f32(lshape), "R": _f32(rshape)},
                            lambda L, R, npfn=npfn: {"O": npfn(L, R)},
                            dict(via=f"tile.binary_op(dtype=BOOLEAN); {use}",
                                 gen={"L": ("choice", [0.0, 1.0, 2.0]),
                                      "R": ("choice", [0.0, 1.0, 2.0])})))
    for shape in [(3, 4), (2, 3, 2)]:
        out.append(Case(f"tile.unary.neg.{len(shape)}d", f"{TP}:__neg__",
                        "function (I) -> (O) { O = -I; }", {"I": _f32(shape)},
                        lambda I: {"O": -I}, dict(via="tile.unary_op; keras argmin (argmax(-x))")))
    return out


def shape_of():
    out = []
    for shape in [(3, 4), (2, 3, 4, 5)]:
        out.append(Case(f"tile.shape_of.{len(shape)}d", f"{TP}:ShapeOf",
                        "function (I) -> (O) { O = shape(I); }", {"I": _f32(shape)},
                        lambda I: {"O": np.array(I.shape, np.int32)},
                        dict(via="op.shape_of / keras shape"),
                        "PlaidML's shape() gives INT32."))
    for shape, idx in [((3, 4), 1), ((2, 5, 3), 0)]:
        dims = ",".join(f"D{i}" for i in range(len(shape)))
        out.append(Case(f"tile.symbolic_dim.{len(shape)}d_d{idx}", f"{TP}:Value._dim",
                        f"function (I[{dims}]) -> (O) {{ O = D{idx}; }}", {"I": _f32(shape)},
                        lambda I, idx=idx: {"O": np.array(I.shape[idx], np.uint64)},
                        dict(via="tile.Value.shape.dims of a symbolic shape", check_dtype=False,
                             plaidml_scalar_output=True),
                        "The output is the size itself (a scalar); PlaidML declares UINT64 for "
                        "it, the element type is not checked.  PlaidML only ever feeds such a "
                        "value to another op; as a function's sole result its runtime aborts."))
    for tag, text, inputs, gen, want in [
        ("one_symbolic", "function (I0) -> (O) { O = broadcast(I0, 3); }",
         {"I0": ((), "int32")}, {"I0": ("choice", [1, 3])}, lambda a: 3),
        ("two_symbolic", "function (I0, I1) -> (O) { O = broadcast(I0, I1); }",
         {"I0": ((), "int32"), "I1": ((), "int32")},
         {"I0": ("choice", [1, 4]), "I1": ("fixed", 4)}, lambda a: 4),
    ]:
        out.append(Case(f"tile.broadcast_dims.{tag}", f"{TP}:broadcast_dims", text, inputs,
                        lambda want=want, **a: {"O": np.array(want(a), np.uint64)},
                        dict(via="tile.broadcast_dims with symbolic sizes", check_dtype=False,
                             gen=gen,
                             plaidml_scalar_output=True),
                        "broadcast() of sizes (symbolic sizes are bound as integers): the "
                        "numpy broadcast of the two sizes.  PlaidML declares UINT64; the element "
                        "type is not checked.  As for Value._dim, PlaidML only feeds this to "
                        "another op (run alone its runtime aborts)."))
    return out


# ------------------------------------------------------------------ _SliceOf
def _parse(dims, key, idx):
    """tile._SliceOf._parse_slice: (numerator, step, offset, extra statements)."""
    k = key[idx]
    if isinstance(k, int):
        return 1, None, k, []
    extra = []
    sym = dims[idx] is None
    step = 1 if k.step is None else k.step
    start = k.start if k.start is not None else (0 if step > 0 else -1)
    if start < 0:
        start = f"N{idx} + {start}" if sym else dims[idx] + start
    if step > 0:
        if sym:
            extra.append(f"Start{idx} = max({start}, 0);")
            start = f"Start{idx}"
        else:
            start = max(start, 0)
    else:
        if sym:
            extra.append(f"Start{idx} = min({start}, N{idx} - 1);")
            start = f"Start{idx}"
        else:
            start = min(start, dims[idx] - 1)
    stop = k.stop
    if stop is None:
        stop = (f"N{idx}" if sym else dims[idx]) if step > 0 else -1
        return (f"({stop} - ({start}))" if sym else stop - start), step, start, extra
    if stop < 0:
        stop = f"N{idx} + {stop}" if sym else dims[idx] + stop
    if step > 0:
        if sym:
            extra.append(f"Stop{idx} = min({stop}, N{idx});")
            stop = f"Stop{idx}"
        else:
            stop = min(stop, dims[idx])
    else:
        if sym:
            extra.append(f"Stop{idx} = max({stop}, -1);")
            stop = f"Stop{idx}"
        else:
            stop = max(stop, -1)
    return (f"({stop} - ({start}))" if sym else stop - start), step, start, extra


def sliceof_text(dims, key):
    if not isinstance(key, tuple):
        key = (key,)
    if Ellipsis in key:
        e = key.index(Ellipsis)
        key = key[:e] + (slice(None),) * (len(dims) - len(key) + 1) + key[e + 1:]
    var_list, dim_list, formulas, offsets, extra = [], [], [], [], []
    inner = 0
    for idx in range(len(key)):
        numer, step, offset, more = _parse(dims, key, idx)
        extra += more
        if step is None:
            if offset >= 0:
                formulas.append(f"{offset}")
            else:
                offsets.append(f"Offset{idx} = N{idx}+{offset};")
                formulas.append(f"Offset{idx}")
            continue
        var_list.append(f"i{inner}")
        if step > 0:
            dim_list.append(f"({numer} + {step} - 1)/{step}")
        else:
            dim_list.append(f"({numer} + {step} + 1)/{step}")
        if isinstance(numer, str):
            offsets.append(f"Offset{idx} = {offset};")
            formulas.append(f"{step}*i{inner}+Offset{idx}")
        else:
            formulas.append(f"{step}*i{inner}+{offset}")
        inner += 1
    for idx in range(len(key), len(dims)):
        var_list.append(f"i{inner}")
        dim_list.append(f"N{idx}")
        formulas.append(f"i{inner}")
        inner += 1
    if not var_list:
        body = "O[] = =(I[" + ", ".join(formulas) + "]);"
    else:
        body = f"O[{', '.join(var_list)}: {', '.join(dim_list)}] = =(I[{', '.join(formulas)}]);"
    prefix = "\n                   "
    return f"""
               function (I[{', '.join(f'N{i}' for i in range(len(dims)))}]) -> (O) {{
                   {''.join(v + prefix for v in extra)}{''.join(o + prefix for o in offsets)}{body}
               }}"""


def slices():
    out = []
    S = slice
    for tag, shape, symbolic, key, via in [
        ("rnn_step", (3, 5, 4), [], (S(None), 2), "keras rnn: inputs[:, i]"),
        ("rnn_step_symbolic_batch", (3, 5, 4), [0], (S(None), 1), "keras rnn: inputs[:, i] "
                                                                  "with a symbolic batch size"),
        ("reverse_and_range", (5, 6), [], (S(None, None, -1), S(1, 5, 2)), "x[::-1, 1:5:2]"),
        ("negative_index", (4, 3, 2), [], (-1, Ellipsis, S(0, 1)), "x[-1, ..., 0:1]"),
        ("scalar", (3, 4), [], (1, 2), "x[1, 2]"),
        ("symbolic_negative", (6, 4), [0, 1], (S(-4, -1), S(None, None, -2)),
         "x[-4:-1, ::-2] with symbolic sizes"),
    ]:
        dims = [None if i in symbolic else d for i, d in enumerate(shape)]
        text = sliceof_text(dims, key)
        out.append(Case(f"tile.slice.{tag}", f"{TP}:_SliceOf", text, {"I": _f32(shape)},
                        lambda I, key=key: {"O": np.array(I[key], np.float32)},
                        dict(via=f"tile.Value.__getitem__; {via}", key=repr(key),
                             symbolic_dims=symbolic),
                        "numpy basic-indexing semantics."
                        + (" Symbolic sizes make PlaidML emit Start/Stop/Offset size "
                           "statements with max/min." if symbolic else "")))
    return out


def cases():
    return binary_ops() + shape_of() + slices()
