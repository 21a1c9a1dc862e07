"""A search's runners-up are scored when first read (`plan.runners`): the same costs and
predictions as scoring them at once, the first row without the others."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from tilec.plan.cost import score, score_many
from tilec.plan.hw import HwModel
from tilec.plan.predict import can_predict, explain_line, predict_many
from tilec.plan.runners import Rows, rows
from tilec.plan.search import search

from ..flats import matmul_flat, seed_flat

MADE: list[int] = []


def _count(n: int) -> tuple:
    MADE.append(n)
    return tuple(range(100, 100 + n))


def test_the_first_row_is_read_without_making_the_others():
    MADE.clear()
    r = rows("first", 4, _count, (4,))
    assert r[0] == "first" and r[-4] == "first" and len(r) == 4 and not MADE
    assert list(r) == ["first", 101, 102, 103] and MADE == [4]
    assert r[1:] == (101, 102, 103) and r == ("first", 101, 102, 103) and MADE == [4]
    assert rows("only", 1, _count, (1,)) == ("only",) and rows(None, 0, _count, (0,)) == ()


def test_rows_pickle_as_their_recipe_or_their_values():
    MADE.clear()
    again = pickle.loads(pickle.dumps(rows("first", 3, _count, (3,))))
    assert isinstance(again, Rows) and not MADE and tuple(again) == ("first", 101, 102)
    read = rows("first", 3, _count, (3,))
    tuple(read)
    assert pickle.loads(pickle.dumps(read)) == ("first", 101, 102)


@pytest.mark.parametrize("flat, hw", [
    (seed_flat(), "pocl-cpu"), (seed_flat(), "nvidia-h100"),
    (matmul_flat(512, 512, 512), "pocl-cpu"),
])
def test_deferred_rows_are_what_scoring_them_at_once_gives(flat, hw):
    hw = HwModel.load(hw)
    plan = search(flat, hw, top_k=8)
    tiles = [t for t, _ in plan.top]
    assert len(tiles) > 1
    assert [c for _, c in plan.top] == [score(flat, t, hw) for t in tiles]
    assert can_predict(hw) and len(plan.predicted) == len(tiles)
    stats = score_many(flat, np.asarray(tiles, np.int64), hw)
    pred = predict_many(flat, np.asarray(tiles, np.int64), hw, stats)
    assert [p for p, _ in plan.predicted] == [float(x) for x in pred["time"]]
    assert [line for _, line in plan.predicted] == \
        [explain_line(pred, i) for i in range(len(tiles))]
