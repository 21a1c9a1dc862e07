"""ONNX's RNN, GRU and LSTM: small models on random non-zero inputs with odd sizes, every
direction, both layouts, optional inputs present or absent, sequences ending early, the
attributes (activations with their parameters, clip, input_forget, linear_before_reset), any
subset of the outputs; run with the outputs poisoned and compared with onnxruntime (which has
no layout 1: its model gets the inputs transposed, and its outputs are transposed back); the
refusals name the node and the attribute.  ONNX's own node cases run in test_onnx.py
(`CASE_MODULES`)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

import tilec.onnx.importer as tonnx  # noqa: E402
from tilec.errors import TileError  # noqa: E402

from ..device import needs_device  # noqa: E402

device = needs_device
RNG = np.random.default_rng(61)

# ONNX's node-case modules of these ops; test_onnx.py imports them before collecting its node
# cases.  Every one of their cases passes.
CASE_MODULES = ("rnn", "gru", "lstm")
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
STATES = ("X", "initial_h", "initial_c")


def rand(*shape, scale=1.0):
    v = RNG.uniform(0.25, 1.0, shape) * RNG.choice([-1, 1], shape) * scale
    return v.astype(np.float32)


def feeds(op, t, b, i, h, nd, layout=0, lens=None, skip=()):
    """The node's operands by ONNX name (layout 0 shapes; `layout` transposes the states)."""
    g = GATES[op]
    arrays = {"X": rand(t, b, i), "W": rand(nd, g * h, i, scale=0.6),
              "R": rand(nd, g * h, h, scale=0.6), "B": rand(nd, 2 * g * h, scale=0.5),
              "initial_h": rand(nd, b, h)}
    if lens is not None:
        arrays["sequence_lens"] = np.asarray(lens, np.int32)
    if op == "LSTM":
        arrays["initial_c"] = rand(nd, b, h)
        arrays["P"] = rand(nd, 3 * h, scale=0.5)
    arrays = {k: v for k, v in arrays.items() if k not in skip}
    if layout:
        arrays = {k: np.swapaxes(v, 0, 1).copy() if k in STATES else v
                  for k, v in arrays.items()}
    return arrays


ORDER = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")


def layer_model(op, arrays, outputs=("Y", "Y_h", "Y_c"), opset=14, **attrs):
    names = [n if n in arrays else "" for n in ORDER[:8 if op == "LSTM" else 6]]
    while names[-1] == "":
        names.pop()
    outs = [o if o in outputs else "" for o in ("Y", "Y_h", "Y_c")[:3 if op == "LSTM" else 2]]
    while outs[-1] == "":
        outs.pop()
    node = helper.make_node(op, names, outs, name="L", **attrs)
    ins = [helper.make_tensor_value_info(
        n, TensorProto.INT32 if n == "sequence_lens" else TensorProto.FLOAT, arrays[n].shape)
        for n in names if n]
    graph = helper.make_graph([node], "m", ins, [helper.make_tensor_value_info(o, 1, None)
                                                for o in outs if o])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


def check(op, arrays, outputs=("Y", "Y_h", "Y_c"), **attrs):
    """tilec (outputs poisoned) against onnxruntime, run with layout 0."""
    ort = pytest.importorskip("onnxruntime")
    layout = attrs.get("layout", 0)
    exe = tonnx.load(layer_model(op, arrays, outputs, **attrs))
    got = exe.run(arrays, poison=True)
    plain = {k: np.swapaxes(v, 0, 1).copy() if layout and k in STATES else v
             for k, v in arrays.items()}
    ref_attrs = {k: v for k, v in attrs.items() if k != "layout"}
    ref_attrs["hidden_size"] = arrays["R"].shape[-1]  # onnxruntime requires it
    ref = layer_model(op, plain, outputs, **ref_attrs)
    sess = ort.InferenceSession(ref.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in ref.graph.output], sess.run(None, plain), strict=True))
    assert set(got) == set(want)
    for name, w in want.items():
        if layout:
            w = np.transpose(w, (2, 0, 1, 3)) if w.ndim == 4 else np.swapaxes(w, 0, 1)
        assert got[name].shape == w.shape and got[name].dtype == w.dtype, name
        np.testing.assert_allclose(got[name], w, rtol=2e-4, atol=2e-5, err_msg=name)
    return exe


@device
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_layer(op, direction, layout):
    nd = 2 if direction == "bidirectional" else 1
    arrays = feeds(op, 5, 3, 7, 5, nd, layout)
    check(op, arrays, hidden_size=5, direction=direction, layout=layout)


@device
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("outputs", [("Y",), ("Y_h",), ("Y", "Y_c"), ("Y_c",)])
def test_outputs_and_absent_inputs(op, outputs):
    """Any subset of the outputs; no bias, initial states or peepholes; hidden_size left to
    R's shape."""
    outputs = tuple(o for o in outputs if op == "LSTM" or o != "Y_c") or ("Y_h",)
    arrays = feeds(op, 4, 2, 3, 9, 1, skip=("B", "initial_h", "initial_c", "P"))
    check(op, arrays, outputs)


