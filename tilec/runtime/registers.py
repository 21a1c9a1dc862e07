"""The registers a GPU driver's compiler gives kernels, asked of drivers that say.

NVIDIA's OpenCL (the `cl_nv_compiler_options` extension) prints what its assembler allocated
when a program is built with `-cl-nv-verbose`:

    ptxas info    : Compiling entry function 'contract_O_r3' for 'sm_90'
    ptxas info    : Function properties for contract_O_r3
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 147 registers, 384 bytes cmem[0]

Code generation hands over the texts of a kernel's candidate tiles (`codegen.generate.
counted_plan`); they are built `CHUNK` a program, each entry renamed with a tag of its own so
that they can stand side by side, and the log is read entry by entry.  A 3x3 convolution's
kernel takes the H200's driver about 0.4 s: 16 candidates add 6 s to a cold compile.  Counts
are kept per device, driver, build options and text, in memory and under the cache directory:
a compile that repeats a layer, or a later process, does not build them again.  Other drivers
say nothing, and the time model keeps its estimate there."""

from __future__ import annotations

import re
import secrets
import threading
from collections.abc import Sequence
from pathlib import Path

from ..config import Config
from .build_log import build_log

EXTENSION = "cl_nv_compiler_options"
VERBOSE = "-cl-nv-verbose"
_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_USED = re.compile(r"Used (\d+) registers")
# Kernels a counting program holds: NVIDIA's log keeps about 6 KB (a 3x3 convolution's
# kernel takes 460 bytes of it: of 16, the first three or four were lost).
CHUNK = 8


def parse_log(log: str) -> dict[str, int]:
    """Entry name -> registers, from a verbose NVIDIA build log (entries it does not count
    are left out)."""
    found: dict[str, int] = {}
    marks = list(_ENTRY.finditer(log))
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(log)
        used = _USED.search(log, m.end(), end)
        if used is not None:
            found[m.group(1)] = int(used.group(1))
    return found


def renamed(name: str, text: str, tag: str) -> str:
    """A candidate's text with its kernel (and the kernel's parts, `codegen.siblings`) named
    `<name>_<tag>`."""
    return re.sub(rf"\b{re.escape(name)}(_part\d+)?\b", rf"{name}_{tag}\1", text)


class RegisterCounts:
    """`counts(name, texts)`: a work-item's registers for each text's kernel `name` (None
    where the driver did not say or the text does not build)."""

    def __init__(self, runtime, options: Sequence[str], cache_dir: Path | None):
        self.runtime = runtime
        self.options = tuple(o for o in options if o != VERBOSE)
        self.cache_dir = cache_dir
        self._known: dict[str, int | None] = {}
        self._lock = threading.Lock()
        self.built = 0  # programs built to count (tests, reports)

    def _key(self, text: str) -> str:
        from .. import memo

        return memo.digest("registers", *self.runtime.info.key, *self.options, text)

    def _path(self, key: str) -> Path | None:
        return None if self.cache_dir is None else self.cache_dir / key[:2] / f"{key}.json"

    def __call__(self, name: str, texts: Sequence[str]) -> list[int | None]:
        from .. import memo

        keys = [self._key(t) for t in texts]
        with self._lock:
            out: dict[str, int | None] = {k: self._known[k] for k in keys if k in self._known}
        for k in keys:
            path = self._path(k)
            if k in out or path is None:
                continue
            found = memo.read_json(path, k)
            if isinstance(found, dict) and isinstance(found.get("registers"), int):
                out[k] = found["registers"]
        todo = {k: t for k, t in zip(keys, texts, strict=True) if k not in out}
        if todo:
            counted = self._build(name, list(todo.values()))
            for k, n in zip(todo, counted, strict=True):
                out[k] = n
                path = self._path(k)
                if n is not None and path is not None:
                    memo.write_json(path, k, {"registers": n})
        with self._lock:
            self._known.update(out)
        return [out[k] for k in keys]

    def _build(self, name: str, texts: list[str]) -> list[int | None]:
        """Verbose builds of the texts, `CHUNK` a program; a text the log leaves out (a
        program the driver refused, a log cut short) is built again on its own."""
        out: list[int | None] = []
        for at in range(0, len(texts), CHUNK):
            out += self._counts(name, texts[at:at + CHUNK])
        for i, n in enumerate(out):
            if n is None and len(texts) > 1:
                out[i] = self._counts(name, [texts[i]])[0]
        return out

    def _counts(self, name: str, texts: list[str]) -> list[int | None]:
        cl = self.runtime.cl
        # Entry names no build has had: NVIDIA's driver keeps programs it built, and one it
        # finds there comes back with an empty log.
        tags = [f"q{secrets.token_hex(6)}" for _ in texts]
        source = "\n".join(renamed(name, t, tag) for t, tag in zip(texts, tags, strict=True))
        program = cl.Program(self.runtime.context, source)
        self.built += 1
        try:
            program.build(options=[*self.options, VERBOSE], cache_dir=False)
        except (cl.Error, RuntimeError):
            return [None] * len(texts)
        found = parse_log(build_log(program, self.runtime.device) or "")
        return [found.get(f"{name}_{tag}") for tag in tags]


def register_counter(runtime, config: Config) -> RegisterCounts | None:
    """The counter for `runtime`'s device, or None where its driver does not say (or the
    config asks for the estimate)."""
    if not config.compiler_registers:
        return None
    try:
        extensions = str(runtime.device.extensions).split()
    except (AttributeError, runtime.cl.Error):  # the query failed: nothing to ask
        return None
    if EXTENSION not in extensions:
        return None
    cache = None
    if config.use_disk_cache:
        from .. import memo

        cache = (config.cache_dir or memo.default_cache_root()) / "registers"
    return RegisterCounts(runtime, config.build_options, cache)


__all__ = ["EXTENSION", "RegisterCounts", "parse_log", "register_counter", "renamed"]
