"""The ONNX importer: ONNX's own backend test cases (every node case of the supported ops and
every pytorch-converted / -operator model that uses only them), a small CNN against
onnxruntime, errors, and the `tilec onnx` / `tilec graph` commands.  `-m slow` adds the tally
over ONNX's complete node collection (the numbers in README.md)."""

from __future__ import annotations

import re
import sys
from collections import Counter

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import tilec.onnx.importer as tonnx  # noqa: E402
from tilec.cli.main import main  # noqa: E402
from tilec.errors import TileError  # noqa: E402

from ..device import needs_device  # noqa: E402
from ..onnx_cases import (  # noqa: E402
    UNSUPPORTED,
    Case,
    data_cases,
    is_float32,
    node_cases,
    run_case,
)
from .test_onnx_arith import CASE_MODULES as ARITH_CASE_MODULES  # noqa: E402
from .test_onnx_einsum import CASE_MODULES as EINSUM_CASE_MODULES  # noqa: E402
from .test_onnx_einsum import REFUSED as EINSUM_REFUSED  # noqa: E402
from .test_onnx_elementwise import REFUSED as ELEMENTWISE_REFUSED  # noqa: E402
from .test_onnx_elementwise import import_case_modules  # noqa: E402
from .test_onnx_norms import CASE_MODULES as NORM_CASE_MODULES  # noqa: E402
from .test_onnx_recurrent import CASE_MODULES as RECURRENT_CASE_MODULES  # noqa: E402
from .test_onnx_shape_ops import CASE_MODULES as SHAPE_CASE_MODULES  # noqa: E402
from .test_onnx_shape_ops import REFUSED as SHAPE_REFUSED  # noqa: E402

device = needs_device

import_case_modules()  # the elementwise ops' cases, besides onnx_cases.NODE_MODULES
import_case_modules(NORM_CASE_MODULES)  # and the normalisations'
import_case_modules(SHAPE_CASE_MODULES)  # and the shape and indexing ops'
import_case_modules(EINSUM_CASE_MODULES)  # and Einsum's
import_case_modules(RECURRENT_CASE_MODULES)  # and RNN's, GRU's and LSTM's
import_case_modules(ARITH_CASE_MODULES)  # and Mod's, Trilu's, Floor's and Ceil's


def _arrays(cases: list[Case]) -> list[Case]:
    """Cases whose data sets hold TensorProtos (Cast's) with numpy arrays instead."""
    for c in cases:
        c.data_sets = [tuple([numpy_helper.to_array(a) if isinstance(a, onnx.TensorProto)
                              else a for a in part] for part in ds) for ds in c.data_sets]
    return cases


NODE = _arrays(node_cases(full=False))
REFUSED = {**UNSUPPORTED, **ELEMENTWISE_REFUSED, **SHAPE_REFUSED, **EINSUM_REFUSED}
DATA = data_cases()
# pytorch-operator's float64 cases hold uninitialised memory (values up to 1e308, denormals)
# that float32 cannot represent; tilec runs float64 models in float32.
FLOAT64_GARBAGE = {"test_operator_add_broadcast", "test_operator_add_size1_right_broadcast",
                   "test_operator_add_size1_singleton_broadcast", "test_operator_addconstant"}


# What the slow tallies print with ONNX 1.23 (other versions ship other cases; README.md's
# numbers predate the normalisation ops and the shape and indexing ops).  Node cases refused: the
# 2 sequence / optional-typed Identity cases, 36 Resize cases (linear, cubic, fractional
# factors), 2 string Equal cases, 4 Pow cases with an integer base, and the shape ops' 169
# (element types without storage: bfloat16, float8, 2- and 4-bit, strings; pads and Range
# limits computed from data at run time; Pad's wrap mode), Einsum's 3 bfloat16 cases, and
# Attention's 21 (bfloat16, and function bodies whose Pad value is computed in the graph); every
# float32 case of the other ops passes.
TALLY_ONNX_1_23 = {
    "node": {"total": 1271, "float32": 744, "passed": 1034, "float32 passed": 708,
             "unsupported": 237},
    "pytorch": {"total": 117, "float32": 109, "passed": 113, "float32 passed": 109,
                "failed": 4},
}
ONNX_1_23 = onnx.__version__.startswith("1.23.")


def test_node_case_counts():
    """Every collected case either passes or is a listed refusal (test_node_case runs them)."""
    assert set(REFUSED) <= {c.name for c in NODE}
    if ONNX_1_23:
        assert len(NODE) == TALLY_ONNX_1_23["node"]["total"]
        assert len(NODE) - len(REFUSED) == TALLY_ONNX_1_23["node"]["passed"]


def _expect(case: Case) -> None:
    if case.name in REFUSED:
        with pytest.raises(TileError, match=re.escape(REFUSED[case.name])):
            run_case(case)
    else:
        run_case(case)


@device
@pytest.mark.parametrize("case", NODE, ids=lambda c: c.name)
def test_node_case(case):
    _expect(case)


@device
@pytest.mark.parametrize("case", [c for c in DATA if c.name not in FLOAT64_GARBAGE],
                         ids=lambda c: c.name)
