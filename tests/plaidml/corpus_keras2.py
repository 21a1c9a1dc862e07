"""plaidml/keras/backend.py (0.7.0), second half: one_hot .. random numbers."""

# ruff: noqa: E501  (Tile lines are kept as PlaidML writes them, some over 100 columns)

from __future__ import annotations

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


# ------------------------------------------------------------------ one_hot / ones_like / zeros_like
def fills():
    out = []
    for ishape, classes in [((5,), 4), ((2, 3), 6)]:
        n = len(ishape)
        text = f"""
            function (Idx[{', '.join(f'I{k}' for k in range(n))}], Count[C]) -> (O) {{
                O[{', '.join(f'i{k}' for k in range(n))}, c : {', '.join(f'I{k}' for k in range(n))}, C] = =(Idx[{', '.join(f'i{k}' for k in range(n))}] == Count[c]);
            }}"""
        out.append(_case(f"one_hot.{n}d_c{classes}", "OneHot", text,
                         {"Idx": (ishape, "int32"), "Count": ((classes,), "int32")},
                         lambda Idx, Count: {"O": Idx[..., None] == Count},
                         "An == combination gives a boolean tensor in Tile (PlaidML's type "
                         "rules make every == contraction BOOLEAN), though the op declares floatx "
                         "for its output; the oracle is boolean.  Count is PlaidML's constant "
                         "arange(num_classes).",
                         via="keras one_hot, sparse_categorical_crossentropy", num_classes=classes,
                         gen={"Idx": ("int", 0, classes),
                              "Count": ("fixed", np.arange(classes))}))
    for fn, name, value in [("ones_like", "ONE", 1.0), ("zeros_like", "ZERO", 0.0)]:
        for shape in [(3, 4), (2, 3, 2)]:
            nd = len(shape)
            sizes = ", ".join(f"S{i}" for i in range(nd))
            dims = ", ".join(f"i{i}" for i in range(nd))
            text = f"""
        function (IN[{sizes}], {name}[SZ]) -> (OUT) {{
            OUT[{dims} : {sizes}] = =({name}[0]);
        }}"""
            out.append(_case(f"{fn}.{nd}d", fn, text, {"IN": _f32(shape), name: _f32((1,))},
                             lambda value=value, **a: {"OUT": np.full(a["IN"].shape, value,
                                                                      np.float32)},
                             f"{name} is PlaidML's constant [{value}] (keras constant).",
                             via=f"keras {fn}", gen={name: ("fixed", [value])}))
    return out


