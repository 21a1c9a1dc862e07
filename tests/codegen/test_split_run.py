"""A split reduction that reads the run input through the cache (`schedule.read_once`) reads
its points plainly: the run (a vector read from the input's local tile) goes with the tile."""

from __future__ import annotations

import pytest

from tilec.codegen.generate import generate
from tilec.config import Config
from tilec.lang.api import check_program
from tilec.plan.fuse import plan_kernels
from tilec.plan.hw import HwModel

from ..device import needs_device
from ..plan.test_placement import run_case

TEXT = "function (A[1, 1], W[2, 4, 4]) -> (B) {\n  B[i] = +(A[j, l] * W[k, i, i]);\n}\n"
SHAPES = {"A": (1, 1), "W": (2, 4, 4)}
FORCED = dict(hw="adreno-640", threads=1, split_reduction=True,
              tiles={"contract_B": {"i": 4, "k": 2}})


def test_the_kernel_text_is_generated():
    plan = plan_kernels(check_program(TEXT, SHAPES, "float32"))
    (src,) = generate(plan, HwModel.load("adreno-640"),
                      Config(use_disk_cache=False, **FORCED))[0]
    assert "void contract_B(" in src.text


@needs_device
@pytest.mark.parametrize("split", [True, 2])
def test_against_numpy(split):
    run_case(TEXT, SHAPES, use_disk_cache=False, **{**FORCED, "split_reduction": split})
