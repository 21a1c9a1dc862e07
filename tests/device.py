"""Whether an OpenCL device that can build kernels is here: tests that run kernels skip
without one (tests/grind_pytest.py finds them by this marker's reason)."""

from __future__ import annotations

import pytest

from tilec.errors import DeviceError


def _have_device() -> bool:
    from tilec.runtime.device import choose_device

    try:
        choose_device()
    except DeviceError:
        return False
    return True


HAVE_DEVICE = _have_device()
needs_device = pytest.mark.skipif(not HAVE_DEVICE, reason="no usable OpenCL device")
