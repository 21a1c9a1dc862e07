"""Every PlaidML 0.7.0 op-library Tile program (tests/plaidml/corpus.py) against its numpy
oracle: through tilec.evaluate, and compiled and run on the CPU OpenCL device.

Cases that use Tile features tilec does not have yet are listed in known_failures.txt with
their error and run as strict xfails: the list is the to-do list, and a case that starts passing
fails until it is taken off (`python -m tests.plaidml.report --write-known` rewrites it).
`python -m tests.plaidml.report` prints the per-case status and a tally.
"""

from __future__ import annotations

import pytest

from .corpus import CASES
from .report import check_compiled, check_evaluate, read_known

_KNOWN = read_known()


def _have_opencl() -> bool:
    try:
        import pyopencl as cl

        return any(p.get_devices() for p in cl.get_platforms())
    except Exception:  # noqa: BLE001 - no OpenCL at all
        return False


_IDS = [c.name for c in CASES]


def _params(stage: str) -> list:
    return [pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=_KNOWN[(c.name, stage)]))
            if (c.name, stage) in _KNOWN else c for c in CASES]


@pytest.mark.parametrize("case", _params("evaluate"), ids=_IDS)
def test_evaluate(case):
    check_evaluate(case)


@pytest.mark.device
@pytest.mark.skipif(not _have_opencl(), reason="no usable OpenCL device")
@pytest.mark.parametrize("case", _params("compiled"), ids=_IDS)
def test_compiled(case):
    check_compiled(case)
