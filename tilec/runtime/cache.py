"""The program cache: built OpenCL programs reused in process, and their binaries kept on disk.

In process, a digest of (kernel source, build options, device) finds a program already built
on the same context, so a kernel compiled twice is built once (ncnn's pipeline cache).

On disk, one file per program under `<cache root>/programs/<key>.bin`, where the key is the
sha256 of everything a binary depends on: tilec version, entry format, source, build options,
platform name and version, device name and version, driver version.  Drivers that keep a build
cache of their own (PoCL, NVIDIA's) are left to it unless `all_drivers` says otherwise: PoCL
compiles every kernel a second time, for seconds, to hand its binary out.  A file is

    header  magic "TILECBIN", format, key-field length, payload length, sha256 of the rest
    key     the key's fields as JSON (for `tilec cache info`, and to tell a foreign file)
    payload the driver's binary

Drivers do not check what they are handed: PoCL crashes the process on a truncated or
bit-flipped binary.  So an entry reaches the driver only after its length, checksum and key
fields have been verified; one that fails is removed with a `CacheWarning` and the kernel is
rebuilt from source.  Writers write a private temporary file and `os.replace` it into place, so
a reader sees either a whole entry or none, and concurrent processes need no lock.  Size is
capped by removing the least recently used entries (a hit refreshes an entry's mtime)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from ..config import DEFAULT_CACHE_MAX_BYTES, Config
from ..errors import BuildError, CacheError
from ..memo import default_cache_root

MAGIC = b"TILECBIN"
FORMAT = 1
# magic, format, reserved, key-field bytes, payload bytes, sha256(key fields + payload)
_HEAD = struct.Struct("<8sHHIQ32s")
ENTRY_SUFFIX = ".bin"
_TEMP_PREFIX, _TEMP_SUFFIX = ".tmp-", ".part"
# Programs kept in memory per cache: tuning builds many candidates once each, and an executable
# holds its own reference, so dropping the least recently used ones only costs a rebuild.
MEMORY_PROGRAMS = 512
# A temporary file this old belongs to a writer that died; younger ones may still be written.
_STALE_TEMP_SECONDS = 3600.0


class CacheWarning(UserWarning):
    """A cache entry was unusable (and removed), or the cache directory cannot be written."""


class DeviceRuntime(Protocol):
    """What the cache needs from `tilec.runtime.Runtime` (kept abstract: no import cycle)."""

    context: Any
    info: Any  # DeviceInfo
    driver_caches_builds: bool

    def build_source(self, source: str, options: Sequence[str]) -> Any: ...
    def build_binary(self, binary: bytes, options: Sequence[str]) -> Any: ...
    def binary_of(self, program: Any) -> bytes | None: ...


@dataclass
class CacheStats:
    memory_hits: int = 0
    disk_hits: int = 0
    builds: int = 0  # programs built from source
    corrupt: int = 0  # disk entries found unusable, removed and rebuilt

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class Entry:
    """One file of the on-disk cache, as `tilec cache info` shows it."""

    path: Path
    size: int
    last_used: float  # mtime, seconds since the epoch
    fields: dict[str, Any] | None  # None when the header cannot be read


def key_fields(info: Any, source: str, options: Sequence[str]) -> dict[str, Any]:
    """Everything a program binary depends on, JSON-ready (lists, not tuples, so that a
    round trip through the file compares equal)."""
    from ..version import __version__

    return {
        "format": FORMAT, "tilec": __version__,
        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
        "options": list(options),
        "platform": info.platform, "platform_version": info.platform_version,
        "device": info.name, "device_version": info.version, "driver": info.driver,
    }


def digest(fields: dict[str, Any]) -> str:
    return hashlib.sha256(_dump(fields)).hexdigest()


def _dump(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def encode_entry(fields: dict[str, Any], payload: bytes) -> bytes:
    meta = _dump(fields)
    check = hashlib.sha256(meta + payload).digest()
    return _HEAD.pack(MAGIC, FORMAT, 0, len(meta), len(payload), check) + meta + payload


class _Unusable(Exception):
    """Why an entry's bytes cannot be trusted."""


def _header(data: bytes) -> tuple[int, int, bytes]:
    """(key-field length, payload length, checksum) of an entry, or `_Unusable`."""
    if not data:
        raise _Unusable("empty")
    if len(data) < _HEAD.size:
        raise _Unusable(f"truncated ({len(data)} bytes, shorter than the header)")
    magic, fmt, _, meta_len, payload_len, check = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise _Unusable("not a tilec cache entry (bad magic bytes)")
    if fmt != FORMAT:
        raise _Unusable(f"entry format {fmt}, this tilec reads format {FORMAT}")
    return meta_len, payload_len, check