def test_pytorch_case(case):
    run_case(case)


@pytest.fixture
def full_set(request):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the tally over ONNX's complete node collection runs with -m slow")


def _tally(cases: list[Case]) -> tuple[Counter, list[str]]:
    counts: Counter = Counter()
    failed_float32 = []
    for case in cases:
        f32 = is_float32(case.model)
        counts["total"] += 1
        counts["float32"] += f32
        try:
            run_case(case)
        except TileError:
            counts["unsupported"] += 1
            continue
        except AssertionError:
            if f32:
                failed_float32.append(case.name)
            counts["failed"] += 1
            continue
        counts["passed"] += 1
        counts["float32 passed"] += f32
    return counts, failed_float32


@device
@pytest.mark.slow
def test_full_node_set(full_set, capsys):
    cases = _arrays(node_cases(full=True))
    assert {c.name for c in cases} == {c.name for c in NODE}  # NODE_MODULES misses none
    counts, failed = _tally(cases)
    with capsys.disabled():
        print(f"\nONNX node cases using only supported ops: {dict(counts)}", file=sys.stderr)
    assert not failed
    assert counts["passed"] + counts["unsupported"] == counts["total"]
    assert counts["unsupported"] == len(REFUSED)
    if ONNX_1_23:
        assert dict(counts) == TALLY_ONNX_1_23["node"]


@device
@pytest.mark.slow
def test_full_pytorch_set(full_set, capsys):
    counts, failed = _tally(DATA)
    with capsys.disabled():
        print(f"\nONNX pytorch cases using only supported ops: {dict(counts)}", file=sys.stderr)
    assert not failed
    if ONNX_1_23:
        assert dict(counts) == TALLY_ONNX_1_23["pytorch"]


# a small CNN against onnxruntime ------------------------------------------------------------------

def small_cnn(batch: int | str = 2, seed: int = 0):
    """conv -> batch norm -> relu -> max pool -> flatten -> gemm -> softmax."""
    rng = np.random.default_rng(seed)

    def init(name, arr):
        return numpy_helper.from_array(np.asarray(arr, np.float32), name)

    inits = [init("w1", rng.standard_normal((8, 3, 3, 3)) * 0.3),
             init("b1", rng.standard_normal(8) * 0.1), init("gamma", rng.uniform(0.5, 1.5, 8)),
             init("beta", rng.standard_normal(8) * 0.1),
             init("mean", rng.standard_normal(8) * 0.1), init("var", rng.uniform(0.5, 1.5, 8)),
             init("w2", rng.standard_normal((10, 8 * 4 * 4)) * 0.1),
             init("b2", rng.standard_normal(10) * 0.1)]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "gamma", "beta", "mean", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "w2", "b2"], ["g"], transB=1),
        helper.make_node("Softmax", ["g"], ["y"], axis=1)]
    graph = helper.make_graph(
        nodes, "small_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                           [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])], inits)
    # IR version 8: what the installed onnxruntime reads.
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@device
def test_small_cnn_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    model = small_cnn()
    onnx.checker.check_model(model)
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})[0]
    exe = tonnx.load(model)
    got = exe.run({"x": x}, poison=True)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    # Batch norm went into the convolution's weights; conv + bias + relu is one node.  On a
    # CPU the convolution and the pool run channels-last (`graph.channels_last`), and the
    # flatten reads the pool back through one transpose.
    got_ops = [n.op for n in exe.graph.nodes]
    assert [o for o in got_ops if o != "transpose"] == ["conv", "max_pool", "reshape", "gemm",
                                                          "softmax"]
    assert got_ops.count("transpose") == (exe.graph.nodes[0].get("layout") == "NHWC")
    assert exe.graph.nodes[0].get("activation") == "relu"
    assert not {"gamma", "beta", "mean", "var"} & set(exe.graph.constants)


@device
def test_symbolic_batch_is_taken_from_the_arrays():
    model = small_cnn(batch="N")
    exe = tonnx.load(model)
    assert exe.last is None
    for n in (1, 3):
        x = np.random.default_rng(n).standard_normal((n, 3, 8, 8)).astype(np.float32)
        y = exe(x=x)["y"]
        assert y.shape == (n, 10)
        np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)
    assert len(exe._built) == 2


