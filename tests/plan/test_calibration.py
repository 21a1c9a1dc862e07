"""The calibration's record and rules (plan/calibration.py) and the hardware model's measured
fields, device-free: synthetic timings, TOML round trips, bad input."""

from __future__ import annotations

import dataclasses

import pytest

from tilec.errors import HardwareModelError, TileError
from tilec.plan.calibration import (
    FORM_MARGIN,
    Calibration,
    choose_access,
    choose_form,
    form_table,
)
from tilec.plan.hw import HwModel


def rounds_of(rates: dict[str, dict[int, float]], scales=(1.0, 0.5, 1.0)):
    """Rounds in which the whole machine runs at `scale` of its speed (a busy host)."""
    return [{(f, w): r * s for f, by_w in rates.items() for w, r in by_w.items()}
            for s in scales]


def cal(**kw) -> Calibration:
    base = dict(muladd="mul_add", muladd_vec=8, peak_gflops=232.0, dram_gbs=31.0, l2_gbs=200.0,
                l1_gbs=370.0, local_gbs=360.0, launch_us=0.7, launch_wall_us=35.0,
                group_us=0.007, form_gflops=(("fma", 8, 25.0), ("mul_add", 8, 232.0)),
                seconds=1.2, label="PoCL: cpu")
    return Calibration(**(base | kw))


def test_fma_called_as_a_function_loses_to_the_plain_expression():
    # The PyPI PoCL 3.0 on Zen 4: fma() and mad() are calls, a*b+c an instruction.
    rates = {"fma": {1: 3, 2: 6, 4: 13, 8: 25}, "mad": {1: 3, 2: 6, 4: 13, 8: 25},
             "mul_add": {1: 29, 2: 58, 4: 116, 8: 232}}
    form, width, peak = choose_form(rounds_of(rates))
    assert (form, width, peak) == ("mul_add", 8, 232)


def test_vload_called_as_a_function_loses_to_the_plain_pointer():
    # The PyPI PoCL 3.0 on an Intel Xeon (rocketlake target): vload16 is a call.  Rounds on a
    # busy host scale both forms alike; the ratio decides.
    assert choose_access([(113.0, 437.0), (56.0, 220.0), (110.0, 430.0)]) == "plain"
    # Inlined vloadN (Debian's PoCL 3.1, PoCL 5.0): a tie, or either form a bit ahead, takes
    # the plain form, which PoCL generates code for faster.
    assert choose_access([(230.0, 232.0), (115.0, 110.0), (231.0, 231.0)]) == "plain"
    assert choose_access([(100 * FORM_MARGIN * 0.99, 100.0)] * 3) == "plain"
    # vloadN faster by the margin in every round, and only then, keeps vloadN.
    assert choose_access([(100 * FORM_MARGIN, 100.0)] * 3) == "vload"
    assert choose_access([(232.0, 50.0), (232.0, 60.0), (230.0, 231.0)]) == "plain"
    with pytest.raises(ValueError):
        choose_access([])


def test_vector_access_reaches_the_codegen():
    from tilec.codegen.contraction import plain_vector_access

    cpu = HwModel.load("pocl-cpu")
    wide = dataclasses.replace(cpu, vec_size=16)
    assert plain_vector_access(wide)  # unmeasured: the plain form on every CPU
    assert plain_vector_access(dataclasses.replace(cpu, vec_size=8))
    assert not plain_vector_access(dataclasses.replace(wide, vector_access="vload"))
    applied = dataclasses.replace(wide, **cal(vector_access="plain").model_fields())
    assert applied.vector_access == "plain" and plain_vector_access(applied)
    assert not plain_vector_access(dataclasses.replace(cpu, vec_size=8, vector_access="vload"))
    gpu = HwModel.load("nvidia-h100")
    assert not plain_vector_access(dataclasses.replace(gpu, vector_access="plain"))
    with pytest.raises(HardwareModelError, match="vector_access"):
        dataclasses.replace(cpu, vector_access="pointer")
    with pytest.raises(ValueError, match="vector access"):
        cal(vector_access="pointer")
    back = Calibration.from_json(cal(vector_access="plain", access_gflops=(113, 437)).to_json())
    assert back.vector_access == "plain" and back.access_gflops == (113.0, 437.0)
    assert "vector access: plain (vloadN 113, plain pointer 437" in back.describe()


def test_equal_forms_keep_fma_and_the_narrowest_full_speed_width():
    # Debian's PoCL 3.1: fma inlined, mad a separate multiply and add; AVX-512 on Zen 4 is
    # double-pumped, so 16 lanes are no faster than 8.
    rates = {"fma": {1: 29, 4: 113, 8: 230, 16: 231}, "mad": {8: 130, 16: 182},
             "mul_add": {8: 232, 16: 236}}
    form, width, peak = choose_form(rounds_of(rates))
    assert (form, width, peak) == ("fma", 8, 230)


def test_a_form_must_win_by_the_margin():
    just_under = {"fma": {4: 100.0}, "mul_add": {4: 100.0 * FORM_MARGIN * 0.99}}
    assert choose_form(rounds_of(just_under))[0] == "fma"
    over = {"fma": {4: 100.0}, "mul_add": {4: 100.0 * FORM_MARGIN * 1.01}}
    assert choose_form(rounds_of(over))[0] == "mul_add"


