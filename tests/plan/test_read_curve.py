"""The calibrated read curve (`plan/read_curve.py`): its record, its TOML form, the rules the
calibration applies to it and how the CPU time model reads a kernel's tensors at it.
Device-free: synthetic curves and hardware models."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tilec.errors import HardwareModelError, TileError
from tilec.plan.calibration import Calibration
from tilec.plan.cost import score_many
from tilec.plan.hw import HwModel
from tilec.plan.predict import predict_many
from tilec.plan.read_curve import ladder, non_increasing, normal_curve, rate_at

from ..flats import matmul_flat

MIB = 1 << 20
# The GPU host's Xeon as measured (16 cores; its DRAM 124 GB/s, its L3 well short of the
# 300 MiB it reports).
XEON = ((64.0, 430.0), (128.0, 250.0), (256.0, 128.0), (512.0, 124.0))
CPU = dataclasses.replace(HwModel.load("pocl-cpu"), name="measured-cpu", peak_gflops=1500.0,
                          bandwidth_gbs=124.0, l1_gbs=1700.0, l2_gbs=670.0, launch_us=5.0,
                          group_us=0.01, compute_units=16, muladd_vec=16, vec_size=16,
                          registers=32, max_regs=2048)


def cal(**kw) -> Calibration:
    base = dict(muladd="mul_add", muladd_vec=8, peak_gflops=232.0, dram_gbs=31.0, l2_gbs=200.0,
                l1_gbs=370.0, local_gbs=360.0, launch_us=0.7, launch_wall_us=35.0,
                group_us=0.007, form_gflops=(("mul_add", 8, 232.0),), seconds=1.2, label="x")
    return Calibration(**(base | kw))


def test_rate_interpolates_in_log_size_and_holds_at_the_ends():
    assert rate_at(XEON, 16 * MIB) == 430.0  # below the first point: its rate
    assert rate_at(XEON, 64 * MIB) == 430.0
    assert rate_at(XEON, 128 * MIB) == pytest.approx(250.0)
    mid = rate_at(XEON, 90.5 * MIB)  # halfway between 64 and 128 in log size
    assert mid == pytest.approx((430.0 * 250.0) ** 0.5, rel=1e-3)
    assert rate_at(XEON, 4096 * MIB) == 124.0  # past the last: DRAM
    sizes = [2**k * MIB for k in range(0, 12)]
    rates = [rate_at(XEON, s) for s in sizes]
    assert rates == sorted(rates, reverse=True)


def test_ladder_doubles_from_twice_the_aggregate_l2_to_the_dram_buffer():
    assert ladder(32 * MIB, 512 * MIB) == [64 * MIB, 128 * MIB, 256 * MIB, 512 * MIB]
    assert ladder(1 * MIB, 128 * MIB) == [2**k * MIB for k in range(1, 8)]
    assert ladder(0, 64 * MIB)[0] == 1 * MIB  # no L2 size known: from 1 MiB
    assert ladder(300 * MIB, 512 * MIB) == [512 * MIB]  # the DRAM read alone


def test_measured_points_are_made_non_increasing():
    # A point measured in one of the host's slow phases pools with the ones after it.
    got = non_increasing(((2, 74.0), (4, 66.0), (8, 102.0), (16, 85.0), (32, 26.0)))
    rates = [g for _, g in got]
    assert rates == sorted(rates, reverse=True)
    assert [m for m, _ in got] == [2, 4, 8, 16, 32]
    assert rates[-1] == 26.0 and rates[0] == pytest.approx((74 * 66 * 102 * 85) ** 0.25, rel=0.01)
    assert non_increasing(XEON) == XEON  # already non-increasing: unchanged


def test_curve_normalised_and_bad_points_refused():
    assert normal_curve({"64": 430, "32": 570.5}) == ((32.0, 570.5), (64.0, 430.0))
    for bad in ({"32": 0}, {"-1": 10}, {"x": 10}, [(32, 1.0), (32, 2.0)]):
        with pytest.raises(ValueError):
            normal_curve(bad)


def test_calibration_record_round_trips_and_sets_the_model():
    c = cal(read_gbs=XEON)
    assert Calibration.from_json(c.to_json()) == c
    model = dataclasses.replace(HwModel.load("pocl-cpu"), **c.model_fields())
    assert model.read_gbs == XEON
    assert "reads by working set 64 MiB 430" in model.describe()
    assert "reads by working set: 64 MiB 430" in c.describe()
    old = c.to_json()
    del old["read_gbs"]  # a record of an older calibration
    assert Calibration.from_json(old).read_gbs == ()


def test_toml_round_trip_and_located_errors():
    model = dataclasses.replace(CPU, read_gbs=XEON)
    text = model.to_toml()
    assert 'read_gbs = { "64" = 430.0' in text
    assert HwModel.loads(text, "board.toml") == model
    for value, words in (('{ 64 = -5.0 }', "must be positive"),
                         ('[64, 430.0]', "expected a table of MiB = GB/s"),
                         ('{ 64 = "fast" }', "could not convert")):
        bad = text.replace(text.split("\n")[[i for i, line in enumerate(text.split("\n"))
                                            if line.startswith("read_gbs")][0]],
                           f"read_gbs = {value}")
        with pytest.raises(HardwareModelError) as info:
            HwModel.loads(bad, "hwmodels/board.toml")
        assert isinstance(info.value, TileError)
        message = str(info.value)
        assert "hwmodels/board.toml" in message and "'read_gbs'" in message
        assert words in message


def _dram_s(flat, tiles, hw):
    T = np.asarray(tiles, np.int64)
    return predict_many(flat, T, hw, score_many(flat, T, hw))["dram_s"]


def test_a_kernels_tensors_are_read_at_the_rate_of_their_size():
    """Without a curve a 48 MiB working set comes from DRAM (the model's 16 MiB rule); with the
    Xeon's curve it comes at the rate measured for 48 MiB, and a 1 GiB one at DRAM's."""
    mid = matmul_flat(1, 1024, 12288)  # a 48 MiB weight read once: a matrix-vector product
    big = matmul_flat(1, 8192, 32768)  # 1 GiB
    tile = [[256, 1, 64]]
    plain = _dram_s(mid, tile, CPU)[0]
    curved = _dram_s(mid, tile, dataclasses.replace(CPU, read_gbs=XEON))[0]
    assert plain / curved == pytest.approx(430.0 / 124.0, rel=0.05)
    assert _dram_s(big, tile, dataclasses.replace(CPU, read_gbs=XEON))[0] == \
        pytest.approx(_dram_s(big, tile, CPU)[0], rel=0.02)


def test_the_cost_line_names_the_rate_the_tensors_were_read_at():
    from tilec.plan.predict import explain_line
    flat = matmul_flat(1, 1024, 12288)
    T = np.asarray([[256, 1, 64]], np.int64)
    hw = dataclasses.replace(CPU, read_gbs=XEON)
    pred = predict_many(flat, T, hw, score_many(flat, T, hw))
    assert "at 430 GB/s" in explain_line(pred, 0)
    pred = predict_many(flat, T, CPU, score_many(flat, T, CPU))
    assert "at 124 GB/s" in explain_line(pred, 0)  # 48 MiB past the 16 MiB rule: DRAM
