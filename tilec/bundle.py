"""Bundles (.tlc): one file with everything needed to run a compiled program on a device.

MACE ships the OpenCL program binary, the model and the tuned parameters packed per model and
device (seed 000); a bundle is the same for one Tile program.  It is a zip archive:

    bundle.json  format name and version, tilec version, the program's text, input shapes and
                 element types, the hardware model's name, the device the binary was built for,
                 build options, the launch manifest (kernels in launch order with their
                 arguments and global/local sizes, buffers), the tuning records the kernels
                 came from, and sha256 sums of the two files below
    kernels.cl   the generated OpenCL C of every kernel
    program.bin  the device binary (absent when the driver gives none)

`load` runs a bundle without parsing, searching or tuning.  It hands the binary to the driver
only when the device, driver and build options are those it was built for and its checksum
holds (PoCL crashes the process on a corrupt binary); otherwise, or when the driver refuses the
binary, it builds `kernels.cl` instead and says why in a `BundleWarning`.  The kernels' tiles
stay those chosen for the original device, so another device runs them correctly but perhaps
not at its best: compile the program there (and tune it) for that.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from .codegen.phases import GRID_SYNC, SYNC_INTS
from .config import Config
from .errors import DeviceError, TileError
from .plan.halo import Halo
from .runtime.device import DeviceInfo, Runtime, runs_groups_at_once
from .runtime.launch import BufferSpec, KernelInfo, Launcher
from .runtime.validate import Validation, compare
from .tune.records import TuneRecord

FORMAT = "tilec-bundle"
# Version 2: buffers may carry a border the loader fills (`halo`); version 1 bundles have
# none and read the same.
VERSION = 2
READS = (1, 2)
META, SOURCE, BINARY = "bundle.json", "kernels.cl", "program.bin"


class BundleError(TileError):
    """A file that is not a readable bundle."""


class BundleWarning(UserWarning):
    """The bundle's binary could not be used; its kernels were built from source."""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest(exe) -> dict:
    """The launch manifest of a compiled executable: buffers, kernels in launch order with their
    arguments and sizes, build options, device and hardware model (`compile --manifest`)."""
    p = exe.program
    halos = {h.root: h for h in exe.plan.halos}
    buffers = []
    for name in exe.plan.buffers():
        t = exe.plan.program.tensors[name]
        role = "input" if name in p.inputs else "output" if name in p.outputs else "temporary"
        buffers.append({"tensor": name, "role": role, "dtype": t.dtype, "shape": list(t.shape),
                        "bytes": exe.specs[name].nbytes})
        if name in halos:  # a border no kernel writes: the buffer is filled first
            h = halos[name]
            buffers[-1]["halo"] = {"tensor": h.tensor, "lo": list(h.lo), "hi": list(h.hi),
                                   "fill": h.fill}
    if any(s.kind == "phases" for s in exe.sources):  # the phase launches' barrier counters
        buffers.append({"tensor": GRID_SYNC, "role": "sync", "dtype": "int32",
                        "shape": [SYNC_INTS], "bytes": SYNC_INTS * 4})
    kernels = []
    for s in exe.sources:
        kernels.append({
            "name": s.name, "entry": getattr(exe, "entries", {}).get(s.name, s.name),
            "kind": s.kind, "global_size": [s.global_size],
            "local_size": None if s.local_size is None else [s.local_size],
            "args": [{"index": i, "tensor": a.tensor,
                      "access": {"in": "read", "out": "write"}.get(a.role, a.role),
                      "dtype": a.dtype, "elements": a.elems}
                     for i, a in enumerate(s.args)],
            "tile": s.tile, "flops": s.flops,
        })
    info = exe.runtime.info
    from .version import __version__

    return {"version": 1, "tilec": __version__, "inputs": list(p.inputs),
            "outputs": list(p.outputs), "buffers": buffers, "kernels": kernels,
            "build_options": list(exe.config.build_options),
            "device": {"platform": info.platform, "name": info.name, "driver": info.driver},
            "hw_model": exe.hw.name}