def test_forms_compared_within_rounds_not_across_them():
    # In one round the host sped up between fma's launch and mul_add's: by medians of rates
    # mul_add would look 2x faster in that round; the median of within-round ratios is 1.
    rounds = [{("fma", 8): 116, ("mul_add", 8): 116}, {("fma", 8): 116, ("mul_add", 8): 116},
              {("fma", 8): 230, ("mul_add", 8): 230}]
    rounds[1][("mul_add", 8)] = 232
    assert choose_form(rounds)[0] == "fma"


def test_form_table_and_no_timings():
    rates = {"mad": {1: 2.0}, "fma": {2: 4.0, 1: 1.0}}
    assert form_table(rounds_of(rates, (1.0, 1.0))) == (
        ("fma", 1, 1.0), ("fma", 2, 4.0), ("mad", 1, 2.0))
    with pytest.raises(ValueError):
        choose_form([])


def test_calibration_json_round_trip_and_bad_records():
    c = cal()
    assert Calibration.from_json(c.to_json()) == c
    for bad in (None, [], {"muladd": "fma"}, c.to_json() | {"muladd": "fmaa"},
                c.to_json() | {"peak_gflops": "fast"}, c.to_json() | {"extra": 1}):
        with pytest.raises(ValueError):
            Calibration.from_json(bad)


def test_calibration_sets_the_model_fields():
    model = HwModel.load("pocl-cpu")
    measured = dataclasses.replace(model, **cal().model_fields())
    assert (measured.muladd, measured.muladd_vec, measured.peak_gflops,
            measured.bandwidth_gbs, measured.l1_gbs, measured.launch_us) == (
        "mul_add", 8, 232.0, 31.0, 370.0, 0.7)
    assert "mul-add mul_add" in measured.describe()
    assert "launch 0.7 us" in measured.describe()


def test_default_model_is_unchanged():
    model = HwModel.load("pocl-cpu")
    assert model.muladd == "fma" and model.muladd_vec == 0 and model.l1_gbs == 0.0
    assert "muladd" not in model.to_toml()  # defaults are not written


def test_toml_round_trip_of_every_measured_field():
    model = dataclasses.replace(HwModel.load("pocl-cpu"), muladd="mad", muladd_vec=4,
                                peak_gflops=230.5, bandwidth_gbs=31, l1_gbs=370.25,
                                l2_gbs=200, local_gbs=360, launch_us=0.7, group_us=0.007)
    text = model.to_toml()
    assert 'muladd = "mad"' in text and "group_us = 0.007" in text
    assert HwModel.loads(text, "board.toml") == model


@pytest.mark.parametrize("key, value, words", [
    ("muladd", '"fmaa"', "must be one of 'fma', 'mad', 'mul_add'"),
    ("muladd", "1", "expected a string"),
    ("muladd_vec", "3", "must be 0 (unknown) or one of"),
    ("l1_gbs", "-1.0", "must not be negative"),
    ("launch_us", '"fast"', "expected a number"),
])
def test_bad_measured_field_names_file_and_key(key, value, words):
    text = HwModel.load("pocl-cpu").to_toml().replace("[elem_bytes]",
                                                      f"{key} = {value}\n\n[elem_bytes]")
    with pytest.raises(HardwareModelError) as info:
        HwModel.loads(text, "hwmodels/board.toml")
    assert isinstance(info.value, TileError)
    message = str(info.value)
    assert "hwmodels/board.toml" in message and repr(key) in message and words in message


def test_exp_rate_round_trips_and_older_records_stay_whole():
    c = cal(exp_gops=6.7)
    assert Calibration.from_json(c.to_json()) == c
    assert c.model_fields()["exp_gops"] == 6.7
    old = c.to_json()
    del old["exp_gops"]  # stored before exp() was measured
    assert Calibration.from_json(old).exp_gops == 0.0


def test_a_measured_exp_rate_prices_the_row_kernels_exp():
    import dataclasses

    from tilec.lang.api import check_program
    from tilec.plan.fuse import plan_kernels
    from tilec.plan.row_shape import RowShape, predict
    from tilec.plan.rows import RowKernel

    from .test_rows import SOFTMAX

    plan = plan_kernels(check_program(SOFTMAX, {"I": (4096, 1000)}, "float32"), rows=True)
    k = next(k for k in plan.kernels if isinstance(k, RowKernel))
    hw = HwModel.load("pocl-cpu")
    shape = RowShape(1, 16, hw.vec_size)
    slow = predict(k, plan.program, dataclasses.replace(hw, exp_gops=0.5), shape)
    fast = predict(k, plan.program, dataclasses.replace(hw, exp_gops=50.0), shape)
    assert slow.predicted_s > 2 * fast.predicted_s


def test_start_cost_round_trips_reaches_the_model_and_a_toml():
    c = cal(start_us=22.5)
    assert Calibration.from_json(c.to_json()) == c
    old = c.to_json()
    del old["start_us"]  # stored before the start of every core was measured
    assert Calibration.from_json(old).start_us == 0.0
    model = dataclasses.replace(HwModel.load("pocl-cpu"), **c.model_fields())
    assert model.start_us == 22.5 and "every core at work after 22.5 us" in model.describe()
    assert HwModel.loads(model.to_toml(), "board.toml") == model
