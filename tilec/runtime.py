"""OpenCL through pyopencl: device choice, build, buffers, launches and event timing.
Every failure a user can cause becomes a `DeviceError` (or `BuildError`) that says what to do."""

from __future__ import annotations

import functools
import re
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .cache import ProgramCache
from .config import Config
from .errors import BuildError, DeviceError

NO_PLATFORM = ('no OpenCL platform was found; install the embedded CPU device with '
               '`pip install "pyopencl[pocl]"` (or a vendor OpenCL driver)')


def _cl():
    try:
        import pyopencl as cl
    except ImportError as e:  # pragma: no cover - pyopencl is a dependency
        raise DeviceError(f"pyopencl cannot be imported ({e}); {NO_PLATFORM}") from None
    return cl


@dataclass(frozen=True)
class DeviceInfo:
    platform: str
    platform_version: str
    name: str
    version: str
    driver: str
    kind: str  # "gpu", "cpu" or "other"

    @property
    def label(self) -> str:
        return f"{self.platform}: {self.name}"

    @property
    def key(self) -> tuple[str, ...]:
        """What a compiled binary depends on."""
        return (self.platform, self.platform_version, self.name, self.version, self.driver)


def all_devices() -> list:
    cl = _cl()
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        raise DeviceError(NO_PLATFORM) from None
    devices = []
    for p in platforms:
        try:
            devices += p.get_devices()
        except cl.Error:
            continue
    if not devices:
        raise DeviceError(NO_PLATFORM)
    return devices


def describe(device) -> DeviceInfo:
    cl = _cl()
    t = device.type
    kind = "gpu" if t & cl.device_type.GPU else "cpu" if t & cl.device_type.CPU else "other"
    p = device.platform
    return DeviceInfo(p.name.strip(), p.version.strip(), device.name.strip(),
                      device.version.strip(), device.driver_version.strip(), kind)


def choose_device(spec: str | None = None):
    """The device whose "platform: device" text contains `spec` (case-insensitive); without a
    spec, a GPU if there is one, else a CPU."""
    devices = all_devices()
    if spec:
        want = spec.lower()
        found = [d for d in devices if want in describe(d).label.lower()]
        if not found:
            names = "; ".join(describe(d).label for d in devices)
            raise DeviceError(f"no OpenCL device matches {spec!r} (devices: {names})")
        return found[0]
    order = sorted(devices, key=lambda d: {"gpu": 0, "cpu": 1}.get(describe(d).kind, 2))
    failures = []
    for d in order:
        if _known_good(describe(d)):
            return d
        problem = _probe(d)
        if problem is None:
            return d
        failures.append(f"{describe(d).label}: {problem}")
    raise DeviceError("no OpenCL device can build a kernel:\n  " + "\n  ".join(failures)
                      + "\n(the PyPI PoCL's LLVM 14 does not know some recent CPUs; Debian's "
                      "`apt-get install pocl-opencl-icd` provides a newer PoCL)")


_PROBE = "__kernel void tilec_probe(__global float* a) { a[get_global_id(0)] += 1.0f; }"


# Contexts the probe opened on devices that passed, handed to the Runtime that follows (a
# context costs a good part of a second on some GPU drivers).
_PROBE_CONTEXTS: dict = {}


@functools.cache
def _probe(device) -> str | None:
    """Why a device cannot build a trivial kernel (None when it can).  Some installed OpenCL
    drivers enumerate devices they cannot compile for.  A device that passes is remembered on
    disk (by platform, device and driver versions), so later processes skip the probe."""
    cl = _cl()
    try:
        ctx = cl.Context([device])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cl.Program(ctx, _PROBE).build()
    except cl.Error as e:
        lines = [ln for ln in str(e).splitlines() if "error" in ln.lower()]
        return lines[-1].strip() if lines else str(e).splitlines()[0]
    _PROBE_CONTEXTS[device] = ctx
    _remember_good(describe(device))
    return None


