"""ONNX's backend test cases for the ops tilec imports: the node cases (built in memory by the
onnx package) and the pytorch-converted / pytorch-operator models shipped with it."""

from __future__ import annotations

import glob
import importlib
import os
from dataclasses import dataclass

import numpy as np

from tilec.errors import TileError

# Cases that raise a TileError on purpose: the attribute, output or type is not supported.
UNSUPPORTED = {
    "test_identity_sequence": "only tensors",
    "test_identity_opt": "only tensors",
    # Resize: only nearest by an integer factor (a repeat) is supported.
    "test_resize_downsample_scales_cubic":
        "attribute mode='cubic' is not supported",
    "test_resize_downsample_scales_cubic_A_n0p5_exclude_outside":
        "attribute mode='cubic' is not supported",
    "test_resize_downsample_scales_cubic_align_corners":
        "attribute mode='cubic' is not supported",
    "test_resize_downsample_scales_cubic_antialias":
        "attribute mode='cubic' is not supported",
    "test_resize_downsample_scales_linear":
        "attribute mode='linear' is not supported",
    "test_resize_downsample_scales_linear_align_corners":
        "attribute mode='linear' is not supported",
    "test_resize_downsample_scales_linear_antialias":
        "attribute mode='linear' is not supported",
    "test_resize_downsample_scales_linear_half_pixel_symmetric":
        "attribute mode='linear' is not supported",
    "test_resize_downsample_scales_nearest":
        "only integer upsampling factors",
    "test_resize_downsample_sizes_cubic":
        "attribute mode='cubic' is not supported",
    "test_resize_downsample_sizes_cubic_antialias":
        "attribute mode='cubic' is not supported",
    "test_resize_downsample_sizes_linear_antialias":
        "attribute mode='linear' is not supported",
    "test_resize_downsample_sizes_linear_pytorch_half_pixel":
        "attribute mode='linear' is not supported",
    "test_resize_downsample_sizes_nearest":
        "only integer multiples",
    "test_resize_downsample_sizes_nearest_not_larger":
        "attribute keep_aspect_ratio_policy='not_larger' is not supported",
    "test_resize_downsample_sizes_nearest_not_smaller":
        "attribute keep_aspect_ratio_policy='not_smaller' is not supported",
    "test_resize_tf_crop_and_resize":
        "attribute mode='linear' is not supported",
    "test_resize_tf_crop_and_resize_axes_2_3":
        "attribute mode='linear' is not supported",
    "test_resize_tf_crop_and_resize_axes_3_2":
        "attribute mode='linear' is not supported",
    "test_resize_tf_crop_and_resize_extrapolation_value":
        "attribute mode='linear' is not supported",
    "test_resize_upsample_scales_cubic":
        "attribute mode='cubic' is not supported",
    "test_resize_upsample_scales_cubic_A_n0p5_exclude_outside":
        "attribute mode='cubic' is not supported",
    "test_resize_upsample_scales_cubic_align_corners":
        "attribute mode='cubic' is not supported",
    "test_resize_upsample_scales_cubic_asymmetric":
        "attribute mode='cubic' is not supported",
    "test_resize_upsample_scales_linear":
        "attribute mode='linear' is not supported",
    "test_resize_upsample_scales_linear_align_corners":
        "attribute mode='linear' is not supported",
    "test_resize_upsample_scales_linear_half_pixel_symmetric":
        "attribute mode='linear' is not supported",
    "test_resize_upsample_sizes_cubic":
        "attribute mode='cubic' is not supported",
    "test_resize_upsample_sizes_nearest":
        "only integer multiples",
    "test_resize_upsample_sizes_nearest_axes_2_3":
        "only integer multiples",
    "test_resize_upsample_sizes_nearest_axes_3_2":
        "only integer multiples",
    "test_resize_upsample_sizes_nearest_ceil_half_pixel":
        "attribute nearest_mode='ceil' is not supported",
    "test_resize_upsample_sizes_nearest_floor_align_corners":
        "attribute coordinate_transformation_mode='align_corners' is not supported",
    "test_resize_upsample_sizes_nearest_not_larger":
        "attribute keep_aspect_ratio_policy='not_larger' is not supported",
    "test_resize_upsample_sizes_nearest_not_smaller":
        "attribute keep_aspect_ratio_policy='not_smaller' is not supported",
    "test_resize_upsample_sizes_nearest_round_prefer_ceil_asymmetric":
        "attribute nearest_mode='round_prefer_ceil' is not supported",
    # Attention in bfloat16: no storage type for it.
    **{f"test_attention_{n}_bf16{x}": "element type BFLOAT16 is not supported"
       for n in ("4d_causal", "4d_padded_kv", "4d_causal_padded_kv", "4d_attn_mask_causal",
                 "3d_causal") for x in ("", "_expanded")},
    # Attention's function bodies that pad the mask with a value computed in the graph (a
    # CastLike of -inf), which Pad needs to know when loading.
    **{f"test_attention_{n}_expanded": "the constant value must be a constant"
       for n in ("4d_diff_heads_mask4d_padded_kv", "causal_boolmask_nan_robustness",
                 "24_fullymasked_qk_matmul_output_mode3_zero",
                 "24_qk_matmul_output_mode3_softmax_precision",
                 "4d_causal_nonpad_attn_mask_composition", "local_window_rank1_boolean_mask",
                 "local_window_ext_cache_rank3_head_mask",
                 "local_window_ext_cache_rank4_batch_mask", "local_window_ext_cache_rank2_mask",
                 "local_window_ext_cache_float16_mask", "local_window_gqa_rank4_mask")},
}

