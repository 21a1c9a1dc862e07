"""Small results kept on disk between processes: the Tile parser's tables and the tile
search's choices.  They cost a few hundred milliseconds to recompute, which is most of a warm
`compile` once the driver's build is cached.

Each entry is one file written to a private temporary file and moved into place with
`os.replace`, so a reader sees a whole entry or none; an entry carries the sha256 of its body
and the key it was made for, so a truncated, corrupt or foreign file is ignored (and rewritten),
never used.  Nothing here may fail a compile: an unwritable directory only costs the time."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

_MAGIC = b"TILECMEMO1\n"


def default_cache_root() -> Path:
    """tilec's cache directory when the config names none (the user cache directory)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("tilec"))


def _pack(key: str, body: bytes) -> bytes:
    head = json.dumps({"key": key, "sha256": hashlib.sha256(body).hexdigest(),
                       "length": len(body)}).encode()
    return _MAGIC + head + b"\n" + body


def read(path: Path, key: str) -> bytes | None:
    """The body stored at `path` for `key`, or None when it is missing, for another key,
    truncated or corrupt."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if not data.startswith(_MAGIC):
        return None
    head, sep, body = data[len(_MAGIC):].partition(b"\n")
    if not sep:
        return None
    try:
        meta = json.loads(head)
    except ValueError:
        return None
    if (not isinstance(meta, dict) or meta.get("key") != key
            or meta.get("length") != len(body)
            or meta.get("sha256") != hashlib.sha256(body).hexdigest()):
        return None
    return body


def write(path: Path, key: str, body: bytes) -> bool:
    """Store `body` for `key` at `path` atomically; False (and nothing written) when the
    directory cannot be written."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(_pack(key, body))
        os.replace(tmp, path)
        return True
    except OSError:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        return False


def read_json(path: Path, key: str) -> Any:
    body = read(path, key)
    if body is None:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def write_json(path: Path, key: str, value: Any) -> bool:
    return write(path, key, json.dumps(value, sort_keys=True).encode())


def digest(*parts: Any) -> str:
    h = hashlib.sha256()
    for p in parts:
        b = p if isinstance(p, bytes) else str(p).encode()
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def module_digest(*modules: Any) -> str:
    """A digest of modules' source files: a cached result made by other code is not reused."""
    parts = []
    for m in modules:
        try:
            parts.append(Path(m.__file__).read_bytes())
        except (OSError, TypeError):
            parts.append(repr(m).encode())
    return digest(*parts)
