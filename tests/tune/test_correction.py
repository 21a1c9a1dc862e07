"""The time model's per-device correction: fitted from the predicted and measured tiles that
tuning records keep, carried by the hardware model, applied to later compiles' predictions."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from tilec.compiler import compile as tile_compile
from tilec.config import Config
from tilec.errors import HardwareModelError
from tilec.plan.hw import HwModel
from tilec.plan.predict import BOTTLENECKS, corrected
from tilec.tune import correction
from tilec.tune.measure import tune
from tilec.tune.records import DeviceKey, RecordStore, TuneRecord

from ..device import needs_device

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"
DEV = DeviceKey("P", "3.0", "D", "drv")
OTHER = DeviceKey("P", "3.0", "E", "drv")


def _record(device: DeviceKey, pairs, kernel: str = "k") -> TuneRecord:
    return TuneRecord(device=device, kernel=kernel, digest=kernel, shapes=(), tile=(),
                      threads=None, local_size=None, seconds=1e-3, pairs=tuple(pairs))


def test_fit_is_the_shrunk_mean_log_ratio_per_resource():
    recs = [_record(DEV, [(1.0, 2.0, "compute"), (1.0, 8.0, "compute"), (2.0, 1.0, "L2")]),
            _record(OTHER, [(1.0, 100.0, "compute")], "o")]  # another device: ignored
    f = correction.fit(recs, DEV)
    assert f["compute"] == pytest.approx(math.exp((math.log(2) + math.log(8)) / 3))
    assert f["L2"] == pytest.approx(math.exp(math.log(0.5) / 2))
    assert "DRAM" not in f  # no pairs: no factor


def test_fit_ignores_bad_pairs_and_bounds_the_factors():
    recs = [_record(DEV, [(0.0, 1.0, "compute"), (math.inf, 1.0, "compute"),
                          (1.0, 1.0, "registers"), (1e-6, 1.0, "DRAM")])]
    f = correction.fit(recs, DEV)
    assert "compute" not in f and "registers" not in f
    assert f["DRAM"] == correction.LIMITS[1]


def test_apply_and_corrected_predictions():
    hw = correction.apply(HwModel.load("nvidia-h100"), {"compute": 2.0, "L2": 0.5})
    assert hw.correct_compute == 2.0 and hw.correct_l2 == 0.5 and hw.correct_dram == 1.0
    assert "time model corrected" in hw.describe()
    pred = {"time": np.array([1.0, 1.0, 1.0]),
            "bottleneck": np.array([BOTTLENECKS.index(b) for b in ("compute", "L2", "DRAM")])}
    assert list(corrected(pred, hw)["time"]) == [2.0, 0.5, 1.0]
    assert corrected(pred, HwModel.load("nvidia-h100")) is pred  # no factors: unchanged


def test_factors_are_checked_and_round_trip_through_toml(tmp_path):
    with pytest.raises(HardwareModelError, match="correct_compute"):
        dataclasses.replace(HwModel.load("nvidia-h100"), correct_compute=0.0)
    hw = correction.apply(HwModel.load("nvidia-h100"), {"DRAM": 1.5})
    path = tmp_path / "m.toml"
    path.write_text(hw.to_toml())
    assert HwModel.load(str(path)).correct_dram == 1.5


def test_records_keep_pairs_and_read_old_records(tmp_path):
    rec = _record(DEV, [(1e-3, 2e-3, "compute")])
    back = TuneRecord.from_json(rec.to_json())
    assert back.pairs == rec.pairs
    old = rec.to_json()
    del old["pairs"]
    assert TuneRecord.from_json(old).pairs == ()


@needs_device
def test_tuning_records_pairs_and_a_later_compile_is_corrected(tmp_path):
    config = Config(records_path=tmp_path / "r.jsonl", hw="nvidia-h100")
    shapes = {"A": (64, 48), "B": (48, 64)}
    # Every candidate "measures" 3x its prediction.
    report = tune(MATMUL, shapes, config=config, top_k=3,
                  timer=lambda c: 3 * c.predicted if c.predicted else 1e-3)
    (k,) = report.kernels
    pairs = k.record.pairs
    assert pairs and all(m == pytest.approx(3 * p) for p, m, _ in pairs)
    records = RecordStore(config.records_path).load()
    assert records
    exe = tile_compile(MATMUL, shapes, config=config)
    factors = [exe.hw.correction(b) for b in {b for _, _, b in pairs}]
    assert all(f == pytest.approx(math.exp(len(pairs) * math.log(3) / (len(pairs) + 1)))
               for f in factors)
    # Without records the model is uncorrected.
    plain = tile_compile(MATMUL, shapes, config=dataclasses.replace(
        config, use_tuning_records=False))
    assert all(plain.hw.correction(b) == 1.0 for b in BOTTLENECKS)


@needs_device
def test_explain_shows_the_tuning_record_beside_the_search(tmp_path, monkeypatch):
    from tilec.cli.explain import explain

    monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path))
    shapes = {"A": (32, 16), "B": (16, 32)}
    tune(MATMUL, shapes, config=Config(cache_dir=tmp_path), top_k=2, timer=lambda c: 1e-3)
    text = explain(MATMUL, shapes, "float32", "auto", None, {}, 1, None)
    assert "Tuning record: [" in text and "measured 1 ms" in text