# ------------------------------------------------------------------ permute / repeat / reverse / tile
def shape_ops():
    out = []
    for tag, shape, pattern in [("transpose_2d", (3, 5), (1, 0)), ("transpose_3d", (2, 3, 4), (2, 1, 0)),
                                ("permute_021", (2, 3, 4), (0, 2, 1)),
                                ("permute_1302", (2, 3, 4, 2), (1, 3, 0, 2))]:
        nd = len(shape)
        text = f"""function (X[{', '.join(f'X{i}' for i in range(nd))}]) -> (R) {{
               R[{', '.join(f'x{pattern[i]}' for i in range(nd))} : {', '.join(f'X{pattern[i]}' for i in range(nd))}] = =(X[{', '.join(f'x{i}' for i in range(nd))}]);
           }}"""
        out.append(_case(f"permute_dimensions.{tag}", "permute_dimensions", text, {"X": _f32(shape)},
                         lambda X, p=pattern: {"R": np.transpose(X, p)},
                         via="keras permute_dimensions, transpose", pattern=pattern))
    for shape, n in [((3, 4), 2), ((2, 5), 3)]:
        text = f"""
           function (I[N0, N1]) -> (O) {{
               O[i0, r, i1: N0, {n}, N1] = =(I[i0, i1]);
           }}"""
        out.append(_case(f"repeat.n{n}", "repeat", text, {"I": _f32(shape)},
                         lambda I, n=n: {"O": np.repeat(I[:, None, :], n, axis=1)},
                         via="keras repeat (RepeatVector)", n=n))
    for shape, rep, axis in [((2, 3, 4), 3, 1), ((3, 4), 2, 0), ((2, 2, 3, 2), 2, 3)]:
        nd = len(shape)
        text = f"""
        function (I[{', '.join(f'N{i}' for i in range(nd))}]) -> (O) {{
            O[{', '.join(f'{rep}*n{i} + k' if i == axis else f'n{i}' for i in range(nd))} : {', '.join(f'{rep}*N{i}' if i == axis else f'N{i}' for i in range(nd))}] = =(I[{', '.join(f'n{i}' for i in range(nd))}]), k < {rep} no_defract;
        }}"""
        out.append(_case(f"repeat_elements.{nd}d_r{rep}_ax{axis}", "repeat_elements", text,
                         {"I": _f32(shape)},
                         lambda I, rep=rep, axis=axis: {"O": np.repeat(I, rep, axis=axis)},
                         via="keras repeat_elements, resize_images(nearest), resize_volumes",
                         rep=rep, axis=axis))
    for shape, axes in [((3, 4), [0]), ((2, 3, 4), [0, 2]), ((2, 3, 4), [-1])]:
        nd = len(shape)
        ax = [a % nd for a in axes]
        dims = ", ".join(f"N{j}" for j in range(nd))
        oidx = ", ".join((f"N{j} - 1 - i{j}" if j in ax else f"i{j}") for j in range(nd))
        text = f"""
        function (I[{dims}]) -> (O) {{
            O[{oidx}: {dims}] = =(I[{', '.join(f'i{j}' for j in range(nd))}]);
        }}"""
        out.append(_case(f"reverse.{nd}d_ax{'_'.join(map(str, axes))}", "reverse", text,
                         {"I": _f32(shape)}, lambda I, ax=tuple(ax): {"O": np.flip(I, ax)},
                         via="keras reverse", axes=axes))
    for shape, n in [((2, 3), (2, 3)), ((3, 2, 2), (1, 2, 3))]:
        nd = len(shape)
        text = f"""
        function (I[{', '.join(f'S{i}' for i in range(nd))}]) -> (O) {{
            O[{', '.join(f't{i} * S{i} + i{i}' for i in range(nd))} : {', '.join(f'S{i} * {n[i]}' for i in range(nd))}] = =(I[{', '.join(f'i{i}' for i in range(nd))}]), {', '.join(f't{i} < {n[i]}' for i in range(nd))} no_defract;
        }}"""
        out.append(_case(f"tile.{nd}d_{'x'.join(map(str, n))}", "tile", text, {"I": _f32(shape)},
                         lambda I, n=n: {"O": np.tile(I, n)}, via="keras tile", n=n))
    return out


# ------------------------------------------------------------------ resize_images (bilinear)
def resize_bilinear():
    out = []
    for tag, shape, hf, wf, df in [("nchw_2x3", (1, 2, 3, 4), 2, 3, "channels_first"),
                                   ("nhwc_3x2", (2, 3, 3, 2), 3, 2, "channels_last")]:
        if df == "channels_first":
            idims, odims = "N, C, H, W", "N, C, HFactor*H, WFactor*W"
            iidxs = "n, c, h, w"
            oidxs = "n, c, HFactor*h + j - HFactor + 1, WFactor*w + i - WFactor + 1"
            hax, wax = 2, 3
        else:
            idims, odims = "N, H, W, C", "N, HFactor*H, WFactor*W, C"
            iidxs = "n, h, w, c"
            oidxs = "n, HFactor*h + j - HFactor + 1, WFactor*w + i - WFactor + 1, c"
            hax, wax = 1, 2
        text = f"""
        function (I[{idims}], HBase[HFactor], WBase[WFactor]) -> (O) {{
            HK[y : 2*HFactor - 1] = +(HBase[y + j - HFactor + 1]), j < HFactor;
            WK[x : 2*WFactor - 1] = +(WBase[x + i - WFactor + 1]), i < WFactor;
            K[y, x: 2*HFactor - 1, 2*WFactor - 1] = =(HK[y] * WK[x]);
            O[{oidxs} : {odims}] = +(I[{iidxs}] * K[j, i]);
        }}
        """

        def oracle(I, HBase, WBase, hf=hf, wf=wf, hax=hax, wax=wax):
            y = ora.linear_upsample_axis(I, hax, hf)
            return {"O": ora.f32(ora.linear_upsample_axis(y, wax, wf))}

        out.append(_case(f"resize_images.bilinear_{tag}", "resize_images", text,
                         {"I": _f32(shape), "HBase": _f32((hf,)), "WBase": _f32((wf,))}, oracle,
                         "Bilinear upsampling with input sample h at output row factor*h and "
                         "linear fall-off to zero past the last sample (as the code's comment "
                         "says: corners aligned at 0, zero padding beyond the edge).  HBase, "
                         "WBase are PlaidML's constants 1/factor.",
                         via="keras resize_images(interpolation='bilinear')", height_factor=hf,
                         width_factor=wf, data_format=df,
                         gen={"HBase": ("fixed", 1.0 / hf), "WBase": ("fixed", 1.0 / wf)}))
    return out


