"""A few kernels under oclgrind: no invalid access, no data race, no uninitialised read.

Skipped unless oclgrind is installed in its own venv (`python benchmarks/oclgrind_check.py`
creates it and runs every kernel of the corpus; see tests/grind.py).  CI need not have it; where
it does, these take well under a minute."""

from __future__ import annotations

import pytest

from . import grind

ICD = grind.find_icd()
pytestmark = pytest.mark.skipif(ICD is None, reason=f"oclgrind is not installed in "
                                f"{grind.DEFAULT_VENV} (benchmarks/oclgrind_check.py installs it)")

# Local staging with barriers, vector code, an init kernel before a strided output, output
# constraints, a chain of four kernels, and partial forced tiles.
SUBSET = ["conv_same_relu/nvidia-h100", "matmul_odd/pocl-cpu", "strided_output/seed-example",
          "out_constraint/nvidia-h100", "softmax/pocl-cpu", "conv_same_relu/tile1/seed-example"]


@pytest.mark.parametrize("mode", grind.MODES)
def test_oclgrind_reports_the_canarys_faults(mode):
    assert ICD is not None
    o = grind.run_canary(ICD, mode)
    assert grind.CANARY_FINDS[mode] <= set(o.findings), (o.reports, o.error)


@pytest.mark.parametrize("mode", grind.MODES)
@pytest.mark.parametrize("name", SUBSET)
def test_kernels_are_clean_under_oclgrind(name, mode):
    assert ICD is not None
    jobs = {j.name: j for j in grind.corpus()}
    o = grind.run_job(jobs[name], ICD, mode, timeout=60)
    assert o.valid, o.error
    assert o.clean, (o.error, {k: v for k, v in o.first.items() if k not in grind.BENIGN})
