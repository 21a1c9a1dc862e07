"""`runtime.transpose.contiguous`: the same array as numpy's C-order copy for transposed,
sliced and reversed views, blocked or not; a contiguous array is passed through."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tilec.runtime.transpose import BLOCK, MIN_ELEMENTS, contiguous

from ..device import needs_device


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


@needs_device
def test_a_view_written_into_a_buffer_reads_back_as_numpys_copy():
    # `Runtime.write`: any layout copied once into a device buffer in C order (bind writes
    # filters relaid in panels this way); the buffer poisoned first, bools as bytes.
    from tilec.runtime.device import Runtime

    rt = Runtime.get(None)
    base = np.random.default_rng(2).standard_normal((24, 16, 3, 3)).astype(np.float32)
    for view in (base.transpose(2, 3, 1, 0), base[:, ::2], base.reshape(24, 144).T, base):
        buf = rt.buffer(view.nbytes + 64)
        rt.fill(buf, np.float32(np.nan), view.nbytes + 64)
        rt.write(buf, view)
        got = rt.download(buf, view.shape, np.float32)
        np.testing.assert_array_equal(got, np.ascontiguousarray(view))
    flags = np.random.default_rng(3).random((7, 5)) > 0.5
    buf = rt.buffer(flags.size)
    rt.fill(buf, np.uint8(0xAB), flags.size)
    rt.write(buf, flags.T)
    np.testing.assert_array_equal(rt.download(buf, (5, 7), np.uint8), flags.T.astype(np.uint8))
