"""Measured tuning: work-size candidates, the report card, tuning records, and `tune` itself
(with an injected timer, so that which candidate wins does not depend on this machine)."""

from __future__ import annotations

import json
import multiprocessing
import warnings
from dataclasses import replace

import numpy as np
import pytest

from tilec.cli.main import main
from tilec.compiler import compile as tile_compile
from tilec.config import Config
from tilec.lang.reference import random_array
from tilec.plan.worksize import (
    elementwise_local_sizes,
    mace_local_sizes,
    pow2_local_sizes,
    thread_budgets,
)
from tilec.tune import bench as bench_mod
from tilec.tune import measure as tune_mod
from tilec.tune.measure import spearman, tune
from tilec.tune.records import DeviceKey, RecordStore, TuneRecord, default_path

from ..device import needs_device

device = needs_device

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"
MM_SHAPES = {"A": (16, 24), "B": (24, 20)}
ELEMENTWISE = "function (X[R, C], Y[R, C]) -> (Z) { Z = X * Y + X; }"
EW_SHAPES = {"X": (10, 13), "Y": (10, 13)}


# -- work sizes (no device) ----------------------------------------------------------------------

def test_mace_3d_list_is_filtered_by_kernel_and_device_limits():
    got = mace_local_sizes((16, 8, 32), kwg=64, items=(64, 64, 64))
    assert got and all(a * b * c <= 64 for a, b, c in got)
    assert (1, 8, 8) in got and (4, 8, 1) in got
    assert (16, 8, 32) not in got  # 4096 work-items: over the kernel's maximum
    narrow = mace_local_sizes((16, 8, 32), kwg=64, items=(2, 64, 64))
    assert narrow and all(a <= 2 for a, _, _ in narrow)


def test_mace_2d_list_splits_the_kernel_maximum():
    got = mace_local_sizes((100, 100), kwg=256, items=(256, 256, 256))
    assert (128, 2) in got and (1, 256) in got and (256, 1) in got
    assert all(a * b <= 256 for a, b in got)


def test_mace_1d_list_and_mnn_sweep():
    got = [c[0] for c in mace_local_sizes((1000,), kwg=256, items=(128,), compute_units=2)]
    assert max(got) <= 128 and 4 in got and 1 in got
    assert 125 in got and 250 not in got  # MACE's gws/8 fits; gws/4 passes the item size
    sweep = pow2_local_sizes((20,), kwg=1024, items=(1024,))
    assert sweep == [(1,), (2,), (4,), (8,), (16,), (32,)]  # up to twice the global size
    assert pow2_local_sizes((4, 4), kwg=8, items=(8, 8)) == [
        (1, 1), (1, 2), (1, 4), (1, 8), (2, 1), (2, 2), (2, 4), (4, 1), (4, 2), (8, 1)]
    assert thread_budgets(64, kwg=32, items=(16,)) == [1, 2, 4, 8, 16]
    sizes = elementwise_local_sizes(130, kwg=64, items=(64,))
    assert sizes[0] is None and sizes[1:] == sorted(sizes[1:]) and max(sizes[1:]) <= 64


