"""Tuning records: what `tilec tune` measured, kept so that `compile` and `run` reuse it.

A record is one JSON line with a version field, keyed by the device (platform and its version,
device name, driver version), the kernel's digest and the shapes it was tuned for (MNN keys its
tuned-size map by kernel name and global size; we key by what the kernel computes, because the
generated source itself depends on the tile being chosen).  The file is append-only: every write
is a single `os.write` of one line to a descriptor opened with O_APPEND, which the kernel
positions atomically, so concurrent tuners cannot interleave inside a line.  A line that does
not parse (a crash mid-write, a hand edit) is skipped with a warning; the last record for a key
wins.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import TileError
from ..plan.schedule import VARIANTS

if TYPE_CHECKING:
    from ..config import Config
    from ..plan.fuse import Kernel, KernelPlan
    from ..plan.hw import HwModel
    from ..runtime.device import DeviceInfo

VERSION = 1
FILE_NAME = "tuning.jsonl"


@dataclass(frozen=True)
class DeviceKey:
    """What a tuned choice depends on besides the kernel: the same chip under another driver
    may well prefer another tile."""

    platform: str
    platform_version: str
    device: str
    driver: str

    @classmethod
    def from_info(cls, info: DeviceInfo) -> DeviceKey:
        return cls(info.platform, info.platform_version, info.name, info.driver)

    def to_json(self) -> dict[str, str]:
        return {"platform": self.platform, "platform_version": self.platform_version,
                "device": self.device, "driver": self.driver}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DeviceKey:
        return cls(str(d["platform"]), str(d["platform_version"]), str(d["device"]),
                   str(d["driver"]))

    def label(self) -> str:
        return f"{self.platform}: {self.device} (driver {self.driver})"


Shapes = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class TuneRecord:
    device: DeviceKey
    kernel: str  # the kernel's name, for people reading the file
    digest: str
    shapes: Shapes
    tile: tuple[tuple[str, int], ...]  # index -> size; empty for elementwise kernels
    threads: int | None  # contraction: the thread budget handed to make_schedule
    local_size: int | None  # elementwise: the launch's local size (None: the driver's choice)
    seconds: float
    rho: float | None = None  # the cost model's report card for this kernel
    regret: float | None = None
    candidates: int = 0
    created: float = 0.0
    tilec: str = ""
    # (predicted seconds, measured seconds, the prediction's limiting resource) of each
    # candidate the time model predicted (`plan.predict`); `tune.correction` fits from them.
    pairs: tuple[tuple[float, float, str], ...] = ()
    # A code variant of the tile (`plan.schedule.VARIANTS`; "" the default).
    variant: str = ""

    @property
    def key(self) -> tuple[DeviceKey, str, Shapes]:
        return (self.device, self.digest, self.shapes)

    def tile_for(self, names: Sequence[str], ranges: Sequence[int]) -> tuple[int, ...] | None:
        """The tile in index order, or None when it does not fit these indices (a record
        from another version of the kernel must never produce an invalid tile)."""
        sizes = dict(self.tile)
        if set(sizes) != set(names):
            return None
        tile = tuple(int(sizes[n]) for n in names)
        if any(not 1 <= t <= r for t, r in zip(tile, ranges, strict=True)):
            return None
        return tile

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "device": self.device.to_json(), "kernel": self.kernel,
                "digest": self.digest, "shapes": {n: list(s) for n, s in self.shapes},
                "tile": dict(self.tile), "threads": self.threads,
                "local_size": self.local_size, "seconds": self.seconds, "rho": self.rho,
                "regret": self.regret, "candidates": self.candidates,
                "created": self.created, "tilec": self.tilec,
                "pairs": [list(p) for p in self.pairs], "variant": self.variant}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TuneRecord:
        if d.get("version") != VERSION:
            raise ValueError(f"record version {d.get('version')!r}, expected {VERSION}")

        def opt_int(v: Any) -> int | None:
            return None if v is None else int(v)

        def opt_float(v: Any) -> float | None:
            return None if v is None else float(v)

        return cls(
            device=DeviceKey.from_json(d["device"]), kernel=str(d["kernel"]),
            digest=str(d["digest"]),
            shapes=tuple((str(n), tuple(int(x) for x in s)) for n, s in d["shapes"].items()),
            tile=tuple((str(n), int(t)) for n, t in d["tile"].items()),
            threads=opt_int(d.get("threads")), local_size=opt_int(d.get("local_size")),
            seconds=float(d["seconds"]), rho=opt_float(d.get("rho")),
            regret=opt_float(d.get("regret")), candidates=int(d.get("candidates", 0)),
            created=float(d.get("created", 0.0)), tilec=str(d.get("tilec", "")),
            pairs=tuple((float(p), float(m), str(b)) for p, m, b in d.get("pairs", ())),
            variant=_variant(d.get("variant", "")))


def _variant(v: Any) -> str:
    if v not in VARIANTS:
        raise ValueError(f"unknown code variant {v!r} (known: {', '.join(map(repr, VARIANTS))})")
    return str(v)


# -- the file ------------------------------------------------------------------------------------

def default_path(config: Config) -> Path:
    if config.records_path is not None:
        return Path(config.records_path)
    if config.cache_dir is not None:
        return Path(config.cache_dir) / FILE_NAME
    # The program cache's root, so that one setting (and one test fixture) moves both.
    from ..memo import default_cache_root

    return default_cache_root() / FILE_NAME


class RecordStore:
    """An append-only JSON-lines file of `TuneRecord`s."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def load(self) -> dict[tuple[DeviceKey, str, Shapes], TuneRecord]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as e:
            warnings.warn(f"cannot read tuning records {self.path}: {e}", stacklevel=2)
            return {}
        out: dict[tuple[DeviceKey, str, Shapes], TuneRecord] = {}
        bad: list[int] = []
        for n, raw in enumerate(data.split(b"\n"), 1):
            if not raw.strip():
                continue
            try:
                rec = TuneRecord.from_json(json.loads(raw))
            except (ValueError, KeyError, TypeError, AttributeError):
                bad.append(n)
                continue
            out[rec.key] = rec
        if bad:
            lines = ", ".join(map(str, bad[:5])) + (" ..." if len(bad) > 5 else "")
            warnings.warn(f"{self.path}: skipped {len(bad)} unreadable tuning record line(s) "
                          f"({lines})", stacklevel=2)
        return out

    def records(self) -> list[TuneRecord]:
        return list(self.load().values())

    def append(self, records: Iterable[TuneRecord]) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise TileError(f"cannot write tuning records to {self.path}: {e}") from None
        try:
            for rec in records:
                line = (json.dumps(rec.to_json(), sort_keys=True) + "\n").encode()
                # One write per line: O_APPEND makes each write land whole at the end.
                written = os.write(fd, line)
                if written != len(line):  # only on a full disk or a signal; finish the line
                    os.write(fd, line[written:])
        except OSError as e:
            raise TileError(f"cannot write tuning records to {self.path}: {e}") from None
        finally:
            os.close(fd)


