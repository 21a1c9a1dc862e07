"""ONNX's Attention (opsets 23-25) and the graph op under it (`ops_attention`): small models on
random non-zero inputs, run with the outputs poisoned and compared with ONNX's reference
implementation (the spec's; onnxruntime for one case): 4-D and 3-D inputs, GQA, different
value head sizes, masks (bool and float, 1-D to 4-D, shorter than the keys, rows with nothing
left: zeros, as the reference gives), causal with and without a past or a padded cache (the
offsets), windows, soft cap, scale, the qk_matmul_output modes, float16; the fusable forms
compile to one attention kernel on a GPU model, with the causal bound found; the refusals.
ONNX's own node cases run in test_onnx.py (`onnx_cases.NODE_MODULES`)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import tilec  # noqa: E402
import tilec.onnx.importer as tonnx  # noqa: E402
from tilec.config import Config  # noqa: E402
from tilec.errors import Source, TileError  # noqa: E402
from tilec.graph.ops_attention import attention, attention_scores  # noqa: E402
from tilec.lang.api import check_program  # noqa: E402
from tilec.plan.attention import find  # noqa: E402

from ..device import needs_device  # noqa: E402
from ..graph_refs import kinds  # noqa: E402

device = needs_device
RNG = np.random.default_rng(23)
FUSED = Config(attention_fusion=True)
_TYPES = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16,
          np.bool_: TensorProto.BOOL, np.int64: TensorProto.INT64}
OUTS = ("Y", "present_key", "present_value", "qk_matmul_output")


def rand(shape, dtype=np.float32):
    """Random values away from zero, either sign."""
    return (RNG.uniform(0.25, 1.5, shape) * RNG.choice([-1, 1], shape)).astype(dtype)


def float_mask(shape, p=0.3):
    return np.where(RNG.random(shape) < p, -np.inf, rand(shape)).astype(np.float32)


def model(feed, outputs=1, opset=23, **attrs):
    """One Attention node over `feed` (None entries are absent operands)."""
    names = ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")
    ins = [n if feed.get(n) is not None else "" for n in names]
    while ins and not ins[-1]:
        ins.pop()
    outs = list(OUTS[:outputs]) if isinstance(outputs, int) else list(outputs)
    node = helper.make_node("Attention", ins, outs, name="att", **attrs)
    inputs = [helper.make_tensor_value_info(n, _TYPES[feed[n].dtype.type], feed[n].shape)
              for n in ins if n]
    t = _TYPES[feed["Q"].dtype.type]
    graph = helper.make_graph([node], "m", inputs, [helper.make_tensor_value_info(o, t, None)
                                                    for o in outs if o])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=10)


def check(m, feed, rtol=1e-4, atol=1e-5, **load):
    """tilec (outputs poisoned) against ONNX's reference: same shapes, types and values
    (-inf where the reference has it)."""
    feed = {k: v for k, v in feed.items() if v is not None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = ReferenceEvaluator(m).run(None, feed)
    exe = tonnx.load(m, **load)
    got = exe.run(feed, poison=True)
    for name, w in zip(exe.outputs, want, strict=True):
        g = got[name]
        assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, w.dtype, g.shape,
                                                           w.shape)
        assert not np.isnan(w).any()
        np.testing.assert_array_equal(np.isneginf(g), np.isneginf(w), err_msg=name)
        fin = np.isfinite(w)
        np.testing.assert_allclose(g[fin].astype(np.float64), w[fin].astype(np.float64),
                                   rtol=rtol, atol=atol, err_msg=name)
    return exe, got


def qkv(b=2, hq=4, hkv=4, tq=5, tk=7, d=8, e=None, dtype=np.float32):
    return {"Q": rand((b, hq, tq, d), dtype), "K": rand((b, hkv, tk, d), dtype),
            "V": rand((b, hkv, tk, e or d), dtype)}


def qkv3(b=2, hq=4, hkv=2, tq=5, tk=7, d=8, e=None):
    return {"Q": rand((b, tq, hq * d)), "K": rand((b, tk, hkv * d)),
            "V": rand((b, tk, hkv * (e or d)))}


# 4-D and 3-D, heads, scale, soft cap --------------------------------------------------------

@device
@pytest.mark.parametrize("shape", [dict(), dict(hq=6, hkv=2), dict(hq=4, hkv=1, e=5),
                                   dict(tq=9, tk=3), dict(b=1, hq=2, hkv=2, tq=1, tk=20)],
                         ids=["mha", "gqa", "mqa-diff-e", "tq>tk", "decode"])
@pytest.mark.parametrize("attrs", [dict(), dict(scale=0.07), dict(softcap=1.5),
                                   dict(is_causal=1)], ids=["plain", "scale", "softcap",
                                                            "causal"])
def test_4d(shape, attrs):
    feed = qkv(**shape)
    check(model(feed, **attrs), feed)


@device
@pytest.mark.parametrize("shape", [dict(), dict(hq=6, hkv=3, e=4), dict(hq=2, hkv=2)])
@pytest.mark.parametrize("causal", [0, 1])
def test_3d(shape, causal):
    feed = qkv3(**shape)
    hq, hkv = shape.get("hq", 4), shape.get("hkv", 2)
    check(model(feed, is_causal=causal, q_num_heads=hq, kv_num_heads=hkv, softcap=3.0), feed)


@device
def test_against_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    feed = qkv(hq=4, hkv=2)
    feed["attn_mask"] = float_mask((5, 7), 0.2)
    feed["attn_mask"][:, 0] = 0
    m = model(feed, is_causal=1)
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feed)[0]
    got = tonnx.load(m).run(feed, poison=True)["Y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# masks ----------------------------------------------------------------------------------------

@device
@pytest.mark.parametrize("shape", [(5, 7), (4, 5, 7), (2, 1, 5, 7), (2, 4, 5, 7), (1, 7),
                                   (7,), (5, 4), (2, 1, 1, 3)],
                         ids=["2d", "3d-heads", "4d-batch", "4d", "row", "1d", "short",
                              "short-4d"])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_masks(shape, kind):
    feed = qkv(hq=4, hkv=2 if kind == "float" else 4)  # GQA splits a mask's head axis
    feed["attn_mask"] = RNG.random(shape) < 0.6 if kind == "bool" else float_mask(shape)
    check(model(feed, opset=25 if len(shape) == 1 else 23), feed)


@device
@pytest.mark.parametrize("causal", [0, 1])
def test_rows_with_no_key_left_are_zero(causal):
    feed = qkv(b=1, hq=2, hkv=2, tq=4, tk=6)
    keep = RNG.random((1, 2, 4, 6)) < 0.7
    keep[0, 1, 2] = False  # head 1, query 2: nothing left
    feed["attn_mask"] = keep
    _, got = check(model(feed, is_causal=causal), feed)
    assert (got["Y"][0, 1, 2] == 0).all() and (got["Y"][0, 0, 2] != 0).all()
    feed["attn_mask"] = np.where(keep, 0.5, -np.inf).astype(np.float32)
    check(model(feed, is_causal=causal), feed)


# causal offsets: past, padded caches; windows ---------------------------------------------------

@device
@pytest.mark.parametrize("gqa", [False, True])
@pytest.mark.parametrize("mask", [False, True])
def test_causal_with_past(gqa, mask):
    feed = qkv(hq=4, hkv=2 if gqa else 4, tq=3, tk=3, e=6)
    feed["past_key"], feed["past_value"] = rand((2, feed["K"].shape[1], 5, 8)), \
        rand((2, feed["K"].shape[1], 5, 6))
    if mask:
        feed["attn_mask"] = RNG.random((2, 1, 3, 8)) < 0.7
    _, got = check(model(feed, outputs=3, is_causal=1, opset=24), feed)
    np.testing.assert_array_equal(got["present_key"],
                                  np.concatenate([feed["past_key"], feed["K"]], 2))


@device
def test_3d_with_past_and_scores():
    feed = qkv3(hq=4, hkv=2, tq=3, tk=3)
    feed["past_key"], feed["past_value"] = rand((2, 2, 4, 8)), rand((2, 2, 4, 8))
    feed["attn_mask"] = float_mask((3, 7), 0.2)
    check(model(feed, outputs=4, q_num_heads=4, kv_num_heads=2, qk_matmul_output_mode=2),
          feed)


@device
@pytest.mark.parametrize("lengths", [[3, 7], [7, 1], [2, 0]])
@pytest.mark.parametrize("causal", [0, 1])
def test_padded_cache(lengths, causal):
    feed = qkv(hq=4, hkv=2, tq=3, tk=7)
    feed["nonpad_kv_seqlen"] = np.array(lengths, np.int64)
    check(model(feed, is_causal=causal, opset=24), feed)


@device
@pytest.mark.parametrize("window, causal", [((2, -1), 1), ((1, 2), 0), ((-1, 0), 0),
                                            ((0, 0), 1), ((1, 3), 1)])
@pytest.mark.parametrize("cache", [None, "past", "nonpad"])
def test_windows(window, causal, cache):
    feed = qkv(hq=4, hkv=2, tq=4, tk=6 if cache != "past" else 2)
    if cache == "past":
        feed["past_key"], feed["past_value"] = rand((2, 2, 5, 8)), rand((2, 2, 5, 8))
    elif cache == "nonpad":
        feed["nonpad_kv_seqlen"] = np.array([6, 4], np.int64)
    check(model(feed, outputs=1, is_causal=causal, left_window_size=window[0],
                right_window_size=window[1], opset=25), feed)


# the qk_matmul_output modes, precision, float16 ----------------------------------------------

@device
@pytest.mark.parametrize("mode", [0, 1, 2, 3])
@pytest.mark.parametrize("softcap", [0.0, 2.0])
def test_qk_matmul_output(mode, softcap):
    feed = qkv(hq=4, hkv=2, tq=4, tk=6)
    keep = RNG.random((4, 6)) < 0.6
    keep[1] = False
    feed["attn_mask"] = keep
    m = model(feed, outputs=("Y", "", "", "qk_matmul_output"), qk_matmul_output_mode=mode,
              softcap=softcap, is_causal=1)
    _, got = check(m, feed)
    if mode == 3:
        assert (got["qk_matmul_output"][:, :, 1] == 0).all()


@device
def test_qk_matmul_output_keeps_the_attention_fused():
    feed = qkv(hq=4, hkv=2, tq=16, tk=16)
    m = model(feed, outputs=("Y", "", "", "qk_matmul_output"), qk_matmul_output_mode=3)
    exe, _ = check(m, feed, hw="nvidia-h100", config=FUSED)
    assert kinds(exe).count("attention") == 1


@device
@pytest.mark.parametrize("precision", [None, 1, 10])
def test_float16(precision):
    feed = qkv(hq=4, hkv=2, dtype=np.float16)
    feed["attn_mask"] = RNG.random((5, 7)) < 0.7
    attrs = {} if precision is None else {"softmax_precision": precision}
    check(model(feed, outputs=4, is_causal=1, qk_matmul_output_mode=3, **attrs), feed,
          rtol=3e-3, atol=2e-3)


# one kernel -------------------------------------------------------------------------------------

def _kernel(exe):
    """The attention kernel the plan finds in the program an executable was built from."""
    p = exe.last.program
    (found,) = find(check_program(Source(p.source, "<graph>"), p.shapes, p.dtypes)).values()
    return found[1]


@device
@pytest.mark.parametrize("case", ["plain", "causal", "past", "mask", "gqa", "gqa-causal",
                                  "nonpad"])
def test_fused_into_one_kernel(case):
    gqa = case.startswith("gqa")
    feed = qkv(b=2, hq=4, hkv=2 if gqa else 4, tq=33, tk=40, d=16)
    attrs = {"is_causal": 1} if "causal" in case or case in ("past", "nonpad") else {}
    if case == "past":
        feed["past_key"], feed["past_value"] = rand((2, 4, 7, 16)), rand((2, 4, 7, 16))
    if case == "mask":
        feed["attn_mask"] = float_mask((33, 40), 0.2)
    if case == "nonpad":
        feed["nonpad_kv_seqlen"] = np.array([40, 35], np.int64)
    exe, _ = check(model(feed, outputs=1, opset=24, **attrs), feed, hw="nvidia-h100",
                   config=FUSED)
    ks = kinds(exe)
    assert ks.count("attention") == 1 and "row" not in ks
    if case in ("plain", "causal"):
        assert ks == ["attention"]
    # The causal bound (key <= query + c) skips the masked key blocks: after 7 cached keys
    # c = 7, without a cache 0 (grouped heads too: the bound reads the position, not the
    # group).  The padded cache's per-batch offset leaves it unbounded (still correct).
    bound = {"causal": (1, 0), "gqa-causal": (1, 0), "past": (1, 7)}.get(case)
    assert _kernel(exe).causal == bound


# refusals ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("attrs, feed_extra, pattern", [
    (dict(qk_matmul_output_mode=4), {}, "qk_matmul_output_mode=4 is not supported"),
    (dict(softmax_precision=6), {}, "softmax_precision=6 is not supported"),
    (dict(q_num_heads=3), {}, "q_num_heads=3 differs"),
    (dict(), {"past_key": rand((2, 4, 3, 8))}, "past_key and past_value"),
    (dict(), {"attn_mask": np.zeros((5, 9), np.float32)}, "9 keys, more than the 7"),
])
def test_refused(attrs, feed_extra, pattern):
    feed = {**qkv(), **feed_extra}
    with pytest.raises(TileError, match=r"ONNX node 'att' \(Attention\): .*" + pattern):
        tonnx.load(model(feed, **attrs))


def test_refused_3d_without_heads_and_old_opsets():
    feed = qkv3()
    with pytest.raises(TileError, match="q_num_heads and kv_num_heads"):
        tonnx.load(model(feed))
    with pytest.raises(TileError, match="from opset 23 on"):
        tonnx.load(model(qkv(), opset=22))
    feed = {**qkv(), "past_key": rand((2, 4, 3, 8)), "past_value": rand((2, 4, 3, 8)),
            "nonpad_kv_seqlen": np.array([7, 7], np.int64)}
    with pytest.raises(TileError, match="cannot be combined"):
        tonnx.load(model(feed, opset=24))


# the graph op ----------------------------------------------------------------------------------

def test_graph_op_checks():
    g = tilec.Graph("bad")
    q, k = g.input("q", (2, 6, 5, 8)), g.input("k", (2, 4, 7, 8))
    with pytest.raises(TileError, match="6 heads are not a multiple of k's 4"):
        attention(q, k, k)
    k3 = g.input("k3", (2, 3, 7, 8))
    with pytest.raises(TileError, match="lengths of shape"):
        attention(q, k3, k3, lengths=g.input("n", (3,), "int32"))
    with pytest.raises(TileError, match="offset 'start'"):
        attention(q, k3, k3, offset="start")
    with pytest.raises(TileError, match="negative bound"):
        attention(q, k3, k3, window=(-2, None))
    with pytest.raises(TileError, match="stage 'logits'"):
        attention_scores(q, k3, stage="logits")


@device
def test_graph_op_default_keeps_nan_rows_and_fuses_with_gqa():
    """Without empty_rows="zero" a row with no key is NaN (torch's result), and grouped
    heads are read through a [B, Hkv, G, T, D] view (one attention kernel)."""
    g = tilec.Graph("gqa")
    arrays = {"q": rand((1, 4, 6, 8)), "k": rand((1, 2, 6, 8)), "v": rand((1, 2, 6, 8))}
    q, k, v = (g.input(n, a.shape) for n, a in arrays.items())
    g.output("o", attention(q, k, v, causal=True, offset=-2))
    exe = g.compile(hw="nvidia-h100", config=FUSED)
    assert kinds(exe).count("attention") == 1
    out = exe.run(arrays, poison=True)["o"]
    assert np.isnan(out[:, :, :2]).all() and not np.isnan(out[:, :, 2:]).any()
    kk, vv = (np.repeat(arrays[n], 2, axis=1) for n in "kv")
    s = arrays["q"] @ kk.transpose(0, 1, 3, 2) / np.sqrt(8)
    s = np.where(np.tril(np.ones((6, 6), bool), -2), s, -np.inf)[:, :, 2:]
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ vv
    np.testing.assert_allclose(out[:, :, 2:], want, rtol=1e-4, atol=1e-5)