# ------------------------------------------------------------------ rnn's time_expand
def time_expand():
    out = []
    for shape, t, ii in [((3, 4), 5, 0), ((2, 3), 4, 2), ((2, 3, 2), 3, 1)]:
        ndmo = len(shape) - 1
        sizes = ", ".join(f"N{i}" for i in range(ndmo))
        idxs = ", ".join(f"i{i}" for i in range(ndmo))
        oshape = (shape[0], t) + shape[1:]
        if ii == 0:
            text = (f"function (I[B, {sizes}]) -> (O) {{ O[b, 0, {idxs} : B, {t}, {sizes}] = "
                    f"=(I[b, {idxs}]); }}")
            inputs = {"I": _f32(shape)}

            def oracle(I, oshape=oshape):
                o = np.zeros(oshape, np.float32)
                o[:, 0] = I
                return {"O": o}
        else:
            text = (f"function (I[B, {sizes}], P) -> (O) {{ O[b, {ii}, {idxs} : B, {t}, {sizes}] = "
                    f"=(I[b, {idxs}]) default P; }}")
            inputs = {"I": _f32(shape), "P": _f32(oshape)}

            def oracle(I, P, ii=ii):
                o = P.copy()
                o[:, ii] = I
                return {"O": o}
        out.append(_case(f"rnn_time_expand.t{t}_step{ii}_{len(shape)}d", "rnn.time_expand", text,
                         inputs, oracle, "Step 0 writes into zeros; later steps default to the "
                         "previous step's output P.", via="keras rnn", step=ii, steps=t))
    return out


# ------------------------------------------------------------------ SpatialPadding
def spatial_padding():
    out = []
    for tag, shape, padding, df, via in [
        ("2d_nhwc", (2, 3, 4, 2), ((1, 1), (2, 0)), "channels_last", "keras spatial_2d_padding"),
        ("2d_nchw", (1, 2, 3, 3), ((0, 2), (1, 1)), "channels_first", "keras spatial_2d_padding"),
        ("3d_ndhwc", (1, 2, 3, 2, 2), ((1, 0), (0, 1), (1, 1)), "channels_last",
         "keras spatial_3d_padding"),
        ("temporal", (2, 5, 3), ((2, 1),), "channels_last", "keras temporal_padding, "
                                                             "conv1d(padding='causal')"),
    ]:
        rank = len(shape) - 2
        isd = [f"D{i}" for i in range(rank)]
        osd = [f"D{i} + {padding[i][0] + padding[i][1]}" for i in range(rank)]
        isi = [f"d{i} - {padding[i][0]}" for i in range(rank)]
        osi = [f"d{i}" for i in range(rank)]
        j = ", ".join
        if df == "channels_last":
            ind, outd = f"N, {j(isd)}, C", f"N, {j(osd)}, C"
            ini, outi = f"n, {j(isi)}, c", f"n, {j(osi)}, c"
            full = [(0, 0)] + list(padding) + [(0, 0)]
        else:
            ind, outd = f"N, C, {j(isd)}", f"N, C, {j(osd)}"
            ini, outi = f"n, c, {j(isi)}", f"n, c, {j(osi)}"
            full = [(0, 0), (0, 0)] + list(padding)
        text = f"""
            function (I[{ind}]) -> (O) {{
                O[{outi} : {outd}] = =(I[{ini}]);
            }}
        """
        out.append(_case(f"spatial_padding.{tag}", "SpatialPadding", text, {"I": _f32(shape)},
                         lambda I, full=full: {"O": np.pad(I, full)}, via=via,
                         padding=padding, data_format=df))
    return out


# ------------------------------------------------------------------ random numbers (PRNG)
def _rng_state_gen():
    return ("int", 16, 2 ** 32 - 1)


