"""Whole compiles kept on disk: a program compiled again skips parsing, planning and codegen.

A model's warm compile was mostly these stages (ResNet-50: 2 s of code generation and 0.5 s of
parsing against 0.15 s for the driver to find its cached build).  The result of a compile --
the checked program, the kernel plan, the kernel sources, the tuning records used and the
thread budget the compile settled on -- is pickled under `<cache root>/compiled/<key>.pkl`.
The key is the sha256 of everything the result depends on: the Tile text and its name, shapes,
element types and fixed values, the settings that steer planning and codegen, the hardware
model, the device and driver, the tuning records file's contents, and the source of tilec
itself (so an edited compiler never reuses an old result).

Entries are written through `memo.write` (a temporary file moved into place, with the key and
a sha256 of the body), so a truncated, corrupt or foreign file is ignored, never unpickled.
The directory is the user's own cache, which pickle trusts as it trusts the code it runs.
Nothing here may fail a compile: an unreadable entry is a miss, an unwritable directory only
costs the time."""

from __future__ import annotations

import functools
import hashlib
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from .. import memo
from ..config import Config

FORMAT = 1
# Settings that do not change what is compiled (where caches live, tolerances, the device
# spec, which the device's own identity replaces).
_IGNORED = {"device", "cache_dir", "use_disk_cache", "cache_max_bytes", "build_workers",
            "disk_cache_all_drivers", "records_path", "use_tuning_records", "rtol", "atol"}


@dataclass(frozen=True)
class Compiled:
    """What `compile` made, less the built program (the driver's cache keeps that)."""

    program: Any  # lang.ir.Program
    plan: Any  # plan.fuse.KernelPlan
    sources: tuple  # codegen KernelSource, in launch order
    searches: dict
    tuned: dict  # kernel name -> tune.records.TuneRecord
    threads: int | None  # the thread budget the compile settled on
    split_reduction: bool | int | None
    shared: Any = None  # runtime.share.SharedKernels: which kernels share a function

    def config_for(self, config: Config) -> Config:
        return replace(config, threads=self.threads, split_reduction=self.split_reduction)


def directory(config: Config) -> Path:
    return (config.cache_dir or memo.default_cache_root()) / "compiled"


@functools.cache
def code_digest() -> str:
    """A digest of tilec's own source: modules, kernel templates and the grammar."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    # Installed, the templates and grammar are inside the package; in a checkout, beside it.
    files = sorted(f for ext in ("py", "j2", "lark") for f in root.rglob(f"*.{ext}"))
    for extra in ("templates", "grammar"):
        files += sorted((root.parent / extra).glob("*.*"))
    for f in files:
        try:
            h.update(str(f.relative_to(root.parent)).encode() + b"\0" + f.read_bytes())
        except (OSError, ValueError):
            h.update(str(f).encode())
    return h.hexdigest()


def key(source: Any, shapes: Mapping[str, Sequence[int]] | None, dtype: Any,
        values: Mapping[str, int] | None, config: Config, model: Any, runtime: Any,
        *extra: Any) -> str:
    text, name = (source.text, source.name) if hasattr(source, "text") else (source, "")
    settings = {f.name: getattr(config, f.name) for f in fields(config)
                if f.name not in _IGNORED}
    norm_shapes = None if shapes is None else \
        sorted((k, tuple(int(d) for d in v)) for k, v in shapes.items())
    norm_dtype = dtype if isinstance(dtype, str) else sorted(dtype.items())
    return memo.digest("compiled", FORMAT, code_digest(), text, name, norm_shapes, norm_dtype,
                       sorted((values or {}).items()), sorted(settings.items()), repr(model),
                       runtime.info.facts_key, runtime.max_wg, runtime.vector_limit, *extra)


def load(config: Config, k: str) -> Compiled | None:
    body = memo.read(directory(config) / f"{k}.pkl", k)
    if body is None:
        return None
    try:
        found = pickle.loads(body)
    except Exception:  # noqa: BLE001 - an entry of other code: a miss
        return None
    return found if isinstance(found, Compiled) else None


def store(config: Config, k: str, result: Compiled) -> bool:
    try:
        body = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - something unpicklable: only the time is lost
        try:
            body = pickle.dumps(replace(result, searches={}), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001
            return False
    return memo.write(directory(config) / f"{k}.pkl", k, body)


__all__ = ["Compiled", "code_digest", "directory", "key", "load", "store"]
