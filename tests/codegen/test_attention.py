"""Attention in one kernel (`plan.attention`, `codegen.attention`, `codegen.attention_tiled`):
which programs are found, and every form's results against the numpy reference on random
inputs with the outputs poisoned: the row form (CPU model) and the tiled form (a GPU model,
run on the CPU device), masks (float, bool, fully masked rows), the causal bound with fewer
and more queries than keys, keys past one block, sizes that do not divide the tiles, and the
graph op `ops_attention.attention` against numpy's attention."""

from __future__ import annotations

import numpy as np
import pytest

import tilec
from tilec.config import Config
from tilec.errors import TileError
from tilec.graph.ops_attention import attention
from tilec.lang.api import check_program
from tilec.plan.attention import find
from tilec.plan.fuse import plan_kernels
from tilec.plan.hw import HwModel

from ..device import needs_device

RNG = np.random.default_rng(7)
FUSED = Config(attention_fusion=True)


def program(score: str = "", inputs: str = "") -> str:
    """Q.K^T, `score` statements turning A into X, softmax, .V."""
    body = score or "X = A * 0.25;"
    return f"""function (Q[B, H, T, D], K[B, H, S, D], V[B, H, S, E]{inputs}) -> (O) {{
  A[b, h, i, j : B, H, T, S] = +(Q[b, h, i, d] * K[b, h, j, d]);
  {body}
  M[b, h, i, 0 : B, H, T, 1] = >(X[b, h, i, j]);
  W = exp(X - M);
  Z[b, h, i, 0 : B, H, T, 1] = +(W[b, h, i, j]);
  P = W / Z;
  O[b, h, i, e : B, H, T, E] = +(P[b, h, i, j] * V[b, h, j, e]);
}}"""


CAUSAL = "Y = A * 0.25; X = index(Y, 2) + 8 >= index(Y, 3) ? Y : -1e39;"


def shapes(b=2, h=3, t=37, s=45, d=16, e=8):
    return {"Q": (b, h, t, d), "K": (b, h, s, d), "V": (b, h, s, e)}


def kernels(src, shp):
    return plan_kernels(check_program(src, shp, "float32")).kernels


# Finding -------------------------------------------------------------------------------------
def test_found_with_roles_and_causal_bound():
    (k,) = find(check_program(program(CAUSAL), shapes(), "float32")).values()
    att = k[1]
    assert (att.key, att.depth, att.query, att.batch, att.values) == \
        ("j", ("d",), ("i",), ("b", "h"), ("e",))
    assert att.causal == (1, 8)  # j <= i + 8
    assert [type(k).__name__ for k in kernels(program(CAUSAL), shapes())] == \
        ["AttentionKernel"]


def test_not_found_when_the_probabilities_are_an_output():
    src = program().replace("-> (O)", "-> (O, P)")
    assert not find(check_program(src, shapes(), "float32"))
    assert "AttentionKernel" not in [type(k).__name__ for k in kernels(src, shapes())]


def test_not_found_when_the_softmax_is_not_exp_of_the_difference():
    src = program().replace("W = exp(X - M);", "W = exp(X) - M;")
    assert not find(check_program(src, shapes(), "float32"))


def test_not_found_past_the_register_budget():
    assert not find(check_program(program(), shapes(d=200, e=100), "float32"))


# Running -------------------------------------------------------------------------------------
def run(src, shp, hw=None, extra=None, config=FUSED, seed=None):
    rng = RNG if seed is None else np.random.default_rng(seed)
    arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in shp.items()}
    arrays.update(extra or {})
    types = {n: "bool" if a.dtype == bool else "float32" for n, a in arrays.items()}
    exe = tilec.compile(src, {n: a.shape for n, a in arrays.items()}, dtype=types, hw=hw,
                        config=config)
    got = exe.run(arrays, poison=True)
    ref = tilec.evaluate(src, **arrays)
    np.testing.assert_allclose(got["O"], ref["O"], rtol=2e-5, atol=2e-5, equal_nan=True)
    assert not np.isnan(got["O"]).any() or np.isnan(ref["O"]).any()
    return exe, got["O"]


FORMS = [None, "nvidia-h100"]  # the device's own model (the row form); a GPU's (tiled)


@needs_device
@pytest.mark.parametrize("hw", FORMS)
@pytest.mark.parametrize("shp", [shapes(), shapes(1, 1, 100, 120, 64, 64),
                                 shapes(1, 2, 70, 33, 32, 32), shapes(2, 1, 5, 3, 4, 32),
                                 shapes(1, 1, 129, 200, 12, 20), shapes(1, 2, 70, 90, 128, 128)])
