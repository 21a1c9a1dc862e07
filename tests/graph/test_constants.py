"""Graph constants: copied where the caller could still change them, kept where nobody can
(a model's weights read from its file, views of other constants), never writable."""

from __future__ import annotations

import numpy as np

from tilec.graph import Graph


def test_a_callers_array_is_copied_and_later_changes_do_not_reach_the_graph():
    g = Graph("c")
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    c = g.constants[g.constant(w, "w").name]
    assert not np.shares_memory(c, w) and not c.flags.writeable
    w[0, 0] = 99.0
    assert c[0, 0] == 0.0
    # A read-only view of a writable array is no protection: copied too.
    v = w.T
    v.setflags(write=False)
    assert not np.shares_memory(g.constants[g.constant(v, "v").name], w)
    # Another element type is a new array whatever the source.
    i = g.constants[g.constant(np.arange(4, dtype=np.int64), "i").name]
    assert i.dtype == np.int32


def test_frozen_arrays_and_views_of_constants_are_kept_without_a_copy():
    g = Graph("c")
    c = g.constants[g.constant(np.ones((4, 3, 2, 2), np.float32), "w").name]
    view = np.transpose(c, (2, 3, 1, 0))  # what the channels-last pass makes of a filter
    kept = g.constants[g.constant(view, "w_hwio").name]
    assert kept.base is c or np.shares_memory(kept, c)
    assert kept.shape == (2, 2, 3, 4) and not kept.flags.writeable
    np.testing.assert_array_equal(kept, view)
    # An immutable buffer's elements (an ONNX initializer's raw data) cannot change either.
    raw = np.arange(5, dtype=np.float32).tobytes()
    b = np.frombuffer(raw, dtype=np.float32)
    assert g.constants[g.constant(b, "b").name] is b
