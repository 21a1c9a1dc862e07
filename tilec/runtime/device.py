"""OpenCL through pyopencl: device choice, build, buffers, launches and event timing.
Every failure a user can cause becomes a `DeviceError` (or `BuildError`) that says what to do."""

from __future__ import annotations

import functools
import os
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..config import Config
from ..errors import BuildError, DeviceError
from .build_log import build_log, explain_build
from .cache import ProgramCache

NO_PLATFORM = ('no OpenCL platform was found; install the embedded CPU device with '
               '`pip install "pyopencl[pocl]"` (or a vendor OpenCL driver)')


def _cl():
    _pin_pool_threads()
    try:
        import pyopencl as cl
    except ImportError as e:  # pragma: no cover - pyopencl is a dependency
        raise DeviceError(f"pyopencl cannot be imported ({e}); {NO_PLATFORM}") from None
    return cl


def _pin_pool_threads() -> None:
    """Ask PoCL to keep each thread of its CPU pool on a CPU of its own (POCL_AFFINITY=1),
    before the driver starts, where the user has not said otherwise and the process may run
    on every CPU (PoCL pins thread i to CPU i).  Phase launches (`codegen.phases`) make the
    pool's threads meet at barriers: two threads that the system wakes onto one core wait a
    time slice for each other.  Pinned, the first ten calls of a new process took 2-15x less
    time on a 2-core Zen 4 and a 16-core Xeon, and the calls after an idle pause up to 2.3x
    less; later calls 0.85-1.08x (BENCHMARKS.md).  POCL_AFFINITY=0 keeps PoCL's default."""
    if "POCL_AFFINITY" in os.environ:
        return
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):  # not Linux: PoCL's default
        return
    if allowed == set(range(os.cpu_count() or 0)):
        os.environ["POCL_AFFINITY"] = "1"


@dataclass(frozen=True)
class DeviceInfo:
    platform: str
    platform_version: str
    name: str
    version: str
    driver: str
    kind: str  # "gpu", "cpu" or "other"
    compute_units: int = 0  # as reported now (PoCL's CPU driver: POCL_CPU_MAX_CU_COUNT)

    @property
    def label(self) -> str:
        return f"{self.platform}: {self.name}"

    @property
    def key(self) -> tuple[str, ...]:
        """What a compiled binary depends on."""
        return (self.platform, self.platform_version, self.name, self.version, self.driver)

    @property
    def facts_key(self) -> tuple[str, ...]:
        """What measured facts and the tiles chosen from them depend on: the binary's key and
        the compute units (a 16-thread PoCL's peak, launch cost and best tile are not 8's)."""
        return (*self.key, str(self.compute_units))


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
                      device.version.strip(), device.driver_version.strip(), kind,
                      int(device.max_compute_units))


def runs_groups_at_once(runtime) -> bool:
    """Whether the device runs every work-group of a launch of at most one a compute unit at
    the same time: PoCL's CPU driver ("pthread-<cpu>", "cpu-<cpu>" from PoCL 4 on), a pool of
    one thread a compute unit.  Not its serial drivers ("basic", "cpu-minimal"), not TBB's,
    not GPUs."""
    info = runtime.info
    name = info.name.lower()
    pool = name.startswith("pthread-") or (
        name.startswith("cpu-") and not name.startswith(("cpu-minimal", "cpu-tbb")))
    return "Portable Computing Language" in info.platform and info.kind == "cpu" and pool


def _several_kinds(device) -> bool:
    """Whether the device calls itself more than one of CPU, GPU and accelerator (a
    simulator does)."""
    cl = _cl()
    kinds = (cl.device_type.CPU, cl.device_type.GPU, cl.device_type.ACCELERATOR)
    return sum(1 for k in kinds if device.type & k) > 1


def split_index(spec: str) -> tuple[str, int]:
    """A device spec's text and index: "NVIDIA#1" is the second device whose label contains
    "NVIDIA" (identical GPUs share a label, and a worker that owns one of them names it so);
    a spec without "#N" is the first."""
    text, sep, index = spec.rpartition("#")
    if sep and index.isdigit():
        return text, int(index)
    return spec, 0


def choose_device(spec: str | None = None):
    """The device whose "platform: device" text contains `spec` (case-insensitive; "TEXT#N":
    the N-th such device, from 0); without a spec, a GPU if there is one, else a CPU.  Among
    devices of one kind, one that computes every vector width correctly is preferred over one
    that needs narrower vectors (`probe_result`)."""
    devices = all_devices()
    if spec:
        want, index = split_index(spec)
        found = [d for d in devices if want.lower() in describe(d).label.lower()]
        if len(found) <= index:
            names = "; ".join(describe(d).label for d in devices)
            raise DeviceError(f"no OpenCL device matches {spec!r} (devices: {names})")
        return found[index]
    failures = []
    for kind in ("gpu", "cpu", "other"):
        usable = []
        for d in (d for d in devices if describe(d).kind == kind):
            result = probe_result(d)
            if result.problem is not None:
                failures.append(f"{describe(d).label}: {result.problem}")
            elif result.vector_limit >= PROBE_WIDTHS[0]:
                return d
            else:
                usable.append(d)
        if usable:
            return usable[0]
    raise DeviceError("no OpenCL device can build and run a kernel correctly:\n  "
                      + "\n  ".join(failures)
                      + "\n(the PyPI PoCL's LLVM 14 does not know some recent CPUs; Debian's "
                      "`apt-get install pocl-opencl-icd` provides a newer PoCL)")