def test_plain_and_causal(hw, shp):
    for score in ("", CAUSAL):
        exe, _ = run(program(score), shp, hw)
        assert [s.kind for s in exe.sources] == ["attention"]


@needs_device
@pytest.mark.parametrize("hw", FORMS)
def test_causal_with_more_queries_than_keys_leaves_rows_empty(hw):
    # j <= i - 40: the first 40 query rows see no key (NaN, as softmax of all -inf).
    src = program("Y = A * 0.25; X = index(Y, 2) - 40 >= index(Y, 3) ? Y : -1e39;")
    _, out = run(src, shapes(1, 2, 90, 50, 16, 32), hw)
    assert np.isnan(out[:, :, :40]).all() and not np.isnan(out[:, :, 40:]).any()


@needs_device
@pytest.mark.parametrize("hw", FORMS)
def test_masks_float_bool_and_fully_masked_rows(hw):
    shp = shapes(2, 2, 40, 70, 16, 32)
    mask = np.where(RNG.random((40, 70)) < 0.4, -np.inf, 0).astype(np.float32)
    mask[5] = -np.inf  # a row with nothing left
    mask[7, :64] = -np.inf  # its first block all masked
    _, out = run(program("X = A * 0.25 + Mk;", ", Mk[T, S]"), shp, hw, {"Mk": mask})
    assert np.isnan(out[:, :, 5]).all() and not np.isnan(out[:, :, 7]).any()
    keep = RNG.random((2, 1, 40, 70)) < 0.7
    run(program("X = Mb ? A : -1e39;", ", Mb[B, 1, T, S]"), shp, hw, {"Mb": keep})
    # A float condition: nonzero is true (OpenCL C takes no float condition).
    run(program("X = Mf ? A : -1e39;", ", Mf[B, 1, T, S]"), shp, hw,
        {"Mf": keep.astype(np.float32) * RNG.uniform(0.5, 2, keep.shape).astype(np.float32)})


@needs_device
def test_same_results_as_the_separate_kernels():
    src, shp = program(CAUSAL), shapes(1, 2, 64, 96, 16, 32)
    _, fused = run(src, shp, seed=3)
    exe, plain = run(src, shp, config=Config(attention_fusion=False), seed=3)
    assert "attention" not in [s.kind for s in exe.sources]
    np.testing.assert_allclose(fused, plain, rtol=1e-5, atol=1e-5)


def test_cpu_devices_keep_separate_kernels_by_default():
    from tilec.plan.fuse import fuse_attention

    assert not fuse_attention(Config(), HwModel.load("pocl-cpu"))
    assert fuse_attention(Config(), HwModel.load("nvidia-h100"))
    assert fuse_attention(FUSED, HwModel.load("pocl-cpu"))
    assert not fuse_attention(Config(row_fusion=False), HwModel.load("nvidia-h100"))


# The graph op --------------------------------------------------------------------------------
def np_attention(q, k, v, mask=None, causal=False, scale=None):
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) * (scale or 1 / np.sqrt(q.shape[-1]))
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ v


@needs_device
@pytest.mark.parametrize("hw", FORMS)
@pytest.mark.parametrize("causal", [False, True])
def test_graph_op(hw, causal):
    g = tilec.Graph("att")
    q, k, v = (g.input(n, s) for n, s in (("q", (2, 3, 33, 16)), ("k", (2, 3, 41, 16)),
                                             ("v", (2, 3, 41, 32))))
    m = g.input("m", (33, 41))
    g.output("o", attention(q, k, v, m, causal=causal, scale=0.3))
    arrays = {"q": RNG.standard_normal((2, 3, 33, 16)).astype(np.float32),
              "k": RNG.standard_normal((2, 3, 41, 16)).astype(np.float32),
              "v": RNG.standard_normal((2, 3, 41, 32)).astype(np.float32),
              "m": np.where(RNG.random((33, 41)) < 0.2, -np.inf, 0).astype(np.float32)}
    exe = g.compile(hw=hw, config=FUSED)
    assert [s.kind for s in exe.kernels] == ["attention"]
    got = exe.run(arrays, poison=True)["o"]
    want = np_attention(arrays["q"], arrays["k"], arrays["v"], arrays["m"], causal, 0.3)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_graph_op_errors():
    g = tilec.Graph("bad")
    q, k = g.input("q", (2, 8, 16)), g.input("k", (2, 9, 12))
    with pytest.raises(TileError, match="feature size 16 differs"):
        attention(q, k, k)
    with pytest.raises(TileError, match="does not broadcast"):
        attention(q, q, q, g.input("m", (3, 8)))
    with pytest.raises(TileError, match="same rank"):
        attention(q, g.input("k3", (2, 1, 8, 16)), q)


