"""CPU kernels planned by the time model (`predict_cpu`: pocl-cpu has a peak and a bandwidth)
run with poisoned outputs and match the numpy reference."""

from __future__ import annotations

import pytest

from tilec.plan.hw import HwModel
from tilec.plan.predict import can_predict

from ..device import needs_device
from ..kernel_cases import CASES
from .test_kernels import run_case

pytestmark = needs_device


@pytest.mark.parametrize("name", ["matmul_odd", "conv_same_relu", "maxpool", "depthwise",
                                  "conv_strided", "softmax"])
def test_cpu_time_model_kernels_validate(name):
    assert can_predict(HwModel.load("pocl-cpu"))
    src, shapes = CASES[name]
    run_case(src, shapes, hw="pocl-cpu", cost_model="time", seed=2)
