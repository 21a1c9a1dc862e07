"""A few kernels under oclgrind: no invalid access, no data race, no uninitialised read.

Skipped unless oclgrind is installed in its own venv (`python benchmarks/oclgrind_check.py`
creates it and runs every kernel of the corpus; see tests/grind.py).  CI need not have it; where
it does, these take well under a minute."""

from __future__ import annotations

import importlib.util

import pytest

from .. import grind

ICD = grind.find_icd()
pytestmark = pytest.mark.skipif(ICD is None, reason=f"oclgrind is not installed in "
                                f"{grind.DEFAULT_VENV} (benchmarks/oclgrind_check.py installs it)")

# Local staging with barriers, vector code, an init kernel before a strided output, output
# constraints, a chain of four kernels, and partial forced tiles.
SUBSET = ["conv_same_relu/nvidia-h100", "matmul_odd/pocl-cpu", "strided_output/seed-example",
          "out_constraint/nvidia-h100", "softmax/pocl-cpu", "conv_same_relu/tile1/seed-example"]

# Batches of tests (tests/grind_pytest.py): a grouped convolution from the graph builder; two
# ONNX node cases in one process, the second reusing the first's released buffer slots (what
# oclgrind's uninitialised-value plugin misreports without the worker's workaround).
TEST_JOBS = {
    "graph/conv2d_groups": ("tests/graph/test_graph.py::test_conv2d[NCHW-groups]",),
    "onnx/conv_then_softmax": (
        "tests/onnx/test_onnx.py::test_node_case[test_conv_with_strides_padding]",
        "tests/onnx/test_onnx.py::test_node_case[test_softmax_axis_0]"),
}


@pytest.mark.parametrize("mode", grind.MODES)
def test_oclgrind_reports_the_canarys_faults(mode):
    assert ICD is not None
    o = grind.run_canary(ICD, mode)
    assert grind.CANARY_FINDS[mode] <= set(o.findings), (o.reports, o.error)


def test_oclgrind_misreports_a_reused_buffer_slot():
    """Why a batch of tests keeps every buffer until its process ends (grind.STALE_SHADOW)."""
    assert ICD is not None
    released = grind.run_canary(ICD, "uninit", worker="stale-released")
    kept = grind.run_canary(ICD, "uninit", worker="stale-kept")
    assert released.valid and kept.valid, (released.error, kept.error)
    assert released.findings == {"uninitialised": 51}, released.reports  # elements 9 to 59
    assert kept.clean, kept.reports


@pytest.mark.parametrize("mode", grind.MODES)
@pytest.mark.parametrize("name", SUBSET)
def test_kernels_are_clean_under_oclgrind(name, mode):
    assert ICD is not None
    jobs = {j.name: j for j in grind.corpus()}
    o = grind.run_job(jobs[name], ICD, mode, timeout=60)
    assert o.valid, o.error
    assert o.clean, (o.error, {k: v for k, v in o.first.items() if k not in grind.BENIGN})


@pytest.mark.parametrize("mode", grind.MODES)
@pytest.mark.parametrize("name", sorted(TEST_JOBS))
def test_graph_and_onnx_tests_are_clean_under_oclgrind(name, mode):
    assert ICD is not None
    if name.startswith("onnx/") and importlib.util.find_spec("onnx") is None:
        pytest.skip("the onnx package is not installed")
    o = grind.run_job(grind.Job(name, "", {}, tests=TEST_JOBS[name]), ICD, mode, timeout=120)
    assert o.valid, o.error
    assert o.tests["passed"] == len(TEST_JOBS[name]) and o.kernels, (o.tests, o.kernels)
    assert o.clean, (o.error, {k: v for k, v in o.first.items() if k not in grind.BENIGN})
