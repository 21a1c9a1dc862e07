"""How many elements a GPU staging copy moves an instruction (`local_banks.copy_width`): whole
vectors where every lane of a vector passes or fails its bounds and padding tests together."""

from __future__ import annotations

from dataclasses import replace

from tilec.plan.flat import FlatConstraint, FlatContraction, FlatTensor
from tilec.plan.hw import HwModel
from tilec.plan.local_banks import staging_copy
from tilec.plan.schedule import make_schedule
from tilec.plan.staged_pad import assign

from ..flats import seed_flat

GPU = HwModel.load("nvidia-h100")


def _tile(flat, **sizes):
    return tuple(sizes.get(n, 1) for n in flat.names)


def _c(flat, rhs, **coeffs):
    return FlatConstraint(tuple(coeffs.get(n, 0) for n in flat.names), rhs)


def _padded(n: int = 2):
    """The seed conv with its "same" padding: 0 <= x + i - 1 < 224, and so for y + j."""
    flat = seed_flat(n)
    return replace(flat, constraints=(
        _c(flat, -1, i=-1, x=-1), _c(flat, 224, i=1, x=1),
        _c(flat, -1, j=-1, y=-1), _c(flat, 224, j=1, y=1)))


def test_padded_input_copied_in_vectors_along_its_channels():
    """The seed conv's input reaches past its ends (the padding), yet its channels, which no
    constraint tests, are copied four at a time, and the padding tests move to the copy."""
    flat = _padded()
    s = make_schedule(flat, _tile(flat, ci=4, co=64, i=3, j=1, n=2, x=8, y=4), GPU)
    safe, vw = staging_copy(s, 0)
    assert not safe and vw == 4
    assert assign(s, True).get(0)  # the padding is applied where the input is copied


def test_no_vectors_where_a_constraint_tests_the_lanes_index():
    """A constraint on the channel index: a vector's lanes would pass it apart."""
    flat = _padded()
    flat = replace(flat, constraints=flat.constraints + (_c(flat, 40, ci=1),))
    s = make_schedule(flat, _tile(flat, ci=4, co=64, i=3, j=1, n=2, x=8, y=4), GPU)
    assert staging_copy(s, 0) == (False, 1)


def test_no_vectors_where_the_tensor_ends_inside_a_vector():
    """A matrix of 62 columns in rows of 64, its tiles 16 wide: the last tile reaches past
    its end, where a vector would lie half inside (the buffer is 64 x 64 - 2 elements);
    with the buffer a whole number of vectors, each vector lies inside it or outside."""
    def flat(size: int) -> FlatContraction:
        out = FlatTensor("C", (0, 64, 1), 0, size=64 * 64)
        a = FlatTensor("A", (1, 64, 0), 0, size=size)
        b = FlatTensor("B", (64, 0, 1), 0, size=62 * 64)
        return FlatContraction(("k", "m", "n"), (62, 64, 64), (out, a, b))

    for size, width in ((64 * 64 - 2, 1), (64 * 64, 4)):
        f = flat(size)
        s = make_schedule(f, _tile(f, k=16, m=16, n=16), GPU)
        assert staging_copy(s, 0) == (False, width)