def test_found_with_each_statement_naming_its_own_indices():
    src = """function (Q[T, D], K[S, D], V[S, E]) -> (O) {
  A[m, n : T, S] = +(Q[m, k] * K[n, k]);
  M[x, 0 : T, 1] = >(A[x, y]);
  W = exp(A - M);
  Z[r, 0 : T, 1] = +(W[r, c]);
  P = W / Z;
  O[m, n : T, E] = +(P[m, k] * V[k, n]);
}"""
    (found,) = find(check_program(src, {"Q": (9, 4), "K": (11, 4), "V": (11, 6)},
                                  "float32")).values()
    att = found[1]
    assert att.key == "n" and att.query == ("m",) and att.depth == ("k",)
    assert att.v.names[0] == "n" and att.out.names[0] == "m"
    assert att.values == (att.v.names[1],) and att.values[0] not in ("m", "n", "k")


@needs_device
@pytest.mark.parametrize("hw", FORMS)
def test_onnx_matmul_softmax_matmul(hw):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    b, h, t, d = 2, 3, 40, 16
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Div", ["s", "sc"], ["s2"]),
             helper.make_node("Add", ["s2", "mask"], ["s3"]),
             helper.make_node("Softmax", ["s3"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["o"])]
    mask = np.triu(np.full((t, t), -np.inf, np.float32), 1)
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [b, h, t, d]) for n in "qkvo"]
    graph = helper.make_graph(nodes, "att", io[:3], io[3:], initializer=[
        numpy_helper.from_array(np.array(4.0, np.float32), "sc"),
        numpy_helper.from_array(mask, "mask")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8)
    exe = tilec.onnx.load(model, hw=hw, config=FUSED)
    assert "attention" in [k.kind for k in exe.kernels]
    arrays = {n: RNG.standard_normal((b, h, t, d)).astype(np.float32) for n in "qkv"}
    got = exe.run(arrays, poison=True)["o"]
    want = ort.InferenceSession(model.SerializeToString()).run(None, arrays)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    del onnx


@needs_device
def test_tuned_form_is_kept_and_used(tmp_path):
    """Tuning measures the planned form and the row form at several group sizes; the record
    it keeps is what the next compile builds (results still checked)."""
    from tilec.tune.measure import tune

    src, shp = program(CAUSAL), shapes(1, 2, 40, 50, 16, 8)
    config = Config(attention_fusion=True, cache_dir=tmp_path)
    report = tune(src, shp, config=config, repeat=2, warmup=1)
    (k,) = report.kernels
    assert k.kind == "attention" and len(k.results) >= 3
    rec = k.record
    assert rec is not None and rec.digest
    exe, _ = run(src, shp, config=config)
    planned = k.results[0].candidate.local_size
    assert exe.sources[0].local_size == (rec.threads or planned)


def test_explain_names_the_roles():
    from tilec.cli.explain import explain

    text = explain(program(CAUSAL), shapes(), "float32", "nvidia-h100", None, {}, 3, None)
    assert "attention, 8 statements in one kernel" in text
    assert "key j, depth d, queries i, batch b, h, values e; keys up to 1 * i + 8" in text


GQA = """function (Q[B, G, R, T, D], K[B, G, S, D], V[B, G, S, E]) -> (O) {
  A[b, g, r, i, j : B, G, R, T, S] = +(Q[b, g, r, i, d] * K[b, g, j, d]);
  Y = A * 0.25;
  X = index(Y, 3) + 5 >= index(Y, 4) ? Y : -1e39;
  M[b, g, r, i, 0 : B, G, R, T, 1] = >(X[b, g, r, i, j]);
  W = exp(X - M);
  Z[b, g, r, i, 0 : B, G, R, T, 1] = +(W[b, g, r, i, j]);
  P = W / Z;
  O[b, g, r, i, e : B, G, R, T, E] = +(P[b, g, r, i, j] * V[b, g, j, e]);
}"""


@needs_device
@pytest.mark.parametrize("hw", FORMS)
@pytest.mark.parametrize("t", [37, 70])
def test_grouped_queries_with_a_causal_bound(hw, t):
    """Query heads grouped over shared K/V heads: two query indices (r, i); the causal bound
    follows i, and a group whose rows wrap around i visits every key it may need."""
    shp = {"Q": (2, 2, 3, t, 32), "K": (2, 2, t + 5, 32), "V": (2, 2, t + 5, 32)}
    (found,) = find(check_program(GQA, shp, "float32")).values()
    assert found[1].query == ("r", "i") and found[1].causal == (1, 5)
    exe, _ = run(GQA, shp, hw)
    assert [s.kind for s in exe.sources] == ["attention"]