@device
def test_shape_input_fixes_the_program_per_value():
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    graph = helper.make_graph(
        [node], "reshape", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
                            helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    exe = tonnx.load(helper.make_model(graph))
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for shape in ([4, -1], [0, 12], [8, 3]):
        got = exe.run({"x": x, "shape": np.array(shape, np.int64)}, poison=True)["y"]
        want = x.reshape([2 if s == 0 else s for s in shape])
        np.testing.assert_array_equal(got, want)
    with pytest.raises(TileError, match="decides a shape"):
        exe.run({"x": x})


def test_unsupported_ops_are_all_listed():
    nodes = [helper.make_node("Round", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("TopK", ["b", "k"], ["c", "i"]),
             helper.make_node("Round", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.ones(1, np.int64), "k")])
    with pytest.raises(TileError, match=r"does not support: Round, TopK \(supported: "):
        tonnx.load(helper.make_model(graph))


def test_unsupported_attribute_names_node_and_attribute():
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv1", auto_pad="WEIRD")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones((1, 1, 3, 3), np.float32), "w")])
    with pytest.raises(TileError, match=r"ONNX node 'conv1' \(Conv\): attribute auto_pad"):
        tonnx.load(helper.make_model(graph))
    with pytest.raises(TileError, match="cannot read ONNX model"):
        tonnx.load("/nonexistent/model.onnx")


def test_model_files_read_as_onnx_reads_them(tmp_path):
    # Weights in the file, weights in a file beside it (external data), an empty file, a
    # file that is no model: what onnx.load gives, or one TileError naming the file.
    rng = np.random.default_rng(8)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph)
    inside, beside = tmp_path / "inside.onnx", tmp_path / "beside.onnx"
    onnx.save(model, str(inside))
    onnx.save_model(model, str(beside), save_as_external_data=True, location="beside.data",
                    size_threshold=0)
    assert (tmp_path / "beside.data").stat().st_size >= w.nbytes
    for path in (inside, beside, str(beside)):
        got = tonnx.read_model(path)
        assert got == onnx.load(str(path))
        np.testing.assert_array_equal(numpy_helper.to_array(got.graph.initializer[0]), w)
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert tonnx.read_model(tmp_path / "empty.onnx") == onnx.load(str(tmp_path / "empty.onnx"))
    (tmp_path / "junk.onnx").write_bytes(b"\xff" * 64)
    with pytest.raises(TileError, match="cannot read ONNX model .*junk.onnx"):
        tonnx.read_model(tmp_path / "junk.onnx")


# the commands -------------------------------------------------------------------------------------

@device
def test_cli_onnx_run_validate(tmp_path, capsys):
    path = tmp_path / "cnn.onnx"
    onnx.save(small_cnn(), str(path))
    assert main(["onnx", str(path), "--run", "--validate", "--save", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"7 ONNX nodes -> [56] graph nodes", out)  # 6: channels-last on a CPU
    assert re.search(r"validation of y against (onnxruntime|the numpy reference).*: ok", out)
    assert np.load(tmp_path / "o" / "y.npy").shape == (2, 10)


@device
def test_cli_graph_dump_passes(tmp_path, capsys):
    path = tmp_path / "cnn.onnx"
    onnx.save(small_cnn(), str(path))
    assert main(["graph", str(path), "--dump-passes", "--print-tile", "--run"]) == 0
    out = capsys.readouterr().out
    for name in ("batchnorm_to_elementwise", "constant_folding", "fold_scale_into_weights",
                 "fuse_bias_activation", "elementwise_fusion", "dead_node_elimination"):
        assert f"== after {name}:" in out
    assert "function (x[2, 3, 8, 8]" in out
    assert "validation against the unoptimised graph: ok" in out


def test_cli_graph_from_python_file(tmp_path, capsys):
    script = tmp_path / "g.py"
    script.write_text("import numpy as np\nimport tilec\nfrom tilec import ops\n\n"
                      "def graph():\n    g = tilec.Graph('py')\n"
                      "    x = g.input('x', (2, 3))\n"
                      "    g.output('y', ops.relu(x * g.constant(np.ones((2, 3)))))\n"
                      "    return g\n")
    assert main(["graph", str(script), "--no-passes", "--print-tile"]) == 0
    out = capsys.readouterr().out
    assert "graph py" in out and "y = relu(mul);" in out
    (tmp_path / "none.py").write_text("x = 1\n")
    assert main(["graph", str(tmp_path / "none.py")]) == 1
    assert "defines no `graph`" in capsys.readouterr().err


@device
@pytest.mark.parametrize("attrs", [
    {"strides": [2, 3], "pads": [1, 0, 2, 1], "output_padding": [1, 2], "group": 2},
    {"strides": [2, 2], "dilations": [2, 1], "auto_pad": "SAME_LOWER"}])
def test_conv_transpose_and_resize_match_onnxruntime(attrs):
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(3 * attrs.get("group", 1))
                                .astype(np.float32), "b")
    scales = numpy_helper.from_array(np.array([1, 1, 2, 3], np.float32), "scales")
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["c"], **attrs),
             helper.make_node("Resize", ["c", "", "scales"], ["y"], mode="nearest",
                              coordinate_transformation_mode="asymmetric",
                              nearest_mode="floor")]
    graph = helper.make_graph(
        nodes, "convt", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 5, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b, scales])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = rng.standard_normal((2, 4, 5, 4)).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})[0]
    got = tonnx.load(model).run({"x": x}, poison=True)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_resize_refuses_non_repeat_modes():
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest",
                            coordinate_transformation_mode="asymmetric")
    graph = helper.make_graph(
        [node], "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    with pytest.raises(TileError, match=r"'y' \(Resize\): attribute "
                                        r"nearest_mode='round_prefer_floor' is not supported"):
        tonnx.load(helper.make_model(graph))