def _known_good_path():
    from .cache import default_cache_root

    return default_cache_root() / "devices" / "probed.json"


def _device_key(info: DeviceInfo) -> str:
    from . import memo

    return memo.digest("probe", _PROBE, *info.key)


def _known_good(info: DeviceInfo) -> bool:
    from . import memo

    found = memo.read_json(_known_good_path(), "probed")
    return isinstance(found, dict) and _device_key(info) in found


def _remember_good(info: DeviceInfo) -> None:
    from . import memo

    path = _known_good_path()
    found = memo.read_json(path, "probed")
    found = found if isinstance(found, dict) else {}
    found[_device_key(info)] = info.label
    memo.write_json(path, "probed", found)  # unwritable: probe again next time


class Runtime:
    """A context and a profiling queue on one device."""

    def __init__(self, device):
        cl = _cl()
        self.cl = cl
        self.device = device
        self.info = describe(device)
        try:
            self.context = _PROBE_CONTEXTS.pop(device, None) or cl.Context([device])
            self.queue = cl.CommandQueue(
                self.context, properties=cl.command_queue_properties.PROFILING_ENABLE)
        except cl.Error as e:
            raise DeviceError(f"cannot open {self.info.label}: {e}") from None
        self.max_alloc = int(device.max_mem_alloc_size)
        self.global_mem = int(device.global_mem_size)
        self.max_wg = int(device.max_work_group_size)
        self.driver_caches_builds = _driver_caches_builds(device)
        self._caches: dict[tuple, ProgramCache] = {}
        self._caches_lock = threading.Lock()
        self.cache = self.cache_for(None)

    @staticmethod
    @functools.cache
    def get(spec: str | None = None) -> Runtime:
        """One runtime per device spec per process (contexts are expensive)."""
        return Runtime(choose_device(spec))

    def cache_for(self, config: Config | None) -> ProgramCache:
        """The program cache with `config`'s settings (the default settings without one).
        One per distinct setting, so that a program found in memory is one that the same
        disk cache would have produced; `cache` is the default settings' one."""
        config = config or Config()
        settings = (config.cache_dir, config.use_disk_cache, config.cache_max_bytes,
                    config.disk_cache_all_drivers)
        with self._caches_lock:
            if settings not in self._caches:
                self._caches[settings] = ProgramCache.for_config(config)
            return self._caches[settings]

    def build(self, source: str, options: Sequence[str] = (), config: Config | None = None):
        """A built program, through the program cache of `config`: reused in process, loaded
        from disk, or built from source (`BuildError` with the log when the source is bad)."""
        return self.cache_for(config).program(self, source, tuple(options))

    def build_source(self, source: str, options: Sequence[str] = ()):
        """Build from source, bypassing every cache."""
        cl = self.cl
        prg = cl.Program(self.context, source)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # cache_dir=False: tilec's cache replaces pyopencl's (which would write to
                # ~/.cache/pyopencl and cannot tell a corrupt binary).
                return prg.build(options=list(options), cache_dir=False)
        except cl.RuntimeError as e:
            log = _build_log(prg, self.device) or str(e)
            raise BuildError(_explain_build(log, source)) from None

    def build_binary(self, binary: bytes, options: Sequence[str] = ()):
        """Load a binary this device produced; `BuildError` if the driver refuses it.  Only
        verified bytes may come here: drivers crash on some corrupt binaries."""
        cl = self.cl
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return cl.Program(self.context, [self.device], [binary]).build(
                    options=list(options))
        except (cl.Error, RuntimeError) as e:
            raise BuildError(f"{self.info.label} refused a program binary: {e}") from None

    def binary_of(self, program) -> bytes | None:
        """The device binary of a built program (None where the driver gives none).  Not free:
        PoCL compiles every kernel of the program again to produce it (seconds for a big one)."""
        try:
            binaries = program.get_info(self.cl.program_info.BINARIES)
        except (self.cl.Error, RuntimeError):
            return None
        return bytes(binaries[0]) if binaries and binaries[0] else None

    def max_work_group(self, kernel) -> int:
        """CL_KERNEL_WORK_GROUP_SIZE: what this kernel can be launched with on this device."""
        cl = self.cl
        try:
            return int(kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE,
                                                  self.device))
        except cl.Error:
            return self.max_wg

    def kernel(self, program, name: str):
        # cl.Kernel rather than getattr: programs are shared between executables through the
        # cache, and pyopencl warns when one program's kernel is fetched by name twice.
        return self.cl.Kernel(program, name)

    def check_sizes(self, sizes: dict[str, int]) -> None:
        """Refuse buffers the device cannot hold before anything is allocated."""
        for name, nbytes in sizes.items():
            if nbytes > self.max_alloc:
                raise DeviceError(f"tensor {name} needs {nbytes} bytes, more than one "
                                  f"allocation on {self.info.label} may hold "
                                  f"({self.max_alloc} bytes)")
        total = sum(sizes.values())
        if total > self.global_mem:
            raise DeviceError(f"the program's buffers need {total} bytes, more than the "
                              f"{self.global_mem} bytes of {self.info.label}")

    def buffer(self, nbytes: int):
        cl = self.cl
        try:
            return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, max(4, nbytes))
        except cl.Error as e:
            raise DeviceError(f"cannot allocate {nbytes} bytes on {self.info.label}: {e}") \
                from None

    def upload(self, buf, array: np.ndarray) -> None:
        self.cl.enqueue_copy(self.queue, buf, np.ascontiguousarray(array))

    def download(self, buf, shape: tuple[int, ...], dtype) -> np.ndarray:
        out = np.empty(shape, dtype=dtype)
        if out.size:
            self.cl.enqueue_copy(self.queue, out, buf)
        return out

    def fill(self, buf, value: np.ndarray, nbytes: int) -> None:
        self.cl.enqueue_fill_buffer(self.queue, buf, value, 0, nbytes)

    def launch(self, kernel, global_size: int, local_size: int | None, args: list):
        try:
            kernel.set_args(*args)
            return self.cl.enqueue_nd_range_kernel(
                self.queue, kernel, (global_size,), None if local_size is None
                else (local_size,))
        except self.cl.Error as e:
            raise DeviceError(f"launching {kernel.function_name} (global {global_size}, "
                              f"local {local_size}) failed on {self.info.label}: {e}") from None

    def finish(self) -> None:
        self.queue.finish()


