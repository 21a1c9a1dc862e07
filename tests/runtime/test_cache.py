"""The program cache: in-process reuse, the on-disk entry format, corruption, concurrent writers,
eviction, and `tilec cache`.  Logic tests use a fake device; device tests build real programs
on the CPU device, run them and compare with the reference."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tilec.cli.main import main
from tilec.cli.options import cache_settings, make_config
from tilec.config import Config
from tilec.errors import BuildError
from tilec.runtime.cache import (
    FORMAT,
    CacheWarning,
    ProgramCache,
    decode_entry,
    digest,
    encode_entry,
    key_fields,
)
from tilec.runtime.device import DeviceInfo

from ..device import needs_device

device = needs_device

ROOT = Path(__file__).resolve().parents[2]
MATMUL = ("// shapes: A=12x20 B=20x6\n"
          "function (A[M, K], B[K, N]) -> (C) {\n"
          "  C[m, n : M, N] = +(A[m, k] * B[k, n]);\n"
          "}\n")
RELU = "function (A[N]) -> (B) { B = (A > 0 ? A : 0); }\n"


class FakeRuntime:
    """A device whose 'binary' is the source with a prefix; counts what it is asked to do."""

    def __init__(self, driver: str = "1.0", caches_builds: bool = False) -> None:
        self.context = object()
        self.info = DeviceInfo("FakeCL", "FakeCL 1.2", "fake device", "OpenCL 1.2", driver, "cpu")
        self.driver_caches_builds = caches_builds
        self.source_builds = 0
        self.binary_loads = 0

    def build_source(self, source, options):
        if "syntax error" in source:
            raise BuildError("the OpenCL compiler rejected a generated kernel")
        self.source_builds += 1
        return ("program", source)

    def binary_of(self, program) -> bytes:
        return b"BIN:" + program[1].encode()

    def build_binary(self, binary, options):
        if not binary.startswith(b"BIN:"):
            raise BuildError("fake device refused a program binary: INVALID_BINARY")
        self.binary_loads += 1
        return ("program", binary[4:].decode())


def only_entry(cache: ProgramCache) -> Path:
    entries = cache.entries()
    assert len(entries) == 1, entries
    return entries[0].path


def no_temporaries(cache: ProgramCache) -> bool:
    return not [p for p in cache.directory.iterdir() if not p.name.endswith(".bin")]


# the entry format --------------------------------------------------------------------------------

FIELDS = key_fields(FakeRuntime().info, "kernel source", ("-cl-mad-enable",))


def test_entry_round_trip():
    data = encode_entry(FIELDS, b"\x00binary\xff")
    assert data.startswith(b"TILECBIN")
    assert decode_entry(data, FIELDS) == b"\x00binary\xff"


def test_key_covers_everything_a_binary_depends_on():
    info = FakeRuntime().info
    base = digest(key_fields(info, "src", ("-a",)))
    changed = [key_fields(info, "src2", ("-a",)), key_fields(info, "src", ("-b",)),
               key_fields(replace(info, driver="2.0"), "src", ("-a",)),
               key_fields(replace(info, name="other"), "src", ("-a",)),
               key_fields(replace(info, version="OpenCL 3.0"), "src", ("-a",)),
               key_fields(replace(info, platform_version="FakeCL 9"), "src", ("-a",)),
               {**key_fields(info, "src", ("-a",)), "tilec": "0.0.0"}]
    keys = {digest(f) for f in changed}
    assert base not in keys and len(keys) == len(changed)
    assert key_fields(info, "src", ("-a",))["format"] == FORMAT


def _flip(data: bytes, at: int) -> bytes:
    b = bytearray(data)
    b[at] ^= 0x5A
    return bytes(b)


def _wrong_checksum(data: bytes) -> bytes:
    b = bytearray(data)
    b[24:56] = hashlib.sha256(b"something else").digest()  # the header's checksum field
    return bytes(b)


GOOD = encode_entry(FIELDS, b"BIN:" + b"x" * 200)
CORRUPTIONS = {
    "empty": (b"", "empty"),
    "truncated header": (GOOD[:20], "truncated"),
    "truncated payload": (GOOD[:-7], "truncated"),
    "payload byte flipped": (_flip(GOOD, len(GOOD) - 50), "checksum"),
    "key byte flipped": (_flip(GOOD, 60), "checksum"),
    "wrong checksum": (_wrong_checksum(GOOD), "checksum"),
    "bad magic": (b"NOTTILEC" + GOOD[8:], "not a tilec cache entry"),
    "other format": (GOOD[:8] + (FORMAT + 1).to_bytes(2, "little") + GOOD[10:], "format"),
    "trailing bytes": (GOOD + b"junk", "past the end"),
    "foreign": (encode_entry({**FIELDS, "driver": "9.9"}, b"BIN:x"), "driver differ"),
    "garbage": (os.urandom(300), "not a tilec cache entry"),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_decode_refuses_unusable_entries(kind):
    from tilec.runtime.cache import _Unusable

    data, reason = CORRUPTIONS[kind]
    with pytest.raises(_Unusable, match=reason):
        decode_entry(data, FIELDS)


# hits, misses and builds (fake device) ----------------------------------------------------------

def test_in_process_cache_builds_each_distinct_source_once(tmp_path):
    cache = ProgramCache(tmp_path, enabled=False)
    rt = FakeRuntime()
    sources = ["k1", "k2", "k1", "k1", "k2", "k3"]
    programs = [cache.program(rt, s, ("-cl-mad-enable",)) for s in sources]
    assert rt.source_builds == 3 and cache.stats.builds == 3
    assert cache.stats.memory_hits == 3
    assert programs[0] is programs[2] is programs[3]
    # other options, or another context, are another program
    cache.program(rt, "k1", ("-O0",))
    cache.program(FakeRuntime(), "k1", ("-cl-mad-enable",))
    assert cache.stats.builds == 5


def test_in_process_cache_keeps_the_most_recent_programs(tmp_path, monkeypatch):
    from tilec.runtime import cache as cache_module

    monkeypatch.setattr(cache_module, "MEMORY_PROGRAMS", 2)
    cache = ProgramCache(tmp_path, enabled=False)
    rt = FakeRuntime()
    for s in ["k1", "k2", "k1", "k3", "k1", "k2"]:
        cache.program(rt, s, ())
    assert rt.source_builds == 4  # k2 was the least recently used when k3 came


def test_disk_miss_then_hit(tmp_path):
    first = ProgramCache(tmp_path)
    rt = FakeRuntime()
    first.program(rt, "kernel", ())
    assert first.stats.as_dict() == {"memory_hits": 0, "disk_hits": 0, "builds": 1, "corrupt": 0}
    path = only_entry(first)
    assert path.parent == tmp_path / "programs" and no_temporaries(first)
    second = ProgramCache(tmp_path)  # as a new process would
    rt2 = FakeRuntime()
    assert second.program(rt2, "kernel", ()) == ("program", "kernel")
    assert rt2.source_builds == 0 and rt2.binary_loads == 1
    assert second.stats.disk_hits == 1 and second.stats.builds == 0


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_unusable_entry_is_removed_warned_and_rebuilt(tmp_path, kind):
    cache = ProgramCache(tmp_path)
    cache.program(FakeRuntime(), "kernel", ())
    path = only_entry(cache)
    path.write_bytes(CORRUPTIONS[kind][0])
    again = ProgramCache(tmp_path)
    rt = FakeRuntime()
    with pytest.warns(CacheWarning, match="unusable") as record:
        assert again.program(rt, "kernel", ()) == ("program", "kernel")
    assert str(path) in str(record[0].message)
    assert rt.source_builds == 1 and again.stats.corrupt == 1
    # the rebuilt program was written back, and is now a clean hit
    third = ProgramCache(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        third.program(FakeRuntime(), "kernel", ())
    assert third.stats.disk_hits == 1


def test_binary_the_driver_refuses_counts_as_corrupt(tmp_path):
    rt = FakeRuntime()
    fields = key_fields(rt.info, "kernel", ())
    cache = ProgramCache(tmp_path)
    cache.store(digest(fields), fields, b"not what this driver makes")  # checksum is valid
    with pytest.warns(CacheWarning, match="refused by the driver"):
        assert cache.program(rt, "kernel", ()) == ("program", "kernel")
    assert rt.source_builds == 1 and cache.stats.corrupt == 1
    assert ProgramCache(tmp_path).load(only_entry(cache), fields)[0] == b"BIN:kernel"


def test_changed_driver_version_misses(tmp_path):
    ProgramCache(tmp_path).program(FakeRuntime(driver="1.0"), "kernel", ())
    cache = ProgramCache(tmp_path)
    updated = FakeRuntime(driver="1.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a miss, not a corrupt entry
        cache.program(updated, "kernel", ())
    assert updated.source_builds == 1 and cache.stats.disk_hits == 0
    assert sorted(e.fields["driver"] for e in cache.entries()) == ["1.0", "1.1"]


def test_bad_source_raises_build_error_and_stores_nothing(tmp_path):
    cache = ProgramCache(tmp_path)
    with pytest.raises(BuildError):
        cache.program(FakeRuntime(), "syntax error", ())
    assert cache.entries() == [] and cache.stats.builds == 0


def test_drivers_with_their_own_cache_are_left_to_it(tmp_path):
    rt = FakeRuntime(caches_builds=True)
    ProgramCache(tmp_path).program(rt, "kernel", ())
    assert not (tmp_path / "programs").exists()
    ProgramCache(tmp_path, all_drivers=True).program(rt, "kernel", ())
    assert len(ProgramCache(tmp_path).entries()) == 1


def test_disabled_disk_cache_writes_nothing(tmp_path):
    ProgramCache(tmp_path, enabled=False).program(FakeRuntime(), "kernel", ())
    assert not tmp_path.joinpath("programs").exists()


def test_unwritable_directory_warns_once_and_still_builds(tmp_path):
    root = tmp_path / "a-file"
    root.write_text("not a directory")
    cache = ProgramCache(root)
    rt = FakeRuntime()
    with pytest.warns(CacheWarning, match="cannot write") as record:
        cache.program(rt, "k1", ())
        cache.program(rt, "k2", ())
    assert len(record) == 1 and rt.source_builds == 2


# eviction ---------------------------------------------------------------------------------------

def _fill(cache: ProgramCache, names: list[str]) -> dict[str, Path]:
    rt = FakeRuntime()
    paths = {}
    for i, name in enumerate(names):
        before = {e.path for e in cache.entries()}
        cache.program(rt, name * 400, ())
        (path,) = {e.path for e in cache.entries()} - before
        os.utime(path, (1_000_000 + i, 1_000_000 + i))  # a distinct, known age
        paths[name] = path
    return paths


def test_least_recently_used_entries_go_past_the_cap(tmp_path):
    entry = len(encode_entry(key_fields(FakeRuntime().info, "a" * 400, ()), b"BIN:" + b"a" * 400))
    cache = ProgramCache(tmp_path, max_bytes=3 * entry + 10)
    paths = _fill(cache, ["a", "b", "c"])
    ProgramCache(tmp_path).program(FakeRuntime(), "a" * 400, ())  # a disk hit makes "a" recent
    assert paths["a"].stat().st_mtime > paths["c"].stat().st_mtime
    _fill(cache, ["d"])
    assert sorted(p.name for p in paths.values() if p.exists()) == sorted(
        [paths["a"].name, paths["c"].name])
    assert cache.total_bytes() <= cache.max_bytes


def test_entry_larger_than_the_cap_is_not_written(tmp_path):
    cache = ProgramCache(tmp_path, max_bytes=100)
    cache.program(FakeRuntime(), "x" * 1000, ())
    assert cache.entries() == []


def test_stale_temporary_files_are_removed(tmp_path):
    cache = ProgramCache(tmp_path)
    cache.directory.mkdir(parents=True)
    stale, fresh = cache.directory / ".tmp-dead.part", cache.directory / ".tmp-live.part"
    stale.write_bytes(b"half")
    fresh.write_bytes(b"half")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    cache.program(FakeRuntime(), "kernel", ())
    assert not stale.exists() and fresh.exists()


# the command line ---------------------------------------------------------------------------------

def test_cache_info_and_clear(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path))
    ProgramCache(tmp_path).program(FakeRuntime(), "kernel", ())
    assert main(["cache", "info", "--list"]) == 0
    out = capsys.readouterr().out
    assert f"directory: {tmp_path / 'programs'}" in out
    assert "entries:   1" in out and "cap:       256.0 MiB" in out
    assert "fake device (driver 1.0)" in out
    assert main(["cache", "clear"]) == 0
    assert "removed 1 entry" in capsys.readouterr().out
    assert ProgramCache(tmp_path).entries() == []
    assert main(["cache", "info"]) == 0
    assert "entries:   0" in capsys.readouterr().out


def test_only_the_cli_reads_tilec_cache_dir(tmp_path, monkeypatch):
    import argparse

    import platformdirs

    from tilec.runtime import cache

    monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path))
    assert cache_settings() == {"cache_dir": tmp_path}
    assert make_config(argparse.Namespace()).cache_dir == tmp_path
    assert Config().cache_dir is None
    assert ProgramCache.for_config(Config()).root == cache.default_cache_root()
    assert ProgramCache.for_config(Config()).root != tmp_path
    user = Path(platformdirs.user_cache_dir("tilec"))
    assert cache.default_cache_root() != user  # conftest keeps tests out of the user's cache


# real programs on the device --------------------------------------------------------------------

def _config(tmp_path: Path, **kw) -> Config:
    return Config(cache_dir=tmp_path, disk_cache_all_drivers=True, **kw)


def _run_checked(exe) -> None:
    rng = np.random.default_rng(3)
    arrays = {n: rng.uniform(-1, 1, exe.program.tensors[n].shape).astype(np.float32)
              for n in exe.program.inputs}
    outs = exe.run(arrays, poison=True)
    v = exe.check(exe._inputs(arrays), outs)
    assert v.ok, v.worst


def _rebuilt(exe, cache: ProgramCache):
    """`exe`'s kernels through another cache (as another process would get them), run."""
    from tilec.compiler import Executable

    prg = cache.program(exe.runtime, exe.source, exe.config.build_options)
    again = Executable(exe.program, exe.plan, exe.sources, exe.runtime, exe.hw, exe.config,
                       built=prg)
    _run_checked(again)
    return again