def decode_entry(data: bytes, fields: dict[str, Any]) -> bytes:
    """The payload of an entry written for exactly `fields`; `_Unusable` otherwise."""
    meta_len, payload_len, check = _header(data)
    expected = _HEAD.size + meta_len + payload_len
    if len(data) < expected:
        raise _Unusable(f"truncated ({len(data)} of {expected} bytes)")
    if len(data) > expected:
        raise _Unusable(f"{len(data) - expected} bytes past the end of the entry")
    body = memoryview(data)[_HEAD.size:]
    if hashlib.sha256(body).digest() != check:
        raise _Unusable("checksum mismatch")
    try:
        stored = json.loads(bytes(body[:meta_len]))
    except ValueError:
        raise _Unusable("unreadable key fields") from None
    if stored != fields:
        stored = stored if isinstance(stored, dict) else {}
        differ = sorted(k for k in set(stored) | set(fields) if stored.get(k) != fields.get(k))
        raise _Unusable(f"written for another kernel or device ({', '.join(differ)} differ)")
    return bytes(body[meta_len:])


def read_fields(path: Path) -> dict[str, Any] | None:
    """An entry's key fields, without reading its payload (None if unreadable)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD.size)
            meta_len = _header(head)[0]
            fields = json.loads(f.read(meta_len))
    except (OSError, ValueError, _Unusable):
        return None
    return fields if isinstance(fields, dict) else None


class ProgramCache:
    """Built programs by digest in memory, and binaries on disk under `root/programs`."""

    def __init__(self, root: Path | str | None = None, enabled: bool = True,
                 max_bytes: int = DEFAULT_CACHE_MAX_BYTES, all_drivers: bool = False) -> None:
        self.root = Path(root).expanduser() if root is not None else default_cache_root()
        self.directory = self.root / "programs"
        self.enabled = enabled
        self.max_bytes = int(max_bytes)
        self.all_drivers = all_drivers
        self.stats = CacheStats()
        # digest -> (context, program); the context is kept so that its id stays unique
        self._memory: OrderedDict[tuple[int, str], tuple[Any, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._write_warned = False

    @classmethod
    def for_config(cls, config: Config) -> ProgramCache:
        return cls(config.cache_dir, config.use_disk_cache, config.cache_max_bytes,
                   config.disk_cache_all_drivers)

    def uses_disk(self, runtime: DeviceRuntime) -> bool:
        return self.enabled and (self.all_drivers or not runtime.driver_caches_builds)

    def path_for(self, key: str) -> Path:
        return self.directory / f"{key}{ENTRY_SUFFIX}"

    # building ------------------------------------------------------------------------------------

    def program(self, runtime: DeviceRuntime, source: str, options: Sequence[str] = ()):
        """The built program for `source`: from memory, else from disk, else built (and kept).
        A source the compiler rejects raises `BuildError`, as a plain build does."""
        options = tuple(options)
        fields = key_fields(runtime.info, source, options)
        key = digest(fields)
        # A program belongs to one context; two runtimes on one device must not share them.
        mkey = (id(runtime.context), key)
        with self._lock:
            hit = self._memory.get(mkey)
            if hit is not None:
                self._memory.move_to_end(mkey)
                self.stats.memory_hits += 1
                return hit[1]
        disk = self.uses_disk(runtime)
        prg = self._from_disk(runtime, key, fields, options) if disk else None
        if prg is None:
            prg = runtime.build_source(source, options)
            with self._lock:
                self.stats.builds += 1
            if disk:
                binary = runtime.binary_of(prg)
                if binary:
                    self.store(key, fields, binary)
        with self._lock:
            self._memory[mkey] = (runtime.context, prg)
            while len(self._memory) > MEMORY_PROGRAMS:
                self._memory.popitem(last=False)
        return prg

    def _from_disk(self, runtime: DeviceRuntime, key: str, fields: dict[str, Any],
                   options: tuple[str, ...]):
        path = self.path_for(key)
        found = self.load(path, fields)
        if found is None:
            return None
        binary, stat = found
        try:
            prg = runtime.build_binary(binary, options)
        except BuildError as e:
            self._discard(path, stat, f"refused by the driver: {e.message.splitlines()[0]}")
            return None
        with self._lock:
            self.stats.disk_hits += 1
        try:
            os.utime(path)  # least recently used = oldest mtime
        except OSError:
            pass
        return prg

    # disk ----------------------------------------------------------------------------------------

    def load(self, path: Path, fields: dict[str, Any]) -> tuple[bytes, os.stat_result] | None:
        """A verified payload and the stat of the file it came from, or None (a miss, or an
        unusable entry, which is removed with a warning)."""
        try:
            with open(path, "rb") as f:
                stat = os.fstat(f.fileno())
                data = f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            self._warn_once(f"cannot read the program cache entry {path} ({e}); building "
                            "from source")
            return None
        try:
            return decode_entry(data, fields), stat
        except _Unusable as e:
            self._discard(path, stat, str(e))
            return None

    def _discard(self, path: Path, stat: os.stat_result, reason: str) -> None:
        with self._lock:
            self.stats.corrupt += 1
        try:
            now = os.stat(path)
            # Another process may have replaced the bad file with a good one meanwhile.
            if (now.st_ino, now.st_dev) == (stat.st_ino, stat.st_dev):
                os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            reason += f"; it could not be removed: {e}"
        warnings.warn(f"tilec program cache: {path} is unusable ({reason}); removed it and "
                      "rebuilt the kernel from source", CacheWarning, stacklevel=4)

    def store(self, key: str, fields: dict[str, Any], binary: bytes) -> Path | None:
        """Write an entry atomically, then evict past the cap; None if it was not written."""
        data = encode_entry(fields, binary)
        if len(data) > self.max_bytes:
            return None  # it would evict everything else and then itself
        path = self.path_for(key)
        tmp = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=_TEMP_PREFIX,
                                       suffix=_TEMP_SUFFIX)
            # No fsync: a file a crash leaves short or empty fails its checksum and is rebuilt.
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except KeyboardInterrupt:
            # Interrupted between the temporary file and the rename: leave no partial file.
            if tmp is not None:
                _unlink(Path(tmp))
            raise
        except OSError as e:
            if tmp is not None:
                _unlink(Path(tmp))
            self._warn_once(f"cannot write to the program cache {self.directory} ({e}); "
                            "programs will be built from source each time")
            return None
        self.evict(keep=path)
        return path

    def evict(self, keep: Path | None = None) -> int:
        """Remove the least recently used entries until the cache fits its cap, and temporary
        files that dead writers left; returns how many entries went."""
        entries = self.entries(with_fields=False)
        total = sum(e.size for e in entries)
        removed = 0
        for e in sorted(entries, key=lambda e: e.last_used):
            if total <= self.max_bytes:
                break
            if e.path == keep:
                continue
            _unlink(e.path)  # gone already (another process evicted it) counts the same
            total -= e.size
            removed += 1
        now = time.time()
        for tmp in self._temps():
            try:
                if now - tmp.stat().st_mtime > _STALE_TEMP_SECONDS:
                    _unlink(tmp)
            except FileNotFoundError:
                pass
        return removed

    def entries(self, with_fields: bool = True) -> list[Entry]:
        out = []
        try:
            paths = list(self.directory.glob(f"*{ENTRY_SUFFIX}"))
        except OSError:
            return []
        for p in paths:
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            out.append(Entry(p, st.st_size, st.st_mtime, read_fields(p) if with_fields else None))
        return out

    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries(with_fields=False))

    def clear(self) -> int:
        """Remove every entry (and temporary file); returns how many entries went.  The
        in-process programs stay: they are valid for as long as the process lives."""
        n = 0
        try:
            for e in self.entries(with_fields=False):
                e.path.unlink(missing_ok=True)
                n += 1
            for tmp in self._temps():
                tmp.unlink(missing_ok=True)
        except OSError as e:
            raise CacheError(f"cannot clear the program cache {self.directory}: {e}") from None
        return n

    def _temps(self) -> list[Path]:
        try:
            return list(self.directory.glob(f"{_TEMP_PREFIX}*{_TEMP_SUFFIX}"))
        except OSError:
            return []

    def _warn_once(self, message: str) -> None:
        if not self._write_warned:
            self._write_warned = True
            warnings.warn(f"tilec program cache: {message}", CacheWarning, stacklevel=4)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass  # gone already, or another user's file we may not remove: the cap is a target


__all__ = ["CacheStats", "CacheWarning", "Entry", "ProgramCache", "default_cache_root",
           "key_fields", "digest", "encode_entry", "decode_entry"]