def _driver_caches_builds(device) -> bool:
    """Whether the driver keeps built programs across processes by itself (pyopencl's list:
    PoCL and NVIDIA's do)."""
    try:
        from pyopencl.characterize import has_src_build_cache

        return has_src_build_cache(device) is True
    except Exception:  # noqa: BLE001 - unknown means no: tilec's cache then does the work
        return False


def event_seconds(event) -> float:
    event.wait()
    return (event.profile.end - event.profile.start) * 1e-9


def _build_log(prg, device) -> str:
    try:
        return prg.get_build_info(device, _cl().program_build_info.LOG) or ""
    except Exception:  # noqa: BLE001 - a log we cannot read is simply absent
        return ""


def _explain_build(log: str, source: str) -> str:
    """The build log, and the generated line it complains about."""
    lines = source.splitlines()
    m = re.search(r":(\d+):(\d+):\s*error", log) or re.search(r"line (\d+)", log)
    where = ""
    if m:
        n = int(m.group(1))
        if 1 <= n <= len(lines):
            where = f"\ngenerated line {n}:\n    {lines[n - 1].strip()}"
    log = log.strip()
    if len(log) > 4000:
        log = log[:4000] + "\n..."
    return f"the OpenCL compiler rejected a generated kernel:\n{log}{where}"
