"""`runtime.transpose.contiguous`: the same array as numpy's C-order copy for transposed,
sliced and reversed views, blocked or not; a contiguous array is passed through."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tilec.runtime.transpose import BLOCK, MIN_ELEMENTS, contiguous


@pytest.mark.parametrize("shape", [(300, 700), (64, 48, 3, 3), (2, 129, 257), (1, 1, 700, 300)])
def test_every_transpose_matches_numpy(shape):
    base = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    for perm in itertools.permutations(range(len(shape))):
        view = base.transpose(perm)
        got = contiguous(view)
        assert got.flags.c_contiguous and got.shape == view.shape
        np.testing.assert_array_equal(got, view)


def test_slices_reversals_and_small_views():
    a = np.arange(4 * BLOCK * 3 * BLOCK, dtype=np.float32).reshape(4 * BLOCK, 3 * BLOCK)
    for view in (a.T[::-1], a[::2, 1::3].T, a.T[5:-7], a[:10, :10].T):
        np.testing.assert_array_equal(contiguous(view), np.ascontiguousarray(view))
    assert a.T.size >= MIN_ELEMENTS
    assert contiguous(a) is a
    scalar = np.float32(2.5)
    assert contiguous(np.asarray(scalar)).shape == ()
