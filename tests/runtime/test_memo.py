"""What later processes reuse besides program binaries: the search's choices, the parser's
tables, compiled templates and the device probe.  Each must be ignored (and rewritten) when
damaged, and never change a result."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tilec
from tilec import memo
from tilec.config import Config
from tilec.plan.fuse import plan_kernels
from tilec.plan.hw import HwModel
from tilec.plan.search import forget, search

CONV = """function (D[N, X, Y, CI], K[I, J, CO, CI]) -> (R) {
  O[n, x, y, co : N, X, Y, CO] = +(D[n, x+i-1, y+j-1, ci] * K[i, j, co, ci]);
  R = (O > 0 ? O : 0);
}"""
SHAPES = {"D": (1, 12, 10, 8), "K": (3, 3, 16, 8)}


def _flat():
    prog = tilec.check_program(CONV, SHAPES)
    return plan_kernels(prog).kernels[0].flat


# -- memo files ----------------------------------------------------------------------------------

def test_memo_round_trip_and_key(tmp_path):
    p = tmp_path / "a" / "b.bin"
    assert memo.write(p, "k1", b"hello")
    assert memo.read(p, "k1") == b"hello"
    assert memo.read(p, "k2") is None  # made for another key
    assert memo.read(tmp_path / "missing", "k1") is None
    assert not list(p.parent.glob(".tmp-*"))


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage", "head"])
def test_memo_damaged_file_is_ignored(tmp_path, damage):
    p = tmp_path / "x.bin"
    memo.write(p, "k", b"0123456789" * 10)
    data = p.read_bytes()
    if damage == "truncate":
        p.write_bytes(data[:-7])
    elif damage == "flip":
        p.write_bytes(data[:-3] + bytes([data[-3] ^ 0x40]) + data[-2:])
    elif damage == "empty":
        p.write_bytes(b"")
    elif damage == "garbage":
        p.write_bytes(b"\x00\xff" * 50)
    else:
        p.write_bytes(data.replace(b'"length"', b'"lenxth"'))
    assert memo.read(p, "k") is None


def test_memo_unwritable_directory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert memo.write(blocker / "x.bin", "k", b"data") is False


# -- the search cache --------------------------------------------------------------------------

def test_search_cache_reuses_the_outcome(tmp_path):
    flat, hw = _flat(), HwModel.load("pocl-cpu")
    first = search(flat, hw, post_ops=1, top_k=5, cache=tmp_path)
    assert not first.cached
    files = list(tmp_path.rglob("*.json"))
    assert len(files) == 1
    again = search(flat, hw, post_ops=1, top_k=5, cache=tmp_path)
    assert again.cached and "read from the search cache" in again.describe()
    assert again.tile == first.tile
    assert [t for t, _ in again.top] == [t for t, _ in first.top]
    assert [c.score for c in again.costs] == [c.score for c in first.costs]
    assert again.cost.log_text() == first.cost.log_text()
    assert (again.candidates_scored, again.rejected_memory, again.rejected_regs) == (
        first.candidates_scored, first.rejected_memory, first.rejected_regs)


def test_search_cache_key_covers_model_and_settings(tmp_path):
    flat = _flat()
    search(flat, HwModel.load("pocl-cpu"), top_k=5, cache=tmp_path)
    assert not search(flat, HwModel.load("nvidia-h100"), top_k=5, cache=tmp_path).cached
    assert not search(flat, HwModel.load("pocl-cpu"), top_k=3, cache=tmp_path).cached
    assert not search(flat, HwModel.load("pocl-cpu"), post_ops=2, top_k=5,
                      cache=tmp_path).cached
    assert search(flat, HwModel.load("pocl-cpu"), top_k=5, cache=tmp_path).cached


@pytest.mark.parametrize("bad", ["bytes", "tile-out-of-range", "wrong-rank", "no-top"])
def test_search_cache_bad_entry_is_searched_again(tmp_path, bad):
    flat, hw = _flat(), HwModel.load("pocl-cpu")
    first = search(flat, hw, top_k=4, cache=tmp_path)
    (path,) = tmp_path.rglob("*.json")
    key = path.stem
    body = json.loads(memo.read(path, key))
    if bad == "bytes":
        path.write_bytes(path.read_bytes()[:-5])
    else:
        if bad == "tile-out-of-range":
            body["top"][0] = [r + 1 for r in flat.ranges]
        elif bad == "wrong-rank":
            body["top"][0] = body["top"][0][:-1]
        else:
            del body["top"]
        memo.write_json(path, key, body)
    forget()  # as a new process: the cache directory alone
    again = search(flat, hw, top_k=4, cache=tmp_path)
    assert not again.cached and again.tile == first.tile
    # ... and the entry was written anew.
    assert search(flat, hw, top_k=4, cache=tmp_path).cached


def test_compile_uses_the_search_cache_and_results_hold(tmp_path):
    rng = np.random.default_rng(3)
    d = rng.standard_normal(SHAPES["D"]).astype(np.float32)
    k = rng.standard_normal(SHAPES["K"]).astype(np.float32)
    cfg = Config(cache_dir=tmp_path, use_tuning_records=False, hw="pocl-cpu")
    first = tilec.compile(CONV, SHAPES, config=cfg)
    assert not next(iter(first.searches.values())).cached
    assert list((tmp_path / "search").rglob("*.json"))
    second = tilec.compile(CONV, SHAPES, config=cfg)
    assert next(iter(second.searches.values())).cached
    assert second.source == first.source
    got = second.run({"D": d, "K": k}, poison=True)
    ref = tilec.evaluate(CONV, D=d, K=k)
    np.testing.assert_allclose(got["R"], ref["R"], rtol=1e-4, atol=1e-4)
    # Without the disk cache nothing is kept.
    off = tmp_path / "off"
    tilec.compile(CONV, SHAPES, config=Config(cache_dir=off, use_disk_cache=False,
                                              use_tuning_records=False, hw="pocl-cpu"))
    assert not (off / "search").exists()


# -- parser, templates, probe ----------------------------------------------------------------------

def test_parser_tables_are_cached_and_a_damaged_file_is_rebuilt(_private_program_cache):
    import importlib

    parse_mod = importlib.import_module("tilec.lang.parse")
    expected = tilec.parse(CONV)
    parse_mod._parser.cache_clear()
    parse_mod._parser()
    (path,) = (_private_program_cache / "parser").glob("*.bin")
    good = path.read_bytes()
    key = json.loads(good.split(b"\n", 2)[1])["key"]
    try:
        for damaged in (good[: len(good) // 2], b"", good[:-1] + bytes([good[-1] ^ 1])):
            path.write_bytes(damaged)
            parse_mod._parser.cache_clear()
            f = tilec.parse(CONV)
            assert f == expected and len(f.stmts) == 2
            assert memo.read(path, key) is not None  # rebuilt and stored again
            with pytest.raises(tilec.TileError, match=r"1:1: unexpected .func"):
                tilec.parse("func")
    finally:
        parse_mod._parser.cache_clear()


def test_probe_result_is_remembered(_private_program_cache, monkeypatch):
    from tilec.runtime import device as runtime

    runtime.probe_result.cache_clear()  # probe into this test's private cache directory
    dev = runtime.choose_device()
    info = runtime.describe(dev)
    assert runtime._known_good(info)
    width = runtime.probe_result(dev).vector_limit
    assert width in runtime.PROBE_WIDTHS
    calls = []
    monkeypatch.setattr(runtime, "_run_probe", lambda *a: calls.append(a) or 0)
    runtime.probe_result.cache_clear()
    assert runtime.describe(runtime.choose_device()) == info
    assert runtime.probe_result(dev).vector_limit == width
    assert not calls
    # A damaged file: the devices are probed again.
    runtime._known_good_path().write_bytes(b"junk")
    assert not runtime._known_good(info)
    runtime.probe_result.cache_clear()
    assert runtime.probe_result(dev).problem is not None  # the stand-in probe computes wrongly
    assert calls
    runtime.probe_result.cache_clear()


def test_probe_kernels_check_every_lane():
    """The probe's kernels are correct OpenCL whose expected results the host computes: on a
    device that computes them right, every width passes (checked on the chosen device)."""
    from tilec.runtime import device as runtime

    dev = runtime.choose_device()
    for w in runtime.PROBE_WIDTHS:
        text = runtime._probe_kernel(w)
        assert f"tilec_probe{w}" in text
        assert text.count("b[g * ") == w
    assert runtime.probe_result(dev).problem is None


def test_cache_info_and_clear_cover_search_results(tmp_path, monkeypatch, capsys):
    from tilec.cli.main import main

    monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path))
    flat, hw = _flat(), HwModel.load("pocl-cpu")
    search(flat, hw, top_k=2, cache=tmp_path / "search")
    search(flat, hw, top_k=3, cache=tmp_path / "search")
    assert main(["cache", "info"]) == 0
    assert "search:    2 files" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert f"removed 2 files from {tmp_path / 'search'}" in capsys.readouterr().out
    assert not list((tmp_path / "search").rglob("*.json"))
    assert not search(flat, hw, top_k=2, cache=tmp_path / "search").cached