def test_spearman():
    assert spearman([0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0]) == pytest.approx(1.0)
    assert spearman([0, 1, 2, 3], [4.0, 3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    assert spearman([0, 1, 2], [1.0, 1.0, 2.0]) == pytest.approx(0.8660254)
    assert spearman([0], [1.0]) is None
    assert spearman([0, 1], [1.0, 1.0]) is None


# -- records (no device) -------------------------------------------------------------------------

KEY = DeviceKey("Plat", "OpenCL 3.0", "Dev", "1.2")


def record(i: int = 0, **kw) -> TuneRecord:
    base = TuneRecord(KEY, "contract_C", f"digest{i}", (("A", (2, 3)),), (("m", 2),), 4, None,
                      1e-3 * (i + 1), rho=0.5, regret=1.25, candidates=3)
    return replace(base, **kw)


def test_record_round_trip_and_default_path(tmp_path):
    r = record()
    assert TuneRecord.from_json(json.loads(json.dumps(r.to_json()))) == r
    assert default_path(Config(records_path=tmp_path / "x.jsonl")) == tmp_path / "x.jsonl"
    assert default_path(Config(cache_dir=tmp_path)) == tmp_path / "tuning.jsonl"
    assert r.tile_for(("m",), (4,)) == (2,)
    assert r.tile_for(("m", "n"), (4, 4)) is None  # another kernel's indices
    assert r.tile_for(("m",), (1,)) is None  # a size past the range


def test_store_skips_corrupt_lines_and_last_record_wins(tmp_path):
    store = RecordStore(tmp_path / "r.jsonl")
    store.append([record(0), record(1)])
    with open(store.path, "a") as f:
        f.write('{"version": 1, "kernel": \n')  # a writer that died mid-line
        f.write("not json at all\n")
        f.write(json.dumps({**record(2).to_json(), "version": 99}) + "\n")
    store.append([record(0, seconds=5.0)])
    with pytest.warns(UserWarning, match="skipped 3 unreadable"):
        got = store.load()
    assert len(got) == 2
    assert got[record(0).key].seconds == 5.0


def _append_many(path: str, worker: int) -> None:
    store = RecordStore(path)
    for i in range(40):
        store.append([record(1000 * worker + i, kernel="k" * 300)])


def test_concurrent_writers_do_not_corrupt_the_file(tmp_path):
    path = tmp_path / "r.jsonl"
    # fork: the children only write files, and spawning would re-import OpenCL in each.
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = RecordStore(path).load()
    assert len(got) == 160


# -- tuning on the device --------------------------------------------------------------------------

def inputs_for(exe, seed=0):
    rng = np.random.default_rng(seed)
    return {n: random_array(rng, exe.program.tensors[n].shape, exe.program.tensors[n].dtype)
            for n in exe.program.inputs}


def assert_correct(exe):
    arrays = inputs_for(exe)
    outs = exe.run(arrays, poison=True)
    v = exe.check(exe._inputs(arrays), outs)
    assert v.ok, v.worst


@device
def test_injected_timer_picks_the_fastest_and_compile_uses_it(tmp_path):
    config = Config(records_path=tmp_path / "r.jsonl")
    times = {0: 3e-3, 1: 2e-3, 2: 1e-3}  # the model's last choice is the fastest

    report = tune(MATMUL, MM_SHAPES, config=config, top_k=3, timer=lambda c: times[c.rank])
    (k,) = report.kernels
    tiles = [m for m in k.results if m.candidate.phase == "tile"]
    assert [m.status for m in tiles] == ["ok"] * 3
    assert k.best is k.results[2]
    assert k.regret == pytest.approx(3.0)
    assert k.rho == pytest.approx(-1.0)
    assert k.gain == pytest.approx(3.0)
    assert report.records_path == tmp_path / "r.jsonl"
    rec = k.record
    assert rec is not None and rec.seconds == 1e-3 and rec.candidates == len(k.results)

    exe = tile_compile(MATMUL, MM_SHAPES, config=config)
    assert set(exe.tuned) == {"contract_C"}
    assert exe.kernels[0].tile == dict(rec.tile)
    assert "tuned: measured" in exe.cost_log
    assert_correct(exe)
    plain = tile_compile(MATMUL, MM_SHAPES, config=replace(config, use_tuning_records=False))
    assert plain.tuned == {} and plain.kernels[0].tile == dict(k.results[0].candidate.tile)
    forced = tile_compile(MATMUL, MM_SHAPES, config=replace(config, tiles={"*": {"m": 1}}))
    assert forced.tuned == {}  # a forced tile wins over a record


@device
def test_a_difference_inside_the_noise_keeps_the_models_choice(tmp_path):
    config = Config(records_path=tmp_path / "r.jsonl")
    near = tune(MATMUL, MM_SHAPES, config=config, top_k=3,
                timer=lambda c: {0: 1.00e-3, 1: 0.98e-3, 2: 1.05e-3}[c.rank])
    (k,) = near.kernels
    assert k.best is k.first and k.gain == pytest.approx(1.0)
    assert k.regret == pytest.approx(1.0 / 0.98)  # the report card still says what was seen
    assert k.record.tile == k.first.candidate.tile
    far = tune(MATMUL, MM_SHAPES, config=config, top_k=3,
               timer=lambda c: {0: 1.00e-3, 1: 0.90e-3, 2: 1.05e-3}[c.rank])
    assert far.kernels[0].best.candidate.rank == 1


def test_noise_margin_grows_with_the_spread():
    from tilec.tune.measure import Measurement, _clearly_faster

    c = object()
    first = Measurement(c, "ok", 1.0e-3, spread=0.01)  # type: ignore[arg-type]
    assert _clearly_faster(Measurement(c, "ok", 0.9e-3, spread=0.02), first)  # type: ignore
    assert not _clearly_faster(Measurement(c, "ok", 0.9e-3, spread=0.2), first)  # type: ignore
    assert not _clearly_faster(Measurement(c, "ok", 0.98e-3), first)  # type: ignore


@device
def test_a_wrong_candidate_is_reported_and_never_chosen(tmp_path, monkeypatch):
    real = tune_mod.variant

    def broken(kernel, plan, hw, config, tile, threads, code=""):
        src = real(kernel, plan, hw, config, tile, threads, code)
        if tile == broken.victim:  # launch too few groups: some outputs stay poisoned
            return replace(src, global_size=src.local_size)
        return src

    plain = tune(MATMUL, MM_SHAPES, config=Config(), top_k=3, timer=lambda c: 1.0, save=False)
    broken.victim = tuple(t for _, t in plain.kernels[0].results[1].candidate.tile)
    monkeypatch.setattr(tune_mod, "variant", broken)
    report = tune(MATMUL, MM_SHAPES, config=Config(records_path=tmp_path / "r.jsonl"),
                  top_k=3, timer=lambda c: 1e-6 if c.rank == 1 else 1e-3)
    (k,) = report.kernels
    assert k.results[1].status == "failed" and "expected" in k.results[1].note
    assert k.best is not None and k.best.candidate.rank != 1
    assert k.record.tile != k.results[1].candidate.tile


@device
def test_local_sizes_of_an_elementwise_kernel(tmp_path):
    config = Config(records_path=tmp_path / "r.jsonl")
    report = tune(ELEMENTWISE, EW_SHAPES, config=config, lws=True,
                  timer=lambda c: 1e-6 if c.local_size == 64 else 1e-3)
    (k,) = report.kernels
    assert k.results[0].candidate.local_size is None  # the driver's choice comes first
    assert len(k.results) > 4 and all(m.status == "ok" for m in k.results)
    assert k.record.local_size == 64
    exe = tile_compile(ELEMENTWISE, EW_SHAPES, config=config)
    (src,) = exe.sources
    assert src.local_size == 64 and src.global_size == 192  # 130 rounded up
    assert_correct(exe)


@device
def test_thread_counts_of_a_contraction(tmp_path):
    # PlaidML's ranking: its first tile has several output threads to vary (the time model
    # gives this launch-bound matmul one work-item a group).
    config = Config(records_path=tmp_path / "r.jsonl", hw="nvidia-h100", cost_model="plaidml")
    shapes = {"A": (32, 16), "B": (16, 32)}
    report = tune(MATMUL, shapes, config=config, top_k=2, lws=True, lws_tiles=1,
                  timer=lambda c: 1e-6 if c.phase == "lws" and c.local_size == 2 else 1e-3)
    (k,) = report.kernels
    first = k.results[0].candidate
    lws = [m.candidate for m in k.results if m.candidate.phase == "lws"]
    assert {c.local_size for c in lws} | {first.local_size} >= {1, 2, 4}
    assert all(c.tile == first.tile for c in lws)  # lws_tiles=1: the best tile only
    assert k.record.threads == 2 and k.record.tile == first.tile
    assert k.regret == pytest.approx(1.0)  # the tiles themselves timed alike
    exe = tile_compile(MATMUL, shapes, config=config)
    assert exe.sources[-1].local_size == 2
    assert_correct(exe)


@device
def test_budget_measures_only_each_kernels_first_choice(tmp_path):
    report = tune(MATMUL, MM_SHAPES, config=Config(), top_k=3, budget=1e-9, save=False)
    (k,) = report.kernels
    assert [m.status for m in k.results] == ["ok", "skipped", "skipped"]
    assert k.results[0].seconds > 0 and report.records_path is None
    assert k.best is k.results[0] and k.rho is None


@device
def test_records_of_another_device_are_ignored(tmp_path):
    path = tmp_path / "r.jsonl"
    config = Config(records_path=path)
    report = tune(MATMUL, MM_SHAPES, config=config, top_k=2, timer=lambda c: 1.0,
                  save=False)
    rec = report.kernels[0].record
    other = replace(rec, device=replace(rec.device, driver="another driver"))
    RecordStore(path).append([other])
    assert tile_compile(MATMUL, MM_SHAPES, config=config).tuned == {}
    RecordStore(path).append([rec])
    assert set(tile_compile(MATMUL, MM_SHAPES, config=config).tuned) == {"contract_C"}


@device
def test_cli_tune_prints_the_report_card_and_run_uses_the_record(tmp_path, capsys):
    prog = tmp_path / "mm.tile"
    prog.write_text("// shapes: A=16x24 B=24x20\n" + MATMUL + "\n")
    records = tmp_path / "r.jsonl"
    assert main(["tune", str(prog), "--top-k", "2", "--repeat", "2", "--warmup", "1",
                 "--records", str(records), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "contract_C (contraction, 2 candidates)" in out
    assert "rho " in out and "regret " in out and "GFLOP/s" in out
    assert f"records appended to {records}" in out
    assert main(["run", str(prog), "--records", str(records), "--repeat", "1"]) == 0
    assert "(tuned)" in capsys.readouterr().out
    assert main(["run", str(prog), "--records", str(records), "--no-records",
                 "--repeat", "1"]) == 0
    assert "(tuned)" not in capsys.readouterr().out


def test_cli_tune_rejects_bad_options(tmp_path, capsys):
    prog = tmp_path / "mm.tile"
    prog.write_text("// shapes: A=4x4 B=4x4\n" + MATMUL + "\n")
    assert main(["tune", str(prog), "--top-k", "0"]) == 1
    assert "--top-k" in capsys.readouterr().err
    assert main(["tune", str(prog), "--budget", "-1"]) == 1



def _timed(monkeypatch, cold: bool, durations: list[float]):
    """`Bench.time` over fake kernels whose "event" is their duration (the first launch of
    all 10x slower where `cold`): the times and the launches made."""
    from types import SimpleNamespace

    calls: list[float] = []

    class FakeRuntime:
        def launch(self, kernel, global_size, local_size, args):
            slow = cold and not calls
            calls.append(kernel)
            return kernel * (10 if slow else 1)

    monkeypatch.setattr(bench_mod, "event_seconds", lambda ev: ev)
    bench = bench_mod.Bench.__new__(bench_mod.Bench)
    bench.runtime = FakeRuntime()
    bench.copies = [{}]
    bench._args = lambda src, copy=0: []
    src = SimpleNamespace(global_size=1, local_size=1)
    out = bench.time([(src, d) for d in durations], warmup=1, repeat=5)
    return [t for t, _ in out], calls


def test_far_slower_candidates_are_timed_once(monkeypatch):
    times, calls = _timed(monkeypatch, False, [1e-3, 1.1e-3, 9e-3])  # 8 ms slower
    assert times == [1e-3, 1.1e-3, 9e-3]
    assert calls.count(9e-3) == 2  # the scouting runs only
    assert calls.count(1e-3) == 2 + 1 + 5  # scouting, warm-up, timed runs


def test_microsecond_candidates_are_timed_in_full(monkeypatch):
    """A kernel of a microsecond 20x slower than the fastest on its scouting launches (an
    awaited launch waking the device's threads) is still timed in every round: its repeats
    cost nothing, and a cold scouting time must not stand as its time."""
    times, calls = _timed(monkeypatch, True, [0.4e-6, 8e-6, 0.5e-6])
    assert times == [0.4e-6, 8e-6, 0.5e-6]
    assert calls.count(8e-6) == calls.count(0.4e-6) == calls.count(0.5e-6) == 2 + 1 + 5


def test_a_cold_first_launch_does_not_make_a_candidate_slow(monkeypatch):
    """The first launch after validation may be cold (10x its time after, the device's
    threads asleep): the scouting keeps a candidate's faster launch, so the first candidate
    is timed in full, not once at its cold time."""
    times, calls = _timed(monkeypatch, True, [1e-3, 1.2e-3])
    assert times == [1e-3, 1.2e-3]
    assert calls.count(1e-3) == calls.count(1.2e-3) == 2 + 1 + 5


def test_quick_tolerance_passes_nothing_that_compare_fails():
    """Validation checks float32 outputs in one pass against a tolerance made from the
    reference; whatever passes it must pass `compare` too (a miss goes to `compare`)."""
    from types import SimpleNamespace

    from tilec.runtime.validate import compare

    rng = np.random.default_rng(3)
    ref = (rng.standard_normal(150) * 10.0 ** rng.integers(-6, 6, 150)).astype(np.float32)
    ref[:3] = [np.nan, np.inf, 0.0]
    config = Config()
    tol = bench_mod.tolerance(ref, config)
    r64 = ref.astype(np.float64)
    exact = config.atol * float(np.max(np.abs(r64[np.isfinite(r64)]))) + config.rtol * np.abs(r64)
    program = SimpleNamespace(tensors={"R": SimpleNamespace(dtype="float32")})
    quick_passed = {}
    for k in (0.5, 0.999999, 1.0, 1.000001, 2.0):
        for sign in (1.0, -1.0):
            for i in range(3, ref.size):
                got = ref.copy()
                got[i] = np.float32(r64[i] + sign * k * exact[i])
                with np.errstate(invalid="ignore"):
                    quick = bool(np.all((np.abs(got - ref) <= tol)[3:]))
                quick_passed[k] = quick_passed.get(k, 0) + quick
                if quick:
                    assert compare({"R": ref[3:]}, {"R": got[3:]}, program, config).ok, (k, i)
    assert quick_passed[0.5] == 2 * (ref.size - 3)  # well inside: settled in one pass
    assert quick_passed[2.0] == 0


def _logged_time(monkeypatch, durations, warmup: int, repeat: int, slow_first: bool = False):
    """`Bench.time` over fake kernels whose event is their duration, with a log of launches
    and waits (each round's first launch 10x slower where `slow_first`): the times, the log."""
    from types import SimpleNamespace

    log: list[str] = []

    class FakeRuntime:
        def launch(self, kernel, global_size, local_size, args):
            first = not log or log[-1] == "wait"
            log.append("launch")
            return kernel * (10 if slow_first and first else 1)

    def awaited(ev):
        log.append("wait")
        return ev

    monkeypatch.setattr(bench_mod, "event_seconds", awaited)
    bench = bench_mod.Bench.__new__(bench_mod.Bench)
    bench.runtime = FakeRuntime()
    bench.copies = [{}]
    bench._args = lambda src, copy=0: []
    src = SimpleNamespace(global_size=1, local_size=1)
    out = bench.time([(src, d) for d in durations], warmup=warmup, repeat=repeat)
    return [t for t, _ in out], log


def test_a_rounds_launches_are_queued_before_any_is_awaited(monkeypatch):
    """A model's call runs its kernels back to back: each round queues its launches, then
    reads their events."""
    times, log = _logged_time(monkeypatch, (1e-3, 2e-3, 3e-3), warmup=1, repeat=3)
    assert times == [1e-3, 2e-3, 3e-3]
    rounds = 2 + 1 + 3  # scouting, warm-up, timed
    assert log == (["launch"] * 3 + ["wait"] * 3) * rounds


def test_a_slow_first_launch_of_each_round_does_not_stand_as_a_candidates_time(monkeypatch):
    """The first launch of a round can find the driver's threads asleep: the scouting rounds
    start with different candidates, so that no candidate is timed once at that launch.
    (The timed rounds each start one candidate later: the slow first launches fall to each
    candidate in fewer than half of its rounds.)"""
    times, _ = _logged_time(monkeypatch, (1e-3, 1.1e-3, 1.2e-3), warmup=1, repeat=5,
                            slow_first=True)
    assert times == [1e-3, 1.1e-3, 1.2e-3]