def write_bundle(exe, path: str | os.PathLike[str]) -> str:
    """Write `exe` (a compiled `Executable`) as a bundle; returns a one-line summary."""
    from .version import __version__

    program = exe.program
    binary = exe.runtime.binary_of(exe.whole_program())
    source = exe.source.encode()
    meta = {
        "format": FORMAT, "version": VERSION, "tilec": __version__,
        "program": {"text": program.source.text, "name": program.source.name,
                    "shapes": {n: list(program.tensors[n].shape) for n in program.inputs},
                    "dtypes": {n: program.tensors[n].dtype for n in program.inputs}},
        "hw_model": exe.hw.name,
        "device": asdict(exe.runtime.info),
        "build_options": list(exe.config.build_options),
        "manifest": manifest(exe),
        "records": [r.to_json() for r in exe.tuned.values()],
        "source": {"file": SOURCE, "sha256": _sha(source), "bytes": len(source)},
        "binary": None if binary is None else {"file": BINARY, "sha256": _sha(binary),
                                                 "bytes": len(binary)},
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(META, json.dumps(meta, indent=1))
        z.writestr(SOURCE, source)
        if binary is not None:
            z.writestr(BINARY, binary)
    _write_atomic(Path(path), buf.getvalue())
    n = len(exe.sources)
    what = "no binary" if binary is None else f"binary {len(binary) // 1024} KiB"
    return (f"{n} kernel{'s' if n != 1 else ''}, {what} for {exe.runtime.info.label}, "
            f"{len(exe.tuned)} tuning record{'s' if len(exe.tuned) != 1 else ''}")


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_bundle(path: str | os.PathLike[str]
                ) -> tuple[dict[str, Any], str, bytes | None, str]:
    """(metadata, kernel source, binary, why the binary is unusable).  The binary is None when
    absent or failing its checksum."""
    try:
        with zipfile.ZipFile(path) as z:
            meta = json.loads(z.read(META))
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise BundleError(f"{path} is not a tilec bundle")
            if meta.get("version") not in READS:
                raise BundleError(f"{path} is a version {meta.get('version')} bundle; this "
                                  f"tilec reads versions {', '.join(map(str, READS))}")
            source = z.read(SOURCE)
            binary = z.read(BINARY) if meta.get("binary") else None
    except FileNotFoundError:
        raise BundleError(f"no bundle at {path}") from None
    except (zipfile.BadZipFile, KeyError, ValueError, OSError) as e:
        raise BundleError(f"{path} is not a readable tilec bundle ({e})") from None
    if _sha(source) != meta["source"]["sha256"]:
        raise BundleError(f"{path}: the kernel source fails its checksum (a damaged file)")
    problem = ""
    if binary is not None and _sha(binary) != meta["binary"]["sha256"]:
        binary, problem = None, "its device binary fails its checksum (a damaged file)"
    return meta, source.decode(), binary, problem


def load(path: str | os.PathLike[str], *, device: str | None = None,
         config: Config | None = None, validate: bool = False) -> BundledExecutable:
    """Open a bundle on a device (default: the one it was built for, if present, else the
    usual choice) and build its kernels, from the binary where it fits."""
    meta, source, binary, problem = read_bundle(path)
    config = config or Config()
    dev = meta["device"]
    spec = device or config.device
    if spec is None:
        try:
            runtime = Runtime.get(f"{dev['platform']}: {dev['name']}")
        except DeviceError:
            runtime = Runtime.get(None)
    else:
        runtime = Runtime.get(spec)
    return BundledExecutable(meta, source, binary, runtime, config, validate=validate,
                             path=str(path), problem=problem)


class BundledExecutable(Launcher):
    """A bundle's kernels on one device; call it with the input arrays like an `Executable`."""

    def __init__(self, meta: dict[str, Any], source: str, binary: bytes | None,
                 runtime: Runtime, config: Config, *, validate: bool = False, path: str = "",
                 problem: str = ""):
        self.meta, self.source, self.config = meta, source, config
        m = meta["manifest"]
        self.buffers = {b["tensor"]: b for b in m["buffers"]}
        self.records = tuple(TuneRecord.from_json(r) for r in meta.get("records", []))
        self.tuned = {r.kernel: r for r in self.records}
        options = tuple(meta.get("build_options", config.build_options))
        self.runtime = runtime
        if any(k["kind"] == "phases" for k in m["kernels"]) and not runs_groups_at_once(runtime):
            # Its work-groups wait for each other (`codegen.phases`): a driver that may run
            # them one after another would never finish the launch.
            raise DeviceError(f"bundle {path}: its phase launches need every work-group of a "
                              f"launch running at once, which {runtime.info.label} does not "
                              "promise; compile the program for this device")
        self.fallback_reason = problem or _misfit(meta, binary, runtime)
        program = None
        if not self.fallback_reason:
            try:
                program = runtime.build_binary(binary, options)  # type: ignore[arg-type]
            except DeviceError as e:
                self.fallback_reason = f"the driver refused the binary ({e})"
        if program is None:
            warnings.warn(f"bundle {path}: {self.fallback_reason}; building the kernels from "
                          "source", BundleWarning, stacklevel=3)
            program = runtime.build(source, options, config)
        self.from_binary = not self.fallback_reason
        launches = [self._launch_size(k) for k in m["kernels"]]
        kernels = [KernelInfo(k["name"], k["kind"], g, loc, dict(k.get("tile") or {}), "",
                              int(k.get("flops", 0)), tuple(a["tensor"] for a in k["args"]),
                              tuple(a["tensor"] for a in k["args"] if a["access"] == "write"))
                   for k, (g, loc) in zip(m["kernels"], launches, strict=True)]
        # "entry": the program's kernel that runs it (kernels differing only in names share
        # one); bundles written before it name their own.
        cl_kernels = {k["name"]: runtime.kernel(program, k.get("entry", k["name"]))
                      for k in m["kernels"]}
        specs = {n: BufferSpec(tuple(b["shape"]), b["dtype"], int(b["bytes"]))
                 for n, b in self.buffers.items()}
        self._program = None
        halos = [Halo(n, b["halo"]["tensor"], tuple(b["halo"]["lo"]), tuple(b["halo"]["hi"]),
                      float(b["halo"]["fill"])) for n, b in self.buffers.items() if "halo" in b]
        self._setup(runtime, tuple(m["inputs"]), tuple(m["outputs"]), specs, kernels,
                    cl_kernels, None, validate, halos=halos, host_io=config.host_io)

    def _launch_size(self, k: Mapping[str, Any]) -> tuple[int, int | None]:
        g = int(k["global_size"][0])
        loc = None if k["local_size"] is None else int(k["local_size"][0])
        limit = int(self.runtime.device.max_work_group_size)
        if loc is not None and loc > limit and k["kind"] != "contraction":
            # A local size tuned elsewhere; the kernel guards its element count, so the
            # driver's choice is always valid.
            outs = [int(a["elements"]) for a in k["args"] if a["access"] == "write"]
            return (max(outs) if outs else g), None
        return g, loc

    @property
    def program(self):
        """The checked program (parsed on first use: only validation needs it)."""
        if self._program is None:
            from .errors import Source
            from .lang.api import check_program

            p = self.meta["program"]
            self._program = check_program(Source(p["text"], p.get("name", "<bundle>")),
                                          p["shapes"], p["dtypes"])
        return self._program

    def check(self, inputs: Mapping[str, np.ndarray],
              outs: Mapping[str, np.ndarray]) -> Validation:
        from .lang.reference import evaluate_program

        ref = evaluate_program(self.program, inputs)
        return compare(ref, outs, self.program, self.config)


def _misfit(meta: Mapping[str, Any], binary: bytes | None, runtime: Runtime) -> str:
    """Why the binary cannot be handed to this device's driver ("" when it can)."""
    if binary is None:
        return "the bundle holds no binary"
    built = meta["device"]
    here = asdict(runtime.info)
    for field in DeviceInfo.__dataclass_fields__:
        if built.get(field) != here[field]:
            return (f"its binary was built for {built.get('name')} ({field} "
                    f"{built.get(field)!r}); this device is {here['name']} ({field} "
                    f"{here[field]!r})")
    return ""