@device
@pytest.mark.parametrize("op, attrs", [
    ("GRU", {"linear_before_reset": 1}),
    ("GRU", {"linear_before_reset": 1, "direction": "bidirectional"}),
    ("LSTM", {"input_forget": 1}),
    ("LSTM", {"clip": 0.35}),
    ("GRU", {"clip": 0.35}),
    ("RNN", {"clip": 0.35, "activations": ["Relu"]}),
    ("LSTM", {"activations": ["HardSigmoid", "LeakyRelu", "Affine"],
              "activation_alpha": [0.3, 0.05, 0.7], "activation_beta": [0.4, 0.1]}),
    ("GRU", {"activations": ["Sigmoid", "ScaledTanh", "HardSigmoid", "Elu"],
             "activation_alpha": [1.3, 0.25, 0.8], "activation_beta": [0.7, 0.55],
             "direction": "bidirectional"}),
    ("RNN", {"activations": ["Softsign"]}),
    ("RNN", {"activations": ["ThresholdedRelu"], "activation_alpha": [0.2]}),
    ("RNN", {"activations": ["Softplus"]}),
    ("LSTM", {"activations": ["Sigmoid", "Tanh", "Tanh", "HardSigmoid", "Softsign", "Relu"],
              "direction": "bidirectional"}),
])
def test_attributes(op, attrs):
    nd = 2 if attrs.get("direction") == "bidirectional" else 1
    check(op, feeds(op, 4, 3, 5, 6, nd), **attrs)


@device
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_sequence_lens(op, direction):
    """Sequences ending early, one of them empty, given at run time."""
    nd = 2 if direction == "bidirectional" else 1
    check(op, feeds(op, 5, 4, 3, 6, nd, lens=[5, 3, 0, 1]), direction=direction)


@device
def test_sequence_lens_constant_and_full():
    """Full-length constant sequence_lens change nothing (no masks)."""
    arrays = feeds("LSTM", 3, 2, 4, 5, 1)
    m = layer_model("LSTM", {**arrays, "sequence_lens": np.array([3, 3], np.int32)})
    m.graph.input.pop(4)  # sequence_lens becomes an initializer
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.array([3, 3], np.int32),
                                                            "sequence_lens"))
    plain = tonnx.load(layer_model("LSTM", arrays))
    exe = tonnx.load(m)
    got, want = exe.run(arrays, poison=True), plain.run(arrays)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)
    assert "where" not in exe.tile


@pytest.mark.parametrize("op, attrs, pattern", [
    ("LSTM", {"activations": ["Sigmoid", "Gelu", "Tanh"]},
     r"attribute activations=\['Sigmoid', 'Gelu', 'Tanh'\]: .*'Gelu' is not supported"),
    ("GRU", {"activations": ["Sigmoid"]}, r"attribute activations=\['Sigmoid'\]: .*expected 2"),
    ("RNN", {"activations": ["Tanh"], "activation_alpha": [0.5]},
     "attribute activations=.*more values than the activations take"),
    ("LSTM", {"activations": ["Sigmoid", "Tanh", "Tanh"], "direction": "bidirectional"},
     "attribute activations=.*3 names; expected 3 per direction \\(6\\)"),
    ("RNN", {"direction": "both"}, "attribute direction='both' is not supported"),
    ("RNN", {"layout": 2}, "attribute layout=2 is not supported"),
    ("GRU", {"hidden_size": 7}, r"attribute hidden_size=7 differs from R's shape \[1, 18, 6\]"),
    ("LSTM", {"clip": -1.0}, "attribute clip=-1.0 must be positive"),
    ("RNN", {"output_sequence": 1}, r"attribute output_sequence \(opset 1\) is not supported"),
])
def test_refusals(op, attrs, pattern):
    with pytest.raises(TileError, match=rf"ONNX node 'L' \({op}\): " + pattern):
        tonnx.to_graph(layer_model(op, feeds(op, 3, 2, 4, 6, 1), **attrs))


def test_refusals_by_opset_and_type():
    arrays = feeds("GRU", 3, 2, 4, 6, 1)
    with pytest.raises(TileError, match="layout exists from opset 14 on"):
        tonnx.to_graph(layer_model("GRU", arrays, opset=13, layout=1))
    with pytest.raises(TileError, match="opset 6 is not supported"):
        tonnx.to_graph(layer_model("GRU", arrays, opset=6))
    bad = feeds("LSTM", 3, 2, 4, 6, 1)
    bad["P"] = rand(1, 5)
    with pytest.raises(TileError, match=r"ONNX node 'L' \(LSTM\): lstm: P is \[1, 5\]"):
        tonnx.to_graph(layer_model("LSTM", bad))