@device
def test_device_miss_then_hit_with_correct_results(tmp_path):
    from tilec.compiler import compile as tile_compile

    cfg = _config(tmp_path)
    exe = tile_compile(MATMUL, config=cfg)
    _run_checked(exe)
    stats = exe.runtime.cache_for(cfg).stats
    assert (stats.builds, stats.disk_hits) == (1, 0)
    cache = ProgramCache.for_config(cfg)
    _rebuilt(exe, cache)
    assert (cache.stats.builds, cache.stats.disk_hits) == (0, 1)


@device
@pytest.mark.parametrize("kind", ["truncate", "flip", "checksum", "empty", "refused"])
def test_device_corrupt_entry_is_rebuilt_with_correct_results(tmp_path, kind):
    from tilec.compiler import compile as tile_compile

    cfg = _config(tmp_path)
    exe = tile_compile(MATMUL, config=cfg)
    path = only_entry(ProgramCache.for_config(cfg))
    data = path.read_bytes()
    if kind == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "flip":
        path.write_bytes(_flip(data, len(data) - 100))
    elif kind == "checksum":
        path.write_bytes(_wrong_checksum(data))
    elif kind == "empty":
        path.write_bytes(b"")
    else:  # a well-formed entry whose payload the driver does not take
        fields = key_fields(exe.runtime.info, exe.source, cfg.build_options)
        path.write_bytes(encode_entry(fields, b"hello, driver"))
    cache = ProgramCache.for_config(cfg)
    with pytest.warns(CacheWarning, match="unusable"):
        _rebuilt(exe, cache)
    assert (cache.stats.corrupt, cache.stats.builds) == (1, 1)
    fields = key_fields(exe.runtime.info, exe.source, cfg.build_options)
    assert cache.load(only_entry(cache), fields) is not None  # valid again


