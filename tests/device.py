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


def _cpu_info():
    """The first CPU device's description (`runtime.device.DeviceInfo`), where there is one."""
    from tilec.runtime.device import all_devices, describe

    try:
        for d in all_devices():
            if describe(d).kind == "cpu":
                return describe(d)
    except DeviceError:
        pass
    return None


HAVE_DEVICE = _have_device()
# Where CPU-model kernels run (prefetch builtins, the calibration's vector forms, sweeps):
# a CPU device also on a host whose default device is a GPU (None: the default device).
_info = _cpu_info()
CPU = _info.label if _info is not None else None
# Debian's PoCL 5.0 (LLVM 16) combines some GPU-model split reductions that stage their inputs
# wrong on a CPU device, and right with -cl-opt-disable (BENCHMARKS.md, thirty-eighth session).
POCL5_CPU = _info is not None and "PoCL 5." in _info.platform_version
needs_device = pytest.mark.skipif(not HAVE_DEVICE, reason="no usable OpenCL device")