# -- keys and lookup -----------------------------------------------------------------------------

def kernel_tensors(kernel: Kernel) -> tuple[str, ...]:
    """Every tensor the kernel reads or produces, in a stable order."""
    from ..lang import ir
    from ..plan.fuse import ContractionKernel

    names: list[str] = []
    if isinstance(kernel, ContractionKernel):
        names += [kernel.op.output] + [a.tensor for a in kernel.op.inputs]
        if kernel.op.default:
            names.append(kernel.op.default)
        ops = kernel.post_ops
    else:  # an attention kernel's statements run from its score product to its value one
        ops = getattr(kernel, "statements", kernel.ops)
    for o in ops:
        reads = [a.tensor for a in o.inputs] if isinstance(o, ir.Contraction) else \
            list(ir.expr_refs(o.expr))
        names += [o.output, *reads]
    return tuple(dict.fromkeys(names))


def kernel_shapes(kernel: Kernel, plan: KernelPlan) -> Shapes:
    tensors = plan.program.tensors
    return tuple(sorted((n, tuple(tensors[n].shape)) for n in kernel_tensors(kernel)))


def kernel_digest(kernel: Kernel, plan: KernelPlan, hw: HwModel, config: Config) -> str:
    """sha256 of what the kernel computes (its statements, shapes, element types, which tensors
    it stores) and what the choice was made for (hardware model, codegen options).  Not of
    the generated source: that changes with the tile being tuned."""
    from ..plan.fuse import ContractionKernel
    from ..plan.rows import RowKernel

    tensors = plan.program.tensors
    if isinstance(kernel, ContractionKernel):
        kind, stmts = "contraction", [kernel.op.text] + [p.text for p in kernel.post_ops]
    elif isinstance(kernel, RowKernel):
        kind, stmts = "rows", [o.text for o in kernel.ops]
    elif hasattr(kernel, "statements"):
        kind, stmts = "attention", [o.text for o in kernel.statements]
    else:
        kind, stmts = "elementwise", [o.text for o in kernel.ops]
    body = {"kind": kind, "statements": stmts, "writes": list(kernel.writes),
            "tensors": {n: [list(tensors[n].shape), tensors[n].dtype]
                        for n in kernel_tensors(kernel)},
            "hw": hw.name, "vector_width": config.vector_width, "staging": config.staging}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:32]


def lookup(plan: KernelPlan, hw: HwModel, config: Config, device: DeviceKey,
           store: RecordStore | None = None,
           found: Mapping[tuple[DeviceKey, str, Shapes], TuneRecord] | None = None
           ) -> dict[str, TuneRecord]:
    """kernel name -> the record for it on this device (only kernels that have one), from
    `found` (records already loaded) or the store."""
    if not config.use_tuning_records:
        return {}
    if found is None:
        found = (store or RecordStore(default_path(config))).load()
    if not found:
        return {}
    out = {}
    for k in plan.kernels:
        rec = found.get((device, kernel_digest(k, plan, hw, config), kernel_shapes(k, plan)))
        if rec is not None:
            out[k.name] = rec
    return out


def make_record(device: DeviceKey, kernel: Kernel, plan: KernelPlan, hw: HwModel,
                config: Config, *, tile: Mapping[str, int], threads: int | None,
                local_size: int | None, seconds: float, rho: float | None,
                regret: float | None, candidates: int,
                pairs: tuple[tuple[float, float, str], ...] = (),
                variant: str = "") -> TuneRecord:
    from ..version import __version__

    return TuneRecord(device=device, kernel=kernel.name,
                      digest=kernel_digest(kernel, plan, hw, config),
                      shapes=kernel_shapes(kernel, plan), tile=tuple(tile.items()),
                      threads=threads, local_size=local_size, seconds=seconds, rho=rho,
                      regret=regret, candidates=candidates, created=time.time(),
                      tilec=__version__, pairs=pairs, variant=variant)
