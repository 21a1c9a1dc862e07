"""Row-fused and attention kernels planned by predicted time, tuned over their shapes and forms,
and rebuilt from the record (an injected timer decides the winner, so the outcome does not
depend on this machine); every kernel a compile builds is checked against the reference with
poisoned outputs."""

from __future__ import annotations

import math

import pytest

from tilec.compiler import compile as tile_compile
from tilec.config import Config
from tilec.plan.attention_time import Form
from tilec.plan.attention_time import predict as predict_attention
from tilec.plan.hw import HwModel
from tilec.plan.row_shape import RowShape, candidates, choose
from tilec.plan.rows import RowKernel
from tilec.tune.measure import tune

from ..codegen.test_attention import CAUSAL, program, shapes
from ..device import needs_device
from ..plan.test_rows import SOFTMAX
from .test_tune import assert_correct


def _row_kernel(shape, hw):
    from tilec.lang.api import check_program
    from tilec.plan.fuse import plan_kernels

    plan = plan_kernels(check_program(SOFTMAX, {"I": shape}, "float32"), rows=True)
    return next(k for k in plan.kernels if isinstance(k, RowKernel)), plan.program


# -- the model (no device) -----------------------------------------------------------------------

def test_gpu_row_shapes_follow_the_row_length():
    hw = HwModel.load("nvidia-h100")
    short, prog = _row_kernel((65536, 64), hw)
    best, ranked = choose(short, prog, hw)
    assert best.threads * best.rows >= 32  # short rows: several rows fill a group
    assert best.threads <= 16 and best.rows > 1
    long, prog = _row_kernel((512, 32000), hw)
    best_long, _ = choose(long, prog, hw)
    assert best_long.threads == 256 and best_long.rows == 1
    # Predictions are times: positive, finite, and every candidate has its own.
    assert all(0 < s.predicted_s < math.inf and s.bottleneck for s in ranked)
    assert ranked == sorted(ranked, key=lambda s: s.predicted_s)


def test_cpu_row_shapes_use_the_widest_full_speed_vector():
    hw = HwModel.load("pocl-cpu")
    k, prog = _row_kernel((4096, 1000), hw)
    best, ranked = choose(k, prog, hw)
    assert best.threads == 1 and best.vec == hw.vec_size
    assert {s.vec for s in ranked} >= {1, hw.vec_size}
    # A scalar walk waits on the reduction's add each element: far slower predicted.
    scalar = min(s.predicted_s for s in ranked if s.vec == 1)
    assert scalar > 2 * best.predicted_s


def test_without_peak_and_bandwidth_the_rule_decides():
    from dataclasses import replace

    hw = replace(HwModel.load("nvidia-h100"), peak_gflops=0.0)
    k, prog = _row_kernel((100, 1000), hw)
    best, ranked = choose(k, prog, hw)
    assert ranked == [] and math.isnan(best.predicted_s) and best.threads == 128


def test_attention_forms_are_ranked_by_predicted_time():
    from tilec.codegen.attention_tiled import attention_forms
    from tilec.lang.api import check_program
    from tilec.plan.attention import AttentionKernel
    from tilec.plan.fuse import plan_kernels

    hw = HwModel.load("nvidia-h100")
    plan = plan_kernels(check_program(program(CAUSAL), shapes(b=8, h=12, t=512, s=512, d=64,
                                                                e=64), "float32"),
                        attention=True)
    (k,) = [k for k in plan.kernels if isinstance(k, AttentionKernel)]
    forms = attention_forms(k, hw)
    assert forms[0].form == "tiled" and any(f.form == "rows" for f in forms)
    preds = [predict_attention(k, hw, f) for f in forms]
    assert all(0 < f.predicted_s < math.inf for f in preds)
    tiled = preds[0].predicted_s
    assert all(tiled < f.predicted_s for f in preds[1:])
    # A causal bound halves the work.
    full = plan_kernels(check_program(program(), shapes(b=8, h=12, t=512, s=512, d=64, e=64),
                                      "float32"), attention=True)
    (kf,) = [k for k in full.kernels if isinstance(k, AttentionKernel)]
    assert predict_attention(kf, hw, forms[0]).predicted_s > 1.5 * tiled
    assert isinstance(forms[0], Form)


# -- tuning and records (device) -----------------------------------------------------------------

@needs_device
@pytest.mark.parametrize("hw", ["pocl-cpu", "nvidia-h100"])
def test_row_shapes_are_tuned_and_the_record_rebuilds_the_winner(tmp_path, hw):
    config = Config(records_path=tmp_path / "r.jsonl", hw=hw)
    shp = {"I": (37, 300)}
    k, prog = _row_kernel(shp["I"], HwModel.load(hw))
    n = len(candidates(k, prog, HwModel.load(hw)))
    assert n > 2
    report = tune(SOFTMAX, shp, config=config, top_k=n,
                  timer=lambda c: 1e-4 if c.rank == 2 else 1e-3)
    (t,) = report.kernels
    assert t.kind == "rows" and len(t.results) == n
    assert all(m.status == "ok" for m in t.results)  # every shape validated
    assert t.best is t.results[2] and t.regret == pytest.approx(10.0)
    assert t.rho is not None
    rec = t.record
    assert rec is not None and dict(rec.tile).keys() == {"threads", "rows", "vec"}
    assert len(rec.pairs) == n  # predicted beside measured, for the correction
    exe = tile_compile(SOFTMAX, shp, config=config)
    (src,) = [s for s in exe.sources if s.kind == "row"]
    assert "tuned: measured" in src.text
    want = dict(rec.tile)
    shape = RowShape(want["threads"], want["rows"], want["vec"])
    assert shape.describe().split(",")[0] in src.cost
    assert_correct(exe)


@needs_device
def test_attention_forms_are_tuned_and_the_record_rebuilds_the_winner(tmp_path):
    config = Config(records_path=tmp_path / "r.jsonl", hw="nvidia-h100",
                    attention_fusion=True)
    src, shp = program(CAUSAL), shapes(b=1, h=2, t=40, s=40, d=16, e=32)
    report = tune(src, shp, config=config, top_k=8,
                  timer=lambda c: 1e-4 if c.rank == 1 else 1e-3)
    (t,) = [t for t in report.kernels if t.kind == "attention"]
    assert len(t.results) > 2 and all(m.status == "ok" for m in t.results)
    assert t.results[0].candidate.predicted is not None
    assert t.best is t.results[1]
    tile = dict(t.record.tile)
    exe = tile_compile(src, shp, config=config)
    (a,) = [s for s in exe.sources if s.kind == "attention"]
    assert f"{tile['rows']} query rows a work-group" in a.cost
    assert ("register-tiled" in a.cost) == bool(tile["tiled"])
    assert_correct(exe)
