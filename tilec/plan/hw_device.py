"""Deriving a hardware model from an OpenCL device's queries (`from_device`), with
the documented defaults for what OpenCL cannot tell (hwmodels/README.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import DeviceError
from .hw import HwModel, _floor_pow2, _is_pow2, register_tile_for

# OpenCL spec constants, so that deriving a model needs no pyopencl import.
_CL_DEVICE_TYPE_CPU = 1 << 1
_CL_LOCAL_MEM_GLOBAL = 2


def _query(device: Any, attr: str, default: Any) -> Any:
    try:
        value = getattr(device, attr)
    except Exception:  # pyopencl raises its own error types for a query the driver lacks
        return default
    return default if value is None else value


def from_device(device: Any, max_vec: int | None = None) -> HwModel:
    """A model from an OpenCL device's queries, with tilec's defaults for what OpenCL does not
    tell (rules in hwmodels/README.md).  Any object with pyopencl.Device's attribute names will
    do; a query that fails counts as unknown.  `max_vec` caps the vector width (the widest the
    device was seen to compute correctly)."""
    return derive(device, max_vec)


def auto(device: Any = None) -> HwModel:
    """`from_device(device)`; with no device, the first GPU, else the first OpenCL device."""
    return from_device(device if device is not None else default_device())


def derive(device: Any, max_vec: int | None = None) -> HwModel:
    name = str(_query(device, "name", "")).strip()
    platform = _query(device, "platform", None)
    pname = str(_query(platform, "name", "")).strip() if platform is not None else ""
    # The version string tells pip's PoCL from a distribution's (they share a platform name).
    pver = str(_query(platform, "version", "")) if platform is not None else ""
    pver = " ".join(pver.split(",")[0].split())
    cus = max(1, int(_query(device, "max_compute_units", 1)))
    wg = int(_query(device, "max_work_group_size", 0))
    local = int(_query(device, "local_mem_size", 0))
    line = int(_query(device, "global_mem_cacheline_size", 0))
    cache = int(_query(device, "global_mem_cache_size", 0))
    native = int(_query(device, "preferred_vector_width_float", 1))
    pref = min(native, max_vec) if max_vec else native
    is_cpu = bool(int(_query(device, "type", 0)) & _CL_DEVICE_TYPE_CPU)
    emulated_local = int(_query(device, "local_mem_type", 1)) == _CL_LOCAL_MEM_GLOBAL
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"
    common: dict[str, Any] = dict(
        name=f"device:{slug}", mem_width=line if _is_pow2(line) else 64,
        goal_groups=4 * cus, device_name=name, compute_units=cus,
        clock_mhz=int(_query(device, "max_clock_frequency", 0)), max_work_group_size=wg,
        local_mem_bytes=local,
        source=f"OpenCL queries of {name!r} on {pname} {pver}".strip()
        + (f"; vectors capped at {max_vec} (wider ones computed wrongly)"
           if max_vec and max_vec < native else "")
        + "; tilec defaults for the rest (hwmodels/README.md)",
    )
    if is_cpu:
        vec = _clamp_vec(pref)
        text = f"{name} {_query(device, 'version', '')}".lower()
        # 32 registers where kernels get 16-wide vectors (AVX-512).  The probe's cap counts:
        # the PyPI PoCL reports 16 on a Zen 4 but compiles kernels for znver3 (AVX2, 16 ymm
        # registers); a 32-register tile there spilled its accumulators (matmul 1.5x slower).
        registers = 32 if _clamp_vec(pref) >= 16 or "aarch64" in text or "arm" in text else 16
        l1, l2 = _host_caches()
        l1 = l1 or 32 * 1024
        l2 = l2 or (min(cache, 1 << 20) if cache > l1 else 1 << 20)
        mr, nr = register_tile_for(registers, vec)
        return HwModel(
            kind="cpu", threads=1, max_mem=l1, max_regs=registers * vec * 4,
            goal_flops_per_byte=round(2 * mr * nr / ((mr + nr) * 4), 2), staging="global",
            vec_size=vec, registers=registers, l1_bytes=l1, l2_bytes=l2, **common,
        )
    threads = _floor_pow2(min(256, wg)) if wg > 0 else 256
    return HwModel(
        kind="gpu", threads=threads, max_mem=local // 2 if local > 1 else 16384,
        # 64 fp32 accumulators a thread on desktop-class GPUs (measured on an H200: 64x1 beat
        # the 16 a thread of PlaidML's generic setting by 1.4x on a 4096 matmul); 16 on small
        # GPUs, whose register files are a fraction of the size.
        max_regs=threads * 64 * 4 if cus >= 16 else 16384, goal_flops_per_byte=50.0,
        staging="global" if emulated_local or local == 0 else "local",
        vec_size=min(max(4, _clamp_vec(pref)), _clamp_vec(max_vec or 16)), l2_bytes=cache,
        # NVIDIA's L2 serves 32-byte sectors of its 128-byte line (the CUDA guide's global
        # memory accesses; OpenCL reports only the line); other vendors' are not known here.
        sector_bytes=32 if "nvidia" in pname.lower() else 0,
        **common,
    )


def _host_caches() -> tuple[int, int]:
    """(L1 data, L2) bytes of this machine's first core from Linux sysfs; 0 where unknown.
    A CPU OpenCL device (PoCL's pthread device) is the host CPU, and OpenCL reports only the
    last-level cache."""
    l1 = l2 = 0
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for index in base.glob("index*"):
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = _parse_size((index / "size").read_text().strip())
            if level == "1" and kind == "Data":
                l1 = size
            elif level == "2" and kind in ("Unified", "Data"):
                l2 = size
    except (OSError, ValueError):
        return 0, 0
    return l1, l2


def default_device() -> Any:
    try:
        import pyopencl as cl
    except ImportError as exc:
        raise DeviceError(
            f"pyopencl is not installed ({exc}); pip install 'pyopencl[pocl]'"
        ) from None
    try:
        devices = [d for p in cl.get_platforms() for d in p.get_devices()]
    except Exception as exc:  # PLATFORM_NOT_FOUND_KHR arrives as a pyopencl error type
        raise DeviceError(
            f"no OpenCL platform ({exc}); pip install 'pyopencl[pocl]' brings a CPU device"
        ) from None
    if not devices:
        raise DeviceError("no OpenCL device found; pip install 'pyopencl[pocl]' brings one")
    gpus = [d for d in devices if not int(d.type) & _CL_DEVICE_TYPE_CPU]
    return (gpus or devices)[0]


# -- small helpers -----------------------------------------------------------------------------

def _clamp_vec(n: int) -> int:
    return _floor_pow2(min(16, max(1, n)))


def _parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


