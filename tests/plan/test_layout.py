"""Layout: merged load indices, padded local strides, threads and accumulators (seed 001)."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tilec.plan.flat import FlatContraction, FlatTensor
from tilec.plan.hw import HwModel
from tilec.plan.layout import (
    assign_threads,
    layout,
    merge_stats,
    read_plan,
    thread_split,
)

from ..flats import seed_flat

SEED_TILE = (8, 32, 2, 3, 16, 2, 2)


SEED_HW = HwModel.load("seed-example")


def test_seed_tables_exact() -> None:
    lay = layout(seed_flat(), SEED_TILE, SEED_HW)
    d, k = lay.inputs
    assert d.tensor == "D" and k.tensor == "K"
    d_rows = d.table().splitlines()
    k_rows = k.table().splitlines()
    assert d_rows[0].strip() == "Range    Global     Local"
    assert d_rows[1:] == [
        " i_x         3     14336         1",
        " j_y         4        64       393",
        "  ci         8         1        49",
        "   n        16   3211264         3",
    ]
    assert k_rows[0].strip() == "Range    Global     Local"
    assert k_rows[1:] == [
        " j_i         6      4096       265",
        "  ci         8         1        33",
        "  co        32        64         1",
    ]


def test_seed_merged_parts_and_sizes() -> None:
    lay = layout(seed_flat(), SEED_TILE, SEED_HW)
    d, k = lay.inputs
    by_name = {m.name: m for m in d.indices}
    assert by_name["i_x"].parts == (("i", 1), ("x", 1))
    assert by_name["j_y"].parts == (("j", 1), ("y", 1))
    assert {m.name: m for m in k.indices}["j_i"].parts == (("j", 1), ("i", 3))
    assert (d.local_size_elems, k.local_size_elems) == (1572, 1590)
    assert lay.local_bytes == 12648  # the seed's sm
    assert [m.name for m in d.by_local_stride] == ["i_x", "n", "ci", "j_y"]


def test_seed_threads_and_accumulators() -> None:
    lay = layout(seed_flat(), SEED_TILE, SEED_HW)
    assert (lay.total_threads, lay.outputs, lay.accumulators) == (256, 2048, 8)
    assert lay.output_threads == 256
    names = lay.names
    assert [names[k] for k in lay.out_order] == ["co", "y", "x", "n"]
    # co (unit output stride) gets me = 32/4 = 8 threads: neighbouring threads, neighbouring co.
    assert lay.threads[names.index("co")] == 8
    assert lay.threads[names.index("ci")] == 1
    prod = 1
    for k in lay.out_order:
        prod *= lay.acc_shape[k]
    assert prod == 8
    assert "256 threads, 2048 outputs, 8 accumulators each" in lay.describe().splitlines()
    assert lay.group_order[0] == names.index("co")
    assert lay.vector_width == 1  # threads interleave along co


def test_cpu_register_tile_vector_width() -> None:
    cpu = HwModel.load("pocl-cpu")
    out = FlatTensor("C", (0, 64, 1), 0)
    a = FlatTensor("A", (1, 64, 0), 0)
    b = FlatTensor("B", (64, 0, 1), 0)
    flat = FlatContraction(("k", "m", "n"), (64, 64, 64), (out, a, b))
    lay = layout(flat, (32, 4, 16), cpu)
    assert lay.threads == (1, 1, 1)
    assert lay.accumulators == 64
    assert lay.vector_width == 8
    assert layout(flat, (32, 4, 12), cpu).vector_width == 4


# -- the array versions agree with the scalar rules ---------------------------------------------

@st.composite
def tensors_and_tiles(draw: st.DrawFn) -> tuple[FlatTensor, tuple[int, ...], list[tuple]]:
    k = draw(st.integers(1, 4))
    strides = tuple(draw(st.sampled_from([0, 1, -1, 2, 3, 4, -4, 6, 8, 12, 16, 24])) for _ in
                    range(k))
    ranges = tuple(draw(st.integers(1, 5)) for _ in range(k))
    tiles = [tuple(draw(st.integers(1, r)) for r in ranges) for _ in range(draw(st.integers(1, 6)))]
    return FlatTensor("X", strides, 0), ranges, tiles


@given(tensors_and_tiles(), st.sampled_from([1, 2, 4, 8, 16]))
@settings(max_examples=200, deadline=None)
def test_merge_stats_matches_read_plan(case: tuple, me: int) -> None:
    tensor, _, tiles = case
    names = tuple("abcd"[: len(tensor.strides)])
    loads, size, elems = merge_stats(tensor, np.asarray(tiles, np.int64), me)
    for i, tile in enumerate(tiles):
        plan = read_plan(names, tensor, tile, me)
        assert (plan.loads, plan.local_size_elems) == (loads[i], size[i])
        assert elems[i] == int(np.prod([m.range for m in plan.indices]))


@given(tensors_and_tiles())
@settings(max_examples=200, deadline=None)
def test_local_layout_is_a_bijection(case: tuple) -> None:
    """Every element the tile touches has one local slot, inside the buffer, and elements
    with different global addresses never share a slot."""
    tensor, _, tiles = case
    names = tuple("abcd"[: len(tensor.strides)])
    for tile in tiles:
        plan = read_plan(names, tensor, tile, 8)
        slots: dict[int, int] = {}
        for point in itertools.product(*[range(t) for t in tile]):
            at = dict(zip(names, point, strict=True))
            glob = sum(s * p for s, p in zip(tensor.strides, point, strict=True))
            loc = 0
            for m in plan.indices:
                pos = m.zero + sum(mult * at[n] for n, mult in m.parts)
                assert 0 <= pos < m.range
                loc += pos * m.local_stride
            assert 0 <= loc < max(1, plan.local_size_elems)
            assert slots.setdefault(loc, glob) == glob


@given(st.lists(st.integers(1, 33), min_size=1, max_size=5),
       st.sampled_from([1, 2, 4, 64, 256]), st.sampled_from([1, 4, 8, 32]),
       st.integers(0, 2**31))
@settings(max_examples=150, deadline=None)
def test_thread_split_matches_assign_threads(ranges: list[int], threads: int, me: int,
                                             seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = len(ranges)
    out_strides = tuple(int(s) for s in rng.choice([0, 1, 3, 64, 64, 1000], size=k))
    flat = FlatContraction(tuple("abcde"[:k]), tuple(ranges),
                           (FlatTensor("O", out_strides, 0), FlatTensor("A", (1,) * k, 0)))
    tiles = np.stack([rng.integers(1, r + 1, size=20) for r in ranges], axis=1)
    got = thread_split(flat, tiles, threads, me)
    for i in range(tiles.shape[0]):
        want = assign_threads(flat, tiles[i].tolist(), threads, me)
        for kk in range(k):
            assert got[i, kk] == want.get(kk, 1)
        assert int(np.prod(got[i])) <= threads