@device
def test_device_changed_driver_version_misses(tmp_path):
    from tilec.compiler import compile as tile_compile
    from tilec.runtime.device import Runtime

    cfg = _config(tmp_path)
    exe = tile_compile(MATMUL, config=cfg)
    updated = Runtime(exe.runtime.device)
    updated.info = replace(updated.info, driver=updated.info.driver + "-updated")
    cache = ProgramCache.for_config(cfg)
    cache.program(updated, exe.source, cfg.build_options)
    assert (cache.stats.builds, cache.stats.disk_hits) == (1, 0)
    assert len(cache.entries()) == 2


@device
def test_device_in_process_cache_builds_each_program_once(tmp_path):
    from tilec.compiler import compile as tile_compile

    cfg = Config(cache_dir=tmp_path)
    programs = [(MATMUL, None), (RELU, {"A": (33,)}), (MATMUL, None), (RELU, {"A": (33,)}),
                (MATMUL, None)]
    exes = [tile_compile(src, shapes, config=cfg) for src, shapes in programs]
    stats = exes[0].runtime.cache_for(cfg).stats
    assert (stats.builds, stats.memory_hits) == (2, 3)
    for exe in exes:
        _run_checked(exe)


CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import numpy as np
    from tilec.compiler import compile as tile_compile
    from tilec.config import Config

    root, go, program = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[4]).read_text()
    Path(sys.argv[3]).touch()  # ready: imports done
    while not go.exists():
        time.sleep(0.005)
    exe = tile_compile(program, config=Config(cache_dir=root,
                                                      disk_cache_all_drivers=True))
    rng = np.random.default_rng(7)
    arrays = {n: rng.uniform(-1, 1, exe.program.tensors[n].shape).astype(np.float32)
              for n in exe.program.inputs}
    outs = exe.run(arrays, poison=True)
    v = exe.check(exe._inputs(arrays), outs)
    stats = exe.runtime.cache_for(exe.config).stats
    print("ok" if v.ok else "MISMATCH " + v.worst, stats.builds, stats.disk_hits)
""")


@device
@pytest.mark.slow
def test_two_processes_building_the_same_kernel(tmp_path):
    root, go, program = tmp_path / "cache", tmp_path / "go", tmp_path / "mm.tile"
    program.write_text(MATMUL)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs, ready = [], []
    for i in range(2):
        ready.append(tmp_path / f"ready{i}")
        procs.append(subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), str(go), str(ready[-1]), str(program)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    deadline = time.monotonic() + 120
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()  # both start compiling together
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert "CacheWarning" not in err, err
        results.append(out.split())
    assert [r[0] for r in results] == ["ok", "ok"]
    cache = ProgramCache(root)
    path = only_entry(cache)
    assert no_temporaries(cache)
    fields = cache.entries()[0].fields
    assert fields is not None and cache.load(path, fields) is not None


def test_cache_paths_given_as_strings_are_paths(tmp_path):
    # A user writes `Config(cache_dir="/some/dir")`: every stage joins paths onto it.
    cfg = Config(cache_dir=str(tmp_path), records_path=str(tmp_path / "t.jsonl"))
    assert cfg.cache_dir == tmp_path and cfg.records_path == tmp_path / "t.jsonl"
    assert Config().cache_dir is None