def random_cases():
    out = []
    for shape in [(4, 5), (3, 2, 6)]:
        args = ", ".join(["I"] + [str(s) for s in shape])
        step = f"function (I) -> (O) {{ O = prng_step({args}); }}"
        text = f"""function (I) -> (O, N) {{
    T = prng_step({args});
    N = prng_state(T);
    O = prng_value(T);
}}"""

        def check(run, I, shape=shape):
            a = run({"I": I})
            o, n = np.asarray(a["O"]), np.asarray(a["N"])
            assert o.shape == shape and o.dtype == np.float32, (o.shape, o.dtype)
            assert np.all(o >= 0) and np.all(o < 1), "values outside [0, 1)"
            assert np.unique(o).size > o.size // 2, "values barely vary"
            assert n.shape == (3, 2048) and n.dtype == np.uint32, (n.shape, n.dtype)
            assert not np.array_equal(n, I), "the state did not advance"
            b = run({"I": I})
            np.testing.assert_array_equal(b["O"], o, err_msg="not deterministic")
            c = run({"I": n})
            assert not np.array_equal(np.asarray(c["O"]), o), "same values from the next state"

        out.append(_case(f"random_uniform.{len(shape)}d", "random_uniform", text,
                         {"I": ((3, 2048), "uint32")}, check,
                         "PlaidML builds three programs (PrngStep " + repr(step) + ", PrngState "
                         "'function (I) -> (O) { O = prng_state(I); }', PrngValue 'function (I) "
                         "-> (O) { O = prng_value(I); }') that its composer joins; prng_step's "
                         "result has the opaque PRNG type, so they cannot run apart.  The program "
                         "here is that composition written out (the statements are PlaidML's, "
                         "the joining is ours).  N is the new state (PlaidML's side effect). "
                         "min/max 0/1 make the final scaling a no-op.",
                         via="keras random_uniform, random_normal", shape=shape,
                         expect="properties", gen={"I": _rng_state_gen()}))
    for tag, shape, level, noise in [("2d", (10, 20), 0.5, None), ("3d_noise_shape", (4, 5, 6),
                                                                    0.3, (4, 1, 6))]:
        szs = ", ".join(f"S{i}" for i in range(len(shape)))
        if noise is None:
            args = "I, " + szs
        else:
            args = ", ".join(["I"] + [f"S{i}" if v == shape[i] or v in (None, -1) else "1"
                                      for i, v in enumerate(noise)])
        text = f"""function (I, X[{szs}], L) -> (O, N) {{
    T = prng_step({args});
    N = prng_state(T);
    R = 1.0 - L;
    M = 1.0 / R;
    O = (prng_value(T) < R ? X * M : 0.0);
}}"""

        def check(run, I, X, L, shape=shape, noise=noise):
            a = run({"I": I, "X": X, "L": L})
            o, n = np.asarray(a["O"]), np.asarray(a["N"])
            assert o.shape == shape and o.dtype == np.float32, (o.shape, o.dtype)
            kept = o != 0
            np.testing.assert_allclose(o[kept], (X / (1 - L))[kept], rtol=1e-5)
            frac = 1 - kept.mean()
            assert abs(frac - float(L)) < 0.2, f"dropped {frac:.2f}, expected about {float(L)}"
            if noise is not None:  # the mask is shared along the size-1 noise axes
                assert np.all(kept == kept[:, :1, :]), "mask varies along a noise_shape 1 axis"
            assert n.shape == (3, 2048) and n.dtype == np.uint32
            b = run({"I": I, "X": X, "L": L})
            np.testing.assert_array_equal(b["O"], o, err_msg="not deterministic")

        out.append(_case(f"dropout.{tag}", "dropout", text,
                         {"I": ((3, 2048), "uint32"), "X": _f32(shape), "L": _f32(())}, check,
                         "As for random_uniform: PlaidML's PrngStep "
                         f"'function (I, X[{szs}]) -> (O) {{ O = prng_step({args}); }}', "
                         "PrngState and PrngValue programs joined into one function (their "
                         "statements verbatim, the joining ours).  With a noise_shape the "
                         "prng_step sizes include 1s, and the (broadcast) mask is shared along "
                         "those axes.",
                         via="keras dropout", level=level, noise_shape=noise, expect="properties",
                         gen={"I": _rng_state_gen(), "L": ("fixed", level),
                              "X": ("signed", 0.5, 1.0)}))
    return out


def cases():
    return (fills() + shape_ops() + resize_bilinear() + time_expand() + spatial_padding()
            + random_cases())
