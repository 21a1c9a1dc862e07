"""Code variants `tilec tune` times beside the tiles: a GPU tile's reduction loop with and
without the pipelined form, recorded and replayed by later compiles."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tilec.compiler import compile as tile_compile
from tilec.config import Config
from tilec.plan.hw import HwModel
from tilec.plan.schedule import MOVED_BACK, ROLLED, UNPIPELINED, make_schedule
from tilec.tune.measure import tune
from tilec.tune.records import DeviceKey, TuneRecord

from ..device import needs_device
from ..flats import matmul_flat

MATMUL = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"
SHAPES = {"A": (64, 128), "B": (128, 64)}
# A GPU model's tile with 8 reduction tiles: its loop is pipelined unless told otherwise.
TILE = {"m": 32, "n": 32, "k": 16}
PIPELINED = "for (int t = 0; t < "  # the pipelined loop over reduction tiles (its template)


def test_the_unpipelined_variant_of_a_pipelined_schedule():
    flat, hw = matmul_flat(64, 64, 128), HwModel.load("nvidia-h100")
    tile = (16, 32, 32)  # flat order k, m, n
    assert make_schedule(flat, tile, hw).pipeline
    plain = make_schedule(flat, tile, hw, variant=UNPIPELINED)
    assert not plain.pipeline and plain.run == make_schedule(flat, tile, hw).run


def test_records_keep_the_variant_and_refuse_unknown_ones():
    key = DeviceKey("P", "1", "D", "2")
    rec = TuneRecord(key, "contract_C", "d", (("A", (2, 3)),), (("m", 2),), 4, None, 1e-3,
                     variant=UNPIPELINED)
    assert TuneRecord.from_json(rec.to_json()) == rec
    old = rec.to_json()
    del old["variant"]  # written before variants existed
    assert TuneRecord.from_json(old).variant == ""
    with pytest.raises(ValueError, match="unknown code variant"):
        TuneRecord.from_json({**rec.to_json(), "variant": "sideways"})


def _check(exe) -> None:
    rng = np.random.default_rng(3)
    arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
    outs = exe.run(arrays, poison=True)
    np.testing.assert_allclose(outs["C"], arrays["A"] @ arrays["B"], rtol=1e-4, atol=1e-4)


@needs_device
def test_tune_times_the_unpipelined_variant_and_compile_replays_it(tmp_path):
    config = Config(records_path=tmp_path / "r.jsonl", hw="nvidia-h100", tiles={"*": TILE})
    # A forced tile keeps its search out of the way: only its variants are left to time.
    report = tune(MATMUL, SHAPES, config=config, top_k=1,
                  timer=lambda c: 1e-3 if c.variant == UNPIPELINED else 2e-3)
    (k,) = report.kernels
    assert [(m.candidate.phase, m.candidate.variant, m.status) for m in k.results] == \
        [("tile", "", "ok"), ("variant", UNPIPELINED, "ok")]  # both validated
    assert PIPELINED in k.results[0].candidate.source.text
    assert PIPELINED not in k.results[1].candidate.source.text
    assert k.record is not None and k.record.variant == UNPIPELINED

    # Compiles read the record (without the forced tile, which would win over it).
    exe = tile_compile(MATMUL, SHAPES, config=replace(config, tiles={}))
    assert set(exe.tuned) == {"contract_C"}
    assert PIPELINED not in exe.source and "unpipelined" in exe.cost_log
    _check(exe)
    again = tile_compile(MATMUL, SHAPES, config=replace(config, tiles={},
                                                        use_tuning_records=False))
    assert again.tuned == {}
    _check(again)


DEPTHWISE = """function (D[N, X, Y, C], K[I, J, C]) -> (R) {
  R[n, x, y, c : N, X, Y, C] = +(D[n, x+i-1, y+j-1, c] * K[i, j, c]); }"""
DW_SHAPES = {"D": (1, 12, 10, 16), "K": (3, 3, 16)}


@needs_device
def test_cpu_tiles_are_timed_with_their_reduction_loops_rolled(tmp_path):
    config = Config(records_path=tmp_path / "r.jsonl", hw="pocl-cpu",
                    tiles={"*": {"x": 2, "y": 5, "c": 16}})
    report = tune(DEPTHWISE, DW_SHAPES, config=config, top_k=1,
                  timer=lambda c: 1e-3 if c.variant == ROLLED else 2e-3)
    (k,) = report.kernels
    assert [(m.candidate.variant, m.status) for m in k.results] == [("", "ok"), (ROLLED, "ok")]
    assert "#pragma unroll" in k.results[0].candidate.source.text
    assert "#pragma unroll" not in k.results[1].candidate.source.text
    assert k.record.variant == ROLLED

    _replayed(config, DW_SHAPES, without="#pragma unroll")


@needs_device
def test_cpu_edge_tiles_are_timed_moved_back_too(tmp_path):
    # 7 rows in tiles of 4: the last tile has code of its own (`codegen.edge`); tune times the
    # tile as compiled, its loops rolled, and its partial tile moved back, and keeps the
    # fastest for later compiles.
    shapes = {"D": (1, 7, 10, 16), "K": (3, 3, 16)}
    config = Config(records_path=tmp_path / "r.jsonl", hw="pocl-cpu",
                    tiles={"*": {"x": 4, "y": 5, "c": 16}})
    report = tune(DEPTHWISE, shapes, config=config, top_k=1,
                  timer=lambda c: 1e-3 if c.variant == MOVED_BACK else 2e-3)
    (k,) = report.kernels
    got = [(m.candidate.variant, m.status) for m in k.results]
    assert got == [("", "ok"), (ROLLED, "ok"), (MOVED_BACK, "ok")]
    assert "with code of its own" in k.results[0].candidate.source.text
    assert "with code of its own" not in k.results[2].candidate.source.text
    assert k.record.variant == MOVED_BACK

    _replayed(config, shapes, without="with code of its own")


def _replayed(config: Config, shapes: dict, without: str) -> None:
    """A compile without the forced tile reads the record: the variant's code (`without`
    absent from it), checked against numpy with its outputs poisoned."""
    exe = tile_compile(DEPTHWISE, shapes, config=replace(config, tiles={}))
    assert set(exe.tuned) == {"contract_R"} and without not in exe.source
    rng = np.random.default_rng(5)
    arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    outs = exe.run(arrays, poison=True)
    v = exe.check(exe._inputs(arrays), outs)
    assert v.ok, v.worst