# Relative tolerances above the case's own: Attention's float16 function body rounds every
# intermediate (scores, softmax) to float16 in its own order; two ulps apart from ONNX's.
LOOSER = {"test_attention_4d_causal_fp16_expanded": 2e-3}

# The node-case modules whose cases use only supported ops (reducesumsquare: its expanded
# cases are Mul + ReduceSum).  Importing just these builds the cases in a few seconds instead
# of all of ONNX's (~11 s); the slow test checks against the full collection that none is
# missed.
NODE_MODULES = ("relu", "conv", "gemm", "batch_normalization", "softmax", "reshape", "concat",
                "reducemean", "reducesum", "reducemax", "reducesumsquare", "clip", "matmul",
                "transpose", "flatten", "leakyrelu", "add", "sub", "mul", "div", "sigmoid",
                "tanh", "globalaveragepool", "identity", "constant", "maxpool", "averagepool",
                "convtranspose", "resize", "upsample", "attention")


@dataclass
class Case:
    name: str
    model: object
    data_sets: list  # [(inputs, outputs)]
    rtol: float = 1e-3
    atol: float = 1e-7


def _supported(model) -> bool:
    import tilec.onnx.importer as tonnx

    return not tonnx.unsupported_ops(model)


def node_cases(full: bool) -> list[Case]:
    """The node cases whose ops are all supported: from all of ONNX's (full) or from
    NODE_MODULES."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case builders warn about their own numpy maths
        if full:
            from onnx.backend.test.case.node import collect_testcases

            found = collect_testcases(None)
        else:
            import onnx.backend.test.case.node as node

            for m in NODE_MODULES:
                try:
                    importlib.import_module(f"onnx.backend.test.case.node.{m}")
                except ImportError:  # renamed in another onnx version
                    continue
            found = node._NodeTestCases
    out = {c.name: Case(c.name, c.model, list(c.data_sets), max(c.rtol, LOOSER.get(c.name, 0)),
                        c.atol)
           for c in found if _supported(c.model)}
    return [out[k] for k in sorted(out)]


def data_cases() -> list[Case]:
    """The pytorch-converted and pytorch-operator models (files with .pb test data)."""
    import onnx
    from onnx import numpy_helper

    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
    out = []
    for kind in ("pytorch-converted", "pytorch-operator"):
        for path in sorted(glob.glob(os.path.join(root, kind, "*", "model.onnx"))):
            model = onnx.load(path)
            if not _supported(model):
                continue
            sets = []
            for d in sorted(glob.glob(os.path.join(os.path.dirname(path), "test_data_set_*"))):
                def tensors(prefix: str, d: str = d) -> list[np.ndarray]:
                    files = glob.glob(os.path.join(d, f"{prefix}_*.pb"))
                    files.sort(key=lambda p: int(p.rsplit("_", 1)[1][:-3]))
                    return [numpy_helper.to_array(onnx.load_tensor(f)) for f in files]
                sets.append((tensors("input"), tensors("output")))
            out.append(Case(os.path.basename(os.path.dirname(path)), model, sets))
    return out


def is_float32(model) -> bool:
    """Every output and every data input is float32 (int64 shapes and axes do not count)."""
    from tilec.onnx.importer import ModelInfo

    try:
        info = ModelInfo(model)
    except TileError:
        return False
    data = [v for k, v in info.in_dtypes.items() if k not in info.static]
    return all(d == np.float32 for d in data + list(info.out_dtypes.values()))


def run_case(case: Case) -> None:
    """Load, run every data set with outputs poisoned, compare with the expected outputs."""
    import tilec.onnx.importer as tonnx

    exe = tonnx.load(case.model)
    for inputs, outputs in case.data_sets:
        got = exe.run(dict(zip(exe.inputs, inputs, strict=True)), poison=True)
        for name, want in zip(exe.outputs, outputs, strict=True):
            g = got[name]
            assert g.shape == want.shape and g.dtype == want.dtype, \
                (name, g.shape, want.shape, g.dtype, want.dtype)
            np.testing.assert_allclose(
                g.astype(np.float64), want.astype(np.float64), rtol=max(case.rtol, 1e-4),
                atol=max(case.atol, 1e-5 * max(1.0, float(np.abs(want).max(initial=0)))),
                err_msg=f"{case.name}: {name}")


def against_onnxruntime(m, feed, rtol: float, atol: float, *, scaled_atol: bool):
    """Load `m` with tilec, run it with its outputs poisoned and compare every output with
    onnxruntime's: same types and shapes, integers and bools exactly, floats within rtol and
    atol (times the output's largest magnitude, at least 1, when `scaled_atol`).  Returns the
    executable."""
    import pytest

    import tilec.onnx.importer as tonnx

    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feed)
    exe = tonnx.load(m)
    got = exe.run(feed, poison=True)
    for name, w in zip(exe.outputs, want, strict=True):
        g = got[name]
        assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, w.dtype, g.shape,
                                                           w.shape)
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w, err_msg=name)
            continue
        tol = atol * max(1.0, float(np.abs(w).max(initial=0))) if scaled_atol else atol
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol,
                                   atol=tol, err_msg=name)
    return exe
