"""Compare the corpus's Tile text with the text PlaidML 0.7.0's own Python code generates for
the same parameters (not part of the test suite).

Calls plaidml/op.py, plaidml/tile.py (from the plaidml==0.7.0 wheel), plaidml/keras/backend.py
and onnx_plaidml/opset_onnx.py (source files, loaded with stub `keras` / `onnx` modules since
only their text-building code runs) and compares each generated program with the case's, with
all whitespace removed.  Needs the environment of plaidml_crosscheck.py and the two files:

    git -C <plaidml mirror> show 0.7.0:plaidml/keras/backend.py > /tmp/backend.py
    git -C <onnx-plaidml mirror> show HEAD:onnx_plaidml/opset_onnx.py > /tmp/opset_onnx.py
    /tmp/pmlvenv/bin/python -m tests.plaidml.plaidml_textcheck \\
        --backend /tmp/backend.py --onnx /tmp/opset_onnx.py
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
import types

os.environ.setdefault("PLAIDML_EXPERIMENTAL", "1")
os.environ.setdefault("PLAIDML_DEVICE_IDS", "llvm_cpu.0")


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _stub(name, **attrs):
    mod = types.ModuleType(name)
    mod.__path__ = []
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def load_backend(path):
    state = {"floatx": "float32", "fmt": "channels_last"}
    common = _stub("keras.backend.common", cast_to_floatx=lambda x: x, epsilon=lambda: 1e-7,
                   floatx=lambda: state["floatx"], image_data_format=lambda: state["fmt"],
                   set_floatx=lambda v: None, set_image_data_format=lambda v: None,
                   normalize_data_format=lambda v: v)
    _stub("keras", backend=_stub("keras.backend", common=common))
    if "scipy" not in sys.modules:
        _stub("scipy", stats=_stub("scipy.stats"))
    _stub("plaidml.keras")
    return _load("plaidml.keras.backend", path)


def load_onnx(path):
    ident = lambda *a, **k: (lambda f: f)  # noqa: E731
    _stub("onnx", onnx_pb=_stub("onnx.onnx_pb", TensorProto=types.SimpleNamespace()))
    util = _stub("onnx_plaidml.opset_util", opset=ident, opset_op=ident,
                 ONNX_DTYPE_TO_PLAIDML={})
    _stub("onnx_plaidml", opset_util=util)
    return _load("onnx_plaidml.opset_onnx", path)


def norm(text):
    return re.sub(r"\s+", "", text)


class Generator:
    def __init__(self, K, onnx):
        import plaidml
        import plaidml.op as op
        import plaidml.tile as tile

        self.plaidml, self.op, self.tile, self.K, self.onnx = plaidml, op, tile, K, onnx
        D = plaidml.DType
        self.dt = {"float32": D.FLOAT32, "int32": D.INT32, "uint32": D.UINT32,
                   "bool": D.BOOLEAN, "int16": D.INT16, "uint8": D.UINT8}

    def value(self, case, name, symbolic=()):
        shape, dtype = case.inputs[name]
        dims = tuple(None if i in symbolic else d for i, d in enumerate(shape))
        return self.tile.Value.from_dimensions(dims, self.dt[dtype])

    def text(self, case):
        file, fn = case.origin.split(":", 1)
        p = case.params
        v = lambda n, sym=(): self.value(case, n, sym)  # noqa: E731
        code = lambda val: val.source.op.code  # noqa: E731
        if file == "plaidml/op.py":
            return self.op_text(case, fn, p, v, code)
        if file == "plaidml/tile.py":
            return self.tile_text(case, fn, p, v, code)
        if file == "plaidml/keras/backend.py":
            return self.keras_text(case, fn, p, v, code)
        return self.onnx_text(case, fn, p, v)

    def op_text(self, case, fn, p, v, code):
        op = self.op
        simple = {"Flatten": "I", "Identity": "X", "Hardmax": "I", "Softmax": "I",
                  "LogSoftmax": "I", "Sqrt": "I"}
        if fn in simple:
            return getattr(op, fn)(v(simple[fn])).code
        if fn in ("ceiling", "cos", "exp", "floor", "log", "sigmoid", "sin", "tanh"):
            return code(getattr(op, fn)(v("I")))
        if fn in ("All", "Any"):
            return getattr(op, fn)(v("I"), axis=p["axis"], keepdims=p["keepdims"]).code
        if fn == "ArgMax":
            return op.ArgMax(v("I"), p["axis"]).code
        if fn == "BinaryCrossentropy":
            return op.BinaryCrossentropy(v("T"), v("O"), 0.0).code
        if fn == "Cast":
            return op.Cast(v("I"), self.dt[p["dtype"]]).code
        if fn in ("ClipMin", "ClipMax"):
            return getattr(op, fn)(v("I"), p["bound"]).code
        if fn == "Concatenate":
            sym = (0,) if p["symbolic_axis"] else ()
            return op.Concatenate([v(n, sym) for n in case.inputs], p["axis"]).code
        if fn in ("CumulativeSum", "CumulativeProd"):
            return getattr(op, fn)(v("I"), p["axis"]).code
        if fn in ("Dot", "MatMul"):
            a, b = list(case.inputs)
            return getattr(op, fn)(v(a), v(b)).code
        if fn == "Elu":
            return op.Elu(v("X"), p["alpha"]).code
        if fn in ("Equal", "NotEqual"):
            return getattr(op, fn)(v("L"), p["rhs"] if p["rhs"] is not None else v("R")).code
        if fn == "Gather":
            return op.Gather(v("V"), v("I")).code
        if fn == "Gemm":
            return op.Gemm(v("A"), v("B"), v("C"), p["alpha"], p["beta"], True, p["transA"],
                           p["transB"]).code
        if fn == "IsMax":
            return op.IsMax(v("I"), p["axes"]).code
        if fn in ("MaxReduce", "MinReduce", "Summation", "Prod", "Mean", "Variance"):
            return getattr(op, fn)(v("I"), p["axes"], p["keepdims"]).code
        if fn == "Pow":
            P = 2.5 if case.inputs["P"][0] == () else v("P")
            return op.Pow(v("I"), P).code
        if fn == "Relu":
            return op.Relu(v("X"), p["alpha"], p["max_value"], p["threshold"]).code
        if fn == "Reshape":
            if "D0" in case.inputs:
                x = v("I", (0,))
                return op.Reshape(x, (x.shape.dims[0],) + tuple(p["dims"][1:])).code
            return op.Reshape(v("I"), p["dims"]).code
        if fn == "SliceTensor":
            sym = range(9) if p["symbolic_dims"] else ()
            return op.SliceTensor(v("I", sym), p["axes"], p["ends"], p["starts"]).code
        if fn == "ImagePatches":
            return op.ImagePatches(v("I"), p["ksizes"], p["strides"], p["rates"],
                                   p["padding"]).code
        if fn == "ReflectionPadding":
            return op.ReflectionPadding(v("I", (0,) if p["symbolic_dims"] else ()),
                                        p["paddings"]).code
        if fn.startswith("Convolution"):
            return self.conv_text(case, fn, p, v)
        if fn == "Pool":
            pad = {"valid": op.AutoPadding.VALID, "same_upper": op.AutoPadding.SAME_UPPER,
                   "same_lower": op.AutoPadding.SAME_LOWER, "explicit": op.AutoPadding.EXPLICIT}
            df = op.PoolDataFormat.NCX if p["data_format"] == "channels_first" \
                else op.PoolDataFormat.NXC
            mode = op.PoolMode.MAX if p["mode"] == "max" else op.PoolMode.AVG
            return op.Pool(v("I"), mode, p["kernel"], p["strides"], p["pads"],
                           pad[p["padding"]], df).code
        raise KeyError(fn)

    def conv_text(self, case, fn, p, v):
        op = self.op
        pad = {"valid": op.AutoPadding.VALID, "same_upper": op.AutoPadding.SAME_UPPER,
               "same_lower": op.AutoPadding.SAME_LOWER, "explicit": op.AutoPadding.EXPLICIT,
               "same": op.AutoPadding.SAME_UPPER}
        dfmt = {"channels_first": op.ConvolutionDataFormat.CHANNELS_FIRST,
                "channels_last": op.ConvolutionDataFormat.CHANNELS_LAST}
        kfmt = {"channels_first": op.ConvolutionKernelFormat.CHANNELS_FIRST,
                "channels_last": op.ConvolutionKernelFormat.CHANNELS_LAST}
        if fn == "ConvolutionTranspose":
            return op.ConvolutionTranspose(v("O"), v("K"), p["output_shape"], p["strides"],
                                           pad[p["padding"]], dfmt[p["data_format"]],
                                           kfmt["channels_last"]).code
        if fn.endswith("_winograd_code_template"):
            if "fixed" in case.name:
                return None  # deliberately not PlaidML's text
            return op.Convolution(v("I"), v("K"), strides=(1, 1), padding=pad[p["padding"]],
                                  data_format=dfmt["channels_last"],
                                  kernel_format=kfmt["channels_last"], dilation_rate=(1, 1),
                                  winograd_allowed=True).code
        if p["group_format"] == "GGOGI":
            return None  # op.Convolution's rank check refuses a (G, GCO, GCI, *K) kernel
        grouping = {"none": op.ConvolutionGrouping.NONE, "max": op.ConvolutionGrouping.MAX,
                    "explicit": op.ConvolutionGrouping.EXPLICIT}[p["grouping"]]
        gfmt = {"FOGI": op.GroupedChannelFormat.FullOutGroupIn,
                "GGO": op.GroupedChannelFormat.GroupGroupOut,
                "GGOGI": op.GroupedChannelFormat.GroupGroupOutGroupIn,
                None: None}[p["group_format"]]
        return op.Convolution(v("I"), v("K"), strides=tuple(p["strides"]),
                              padding=pad[p["padding"]], pads=p["pads"],
                              group=p["groups"] or 1, data_format=dfmt[p["data_format"]],
                              kernel_format=kfmt[p["kernel_format"]],
                              dilation_rate=tuple(p["dilations"]), grouping=grouping,
                              group_format=gfmt, winograd_allowed=False).code

    def tile_text(self, case, fn, p, v, code):
        tile = self.tile
        if fn == "ShapeOf":
            return code(self.op.shape_of(v("I")))
        if fn == "Value._dim":
            idx = int(case.name.rsplit("_d", 1)[1])
            x = v("I", range(9))
            return code(x.shape.dims[idx])
        if fn == "broadcast_dims":
            a = tile.Value.from_dimensions((None,), self.plaidml.DType.FLOAT32).shape.dims[0]
            if "I1" in case.inputs:
                b = tile.Value.from_dimensions((None,), self.plaidml.DType.FLOAT32).shape.dims[0]
                return code(tile.broadcast_dims((a,), (b,))[0])
            return code(tile.broadcast_dims((a,), (3,))[0])
        if fn == "_SliceOf":
            key = eval(p["key"], {"Ellipsis": Ellipsis, "slice": slice})  # our own repr()
            return code(v("I", p["symbolic_dims"])[key])
        if fn == "__neg__":
            return code(-v("I"))
        L = v("L")
        R = 1.5 if case.inputs["R"][0] == () else v("R")
        if fn in ("maximum", "minimum"):
            return code(getattr(tile, fn)(L, R))
        return code(getattr(L, fn)(R))

    def keras_text(self, case, fn, p, v, code):
        K = self.K
        if fn == "BatchDot":
            if "tf_" in case.name:
                os.environ["PLAIDML_BATCHDOT_TF_BEHAVIOR"] = "1"
            try:
                return K.BatchDot(v("X"), v("Y"), axes=p["axes"]).code
            finally:
                os.environ.pop("PLAIDML_BATCHDOT_TF_BEHAVIOR", None)
        if fn == "BatchFlatten":
            return K.BatchFlatten(v("I")).code
        if fn == "CategoricalCrossentropy":
            return K.CategoricalCrossentropy(v("T"), v("O")).code
        if fn == "ExpandDims":
            return K.ExpandDims(v("IN"), p["axis"]).code
        if fn in ("hard_sigmoid", "round", "sign", "abs"):
            return code(getattr(K, fn)(v(list(case.inputs)[0])))
        if fn == "reverse_gradient":
            return code(K.reverse_gradient(v("L"), p["coeff"]))
        if fn == "Switch":
            return K.Switch(v("C"), v("T"), v("E")).code
        if fn == "OneHot":
            return K.OneHot(v("Idx"), p["num_classes"]).code
        if fn in ("ones_like", "zeros_like"):
            return code(getattr(K, fn)(v("IN")))
        if fn == "permute_dimensions":
            return code(K.permute_dimensions(v("X"), p["pattern"]))
        if fn == "repeat":
            return code(K.repeat(v("I"), p["n"]))
        if fn == "repeat_elements":
            return code(K.repeat_elements(v("I"), p["rep"], p["axis"]))
        if fn == "reverse":
            return code(K.reverse(v("I"), p["axes"]))
        if fn == "tile":
            return code(K.tile(v("I"), p["n"]))
        if fn == "resize_images":
            return code(K.resize_images(v("I"), p["height_factor"], p["width_factor"],
                                        p["data_format"], interpolation="bilinear"))
        if fn == "SpatialPadding":
            return K.SpatialPadding(v("I"), p["padding"], p["data_format"]).code
        if fn == "rnn.time_expand":
            shape = case.inputs["I"][0]
            seq = self.tile.Value.from_dimensions((shape[0], p["steps"]) + tuple(shape[1:]),
                                                  self.plaidml.DType.FLOAT32)
            _, out, _ = K.rnn(lambda x, states: (x, states), seq, [])
            o = out.source.op
            for _ in range(p["steps"] - 1 - p["step"]):
                o = o.inputs["P"].source.op
            return o.code
        if fn in ("random_uniform", "dropout"):
            return None  # our composition of three PlaidML programs
        raise KeyError(fn)

    def onnx_text(self, case, fn, p, v):
        ox = self.onnx
        if fn == "Convolution":
            return ox.Convolution(v("I"), v("K"), auto_pad=p["auto_pad"],
                                  dilations=p["dilations"], group=p["group"],
                                  pads=p["pads"], strides=p["strides"]).code
        if fn == "LocalChannelSum":
            return ox.LocalChannelSum(v("I"), p["size"]).code
        if fn == "Mean":
            return ox.Mean([v(n) for n in case.inputs]).code
        if fn == "Not":
            return ox.Not(v("I")).code
        if fn == "Flatten":
            return ox.Flatten(v("I"), p["axis"]).code
        if fn == "PadConstant":
            return ox.PadConstant(v("I"), pads=p["pads"], value=p["value"]).code
        if fn == "Selu":
            return ox.Selu(v("X"), p["alpha"], p["gamma"]).code
        if fn == "Sqrt":
            return ox.Sqrt(v("I")).code
        if fn == "ThresholdedRelu":
            return ox.ThresholdedRelu(v("X"), p["alpha"]).code
        if fn == "Transpose":
            return ox.Transpose(v("I"), p["perm"]).code
        raise KeyError(fn)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", required=True, help="plaidml/keras/backend.py at 0.7.0")
    ap.add_argument("--onnx", required=True, help="onnx_plaidml/opset_onnx.py")
    ap.add_argument("-k", default="")
    ap.add_argument("--show", action="store_true", help="print both texts on a mismatch")
    args = ap.parse_args(argv)
    import plaidml

    plaidml.quiet()
    gen = Generator(load_backend(args.backend), load_onnx(args.onnx))
    from .corpus import CASES

    same = differ = skipped = 0
    for case in [c for c in CASES if args.k in c.name]:
        try:
            theirs = gen.text(case)
        except Exception as exc:  # noqa: BLE001
            print(f"{case.name:<45} ERROR generating: {type(exc).__name__}: {exc}")
            differ += 1
            continue
        if theirs is None:
            print(f"{case.name:<45} not compared (see the case's notes)")
            skipped += 1
        elif norm(theirs) == norm(case.program):
            same += 1
        else:
            differ += 1
            print(f"{case.name:<45} DIFFERS")
            if args.show:
                print("  PlaidML:", theirs.strip())
                print("  corpus: ", case.program.strip())
    print(f"\nidentical to PlaidML's text (whitespace aside): {same}; different: {differ}; "
          f"not compared: {skipped}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