# The probe's vector widths, widest first.  Some driver/CPU pairs build every width but compute
# the widest wrongly (PyPI PoCL 3.0's LLVM 14 on AVX-512 Zen 4 loses the upper half of a float16
# accumulated in a loop), so each width is run and its results checked, not only built.
PROBE_WIDTHS = (16, 8, 4, 2, 1)
_HEX = "0123456789abcdef"


def _probe_kernel(w: int) -> str:
    """The shape of tilec's own contraction kernels in little: vector loads at clamped offsets
    accumulated in an unrolled loop, then every lane stored as a scalar."""
    t = f"float{w}" if w > 1 else "float"
    load = (f"vload{w}(0, a + clamp(g * {w} + u * {w} * n, 0, {2 * w} * n))" if w > 1
            else "a[g + u * n]")
    lanes = [f"acc.s{_HEX[i]}" for i in range(w)] if w > 1 else ["acc"]
    stores = "\n".join(f"    b[g * {w} + {i}] = {lane} + 0.5f;" for i, lane in enumerate(lanes))
    return (f"__kernel void tilec_probe{w}(__global const float* restrict a, "
            f"__global float* b) {{\n"
            f"    const int g = get_global_id(0);\n    const int n = get_global_size(0);\n"
            f"    {t} acc = ({t})(0.0f);\n    #pragma unroll\n"
            f"    for (int u = 0; u < 2; u += 1) {{\n        acc += {load} * 1.5f;\n    }}\n"
            f"{stores}\n}}\n")


_PROBE = "\n".join(_probe_kernel(w) for w in PROBE_WIDTHS)


@dataclass(frozen=True)
class ProbeResult:
    """What the probe found: why the device is unusable (None when usable) and the widest float
    vector it computes correctly (0 when unusable)."""
    problem: str | None
    vector_limit: int


# Contexts the probe opened on devices that passed, handed to the Runtime that follows (a
# context costs a good part of a second on some GPU drivers).
_PROBE_CONTEXTS: dict = {}


@functools.cache
def probe_result(device) -> ProbeResult:
    """Build the probe kernels, run them on known data and check every lane.  Some installed
    OpenCL drivers enumerate devices they cannot compile for; some compile vector code wrongly.
    The outcome is remembered on disk (by platform, device and driver versions), so later
    processes skip the probe."""
    info = describe(device)
    known = _known_result(info)
    if known is not None:
        return known
    cl = _cl()
    try:
        ctx = cl.Context([device])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # -w: PoCL prints compiler warnings to stderr itself (AVX2: float16 ABI notes)
            prg = cl.Program(ctx, _PROBE).build(options=["-w"])
        limit = _run_probe(cl, ctx, device, prg)
    except cl.Error as e:
        lines = [ln for ln in str(e).splitlines() if "error" in ln.lower()]
        return ProbeResult(lines[-1].strip() if lines else str(e).splitlines()[0], 0)
    if limit == 0:
        return ProbeResult("computes wrong results on a scalar test kernel", 0)
    result = ProbeResult(None, limit)
    _PROBE_CONTEXTS[device] = ctx
    _remember_result(info, result)
    return result


def _run_probe(cl, ctx, device, prg) -> int:
    """The widest width whose kernel (and every narrower one) gave the expected results."""
    queue = cl.CommandQueue(ctx)
    n = 3
    rng = np.random.default_rng(7)
    limit = 0
    for w in reversed(PROBE_WIDTHS):
        a = rng.uniform(1.0, 2.0, size=3 * w * n).astype(np.float32)
        out = np.full(w * n, np.nan, np.float32)
        mf = cl.mem_flags
        abuf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
        bbuf = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=out)
        getattr(prg, f"tilec_probe{w}")(queue, (n,), (1,), abuf, bbuf)
        cl.enqueue_copy(queue, out, bbuf)
        queue.finish()
        g, i = np.arange(n)[:, None], np.arange(w)[None, :]
        expected = (a[g * w + i] + a[g * w + w * n + i]) * 1.5 + 0.5
        if not np.allclose(out.reshape(n, w), expected, rtol=1e-5, atol=0):
            break
        limit = w
    return limit


def _known_good_path():
    from ..memo import default_cache_root

    return default_cache_root() / "devices" / "probed.json"


def _device_key(info: DeviceInfo) -> str:
    from .. import memo

    return memo.digest("probe", _PROBE, *info.key)


def _known_result(info: DeviceInfo) -> ProbeResult | None:
    from .. import memo

    found = memo.read_json(_known_good_path(), "probed")
    entry = found.get(_device_key(info)) if isinstance(found, dict) else None
    if not isinstance(entry, dict) or entry.get("vector_limit") not in PROBE_WIDTHS:
        return None
    return ProbeResult(None, int(entry["vector_limit"]))


def _known_good(info: DeviceInfo) -> bool:
    return _known_result(info) is not None


def _remember_result(info: DeviceInfo, result: ProbeResult) -> None:
    from .. import memo

    path = _known_good_path()
    found = memo.read_json(path, "probed")
    found = found if isinstance(found, dict) else {}
    found[_device_key(info)] = {"label": info.label, "vector_limit": result.vector_limit}
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
        self.compute_units = int(device.max_compute_units)
        # The widest float vector the device computes correctly (None: not known, no cap).
        probed = probe_result(device)
        self.vector_limit = probed.vector_limit if probed.problem is None else None
        self.driver_caches_builds = _driver_caches_builds(device)
        # A CPU device's buffers are host memory: a buffer made over the caller's array
        # (CL_MEM_USE_HOST_PTR) is read and written in place, no copy (`host_buffer`).
        self.shares_host_memory = self.info.kind == "cpu" and _host_unified(device)
        # A buffer's start as the driver aligns its own (MEM_BASE_ADDR_ALIGN, in bits): the
        # generated kernels' vector reads may assume it of any buffer they are given.
        self.base_align = max(64, int(device.mem_base_addr_align) // 8)
        self._caches: dict[tuple, ProgramCache] = {}
        self._caches_lock = threading.Lock()
        self.cache = self.cache_for(None)
        self._pending: list = []  # events of copies queued without a wait (`finish` drops)

    @staticmethod
    def get(spec: str | None = None) -> Runtime:
        """One runtime per device spec per process (contexts are expensive); a call while
        another thread opens the same device (`open_ahead`) waits for that one."""
        with _RUNTIMES_LOCK:
            if spec not in _RUNTIMES:
                _RUNTIMES[spec] = Runtime(choose_device(spec))
            return _RUNTIMES[spec]

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
            log = build_log(prg, self.device) or str(e)
            raise BuildError(explain_build(log, source)) from None

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

    def upload(self, buf, array: np.ndarray, wait: bool = True) -> None:
        """`wait` False: queued, done by the next `finish` (keep `array` as it is till then)."""
        ev = self.cl.enqueue_copy(self.queue, buf, np.ascontiguousarray(array), is_blocking=wait)
        if not wait:
            self._pending.append(ev)

    def write(self, buf, array: np.ndarray) -> None:
        """`array`, in any layout (a transposed view), into `buf` in C order, copied once:
        the buffer is mapped for writing and numpy copies into it, where `upload` would
        first make the array contiguous.  On a CPU device the map is the buffer's own
        memory.  Done when this returns."""
        if array.size == 0:
            return
        if array.dtype == np.bool_:
            array = array.view(np.uint8)
        cl = self.cl
        mapped, _ = cl.enqueue_map_buffer(self.queue, buf, cl.map_flags.WRITE_INVALIDATE_REGION,
                                          0, array.shape, array.dtype, is_blocking=True)
        try:
            np.copyto(mapped, array, casting="no")
        finally:
            mapped.base.release(self.queue)
        self.queue.finish()

    def download(self, buf, shape: tuple[int, ...], dtype, wait: bool = True) -> np.ndarray:
        """`buf` as a new array; `wait` False: queued, the array filled by the next `finish`."""
        out = np.empty(shape, dtype=dtype)
        if out.size:
            ev = self.cl.enqueue_copy(self.queue, out, buf, is_blocking=wait)
            if not wait:
                self._pending.append(ev)
        return out

    def fill(self, buf, value: np.ndarray, nbytes: int) -> None:
        self.cl.enqueue_fill_buffer(self.queue, buf, value, 0, nbytes)

    def launch(self, kernel, global_size: int, local_size: int | None, args: list | None):
        """Enqueue `kernel`; `args` None: the kernel keeps the arguments set last time."""
        try:
            if args is not None:
                kernel.set_args(*args)
            return self.cl.enqueue_nd_range_kernel(
                self.queue, kernel, (global_size,), None if local_size is None
                else (local_size,))
        except self.cl.Error as e:
            raise DeviceError(f"launching {kernel.function_name} (global {global_size}, "
                              f"local {local_size}) failed on {self.info.label}: {e}") from None

    def finish(self) -> None:
        self.queue.finish()
        self._pending.clear()  # unwaited copies' events (dropping one waits for its copy)


def _host_unified(device) -> bool:
    """Whether the device reports memory shared with the host (OpenCL 1.x's query, which
    OpenCL 3 drivers still answer; one that does not is taken as not)."""
    try:
        return bool(device.host_unified_memory)
    except Exception:  # noqa: BLE001 - a driver without the query: copies, as before
        return False


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


_RUNTIMES: dict[str | None, Runtime] = {}
_RUNTIMES_LOCK = threading.Lock()
