"""Padding applied by a GPU kernel's staging copy (`codegen.staged_masks`): which constraints
the copy takes, the texts (device-free), and GPU-form kernels run on the CPU device against
numpy with their outputs poisoned: pipelined and not, stride 2, a window flipped."""

from __future__ import annotations

import re

import pytest

import tilec
from tilec.codegen.generate import generate
from tilec.config import Config
from tilec.plan.fuse import plan_kernels
from tilec.plan.hw import HwModel

from ..device import needs_device
from .test_kernels import run_case

GPU = HwModel.load("nvidia-h100")
CONV = """function (D[N, X, Y, CI], K[I, J, CO, CI]) -> (R) {
  O[n, x, y, co : N, X, Y, CO] = +(D[n, x+i-1, y+j-1, ci] * K[i, j, co, ci]);
  R = (O > 0 ? O : 0);
}"""
SHAPES = {"D": (2, 12, 10, 8), "K": (3, 3, 16, 8)}
STRIDED = """function (D[N, X, Y, CI], K[I, J, CO, CI]) -> (O) {
  O[n, x, y, co : N, 5, 5, CO] = +(D[n, 2*x+i-1, 2*y+j-1, ci] * K[i, j, co, ci]);
}"""
FLIPPED = """function (D[N, X, Y, CI], K[I, J, CO, CI]) -> (O) {
  O[n, x, y, co : N, X, Y, CO] = +(D[n, x-i+1, y+j-1, ci] * K[i, j, co, ci]);
}"""
# x + 2i is not a function of x + i, the staged coordinate: the copy cannot tell, and the
# multiply-adds keep that test.
OUTER = """function (D[N, X, Y, CI], K[I, J, CO, CI]) -> (O) {
  O[n, x, y, co : N, X, Y, CO] = +(D[n, x+i-1, y+j-1, ci] * K[i, j, co, ci]), x + 2*i < 14;
}"""


def _text(src: str, shapes: dict, tile: dict | None = None) -> str:
    plan = plan_kernels(tilec.check_program(src, shapes, "float32"))
    cfg = Config(use_disk_cache=False, use_tuning_records=False, **(
        {"tiles": {"*": tile}} if tile else {}))
    sources, _ = generate(plan, GPU, cfg)
    (text,) = [s.text for s in sources if s.kind == "contraction"]
    return text


def _inner(text: str) -> str:
    """The multiply-adds' loop nest: from the first reduction loop over u_ to the epilogue."""
    return text[text.index("for (int u_"):text.index("Finish each output element")]


SEED_TILE = {"ci": 4, "co": 16, "i": 3, "j": 3, "n": 1, "x": 4, "y": 4}


def test_the_copy_zeroes_the_halo_and_the_multiply_adds_read_it_plainly():
    """The seed convolution's GPU form (pipelined): each copied element's test, computed once
    (no reduction index of it has more than one tile) as a bit of one register, guards its
    load; the loop nest selects nothing."""
    text = _text(CONV, {"D": (2, 16, 16, 16), "K": (3, 3, 16, 16)}, SEED_TILE)
    assert "pipelined" in text
    assert re.search(r"(const int sm0 = |sm0 \|= \()\(\(-1\) \* o_x .*<= 16\) && "
                     r"\(\(-1\) \* o_y .*<= 16\)", text), text
    assert "f0_0 = (((sm0 >> 0) & 1)) ? " in text
    inner = _inner(text)
    assert "<=" not in inner and "?" not in inner, inner


def test_unpipelined_copies_and_a_merged_channel_axis():
    """Without the pipeline the copy's store carries the test.  Where the tile takes every
    input channel, y and ci merge into one staged index (contiguous), which the y padding
    cannot be read from: that constraint stays in the loop, the x one goes to the copy."""
    text = _text(CONV, SHAPES, {"ci": 8, "co": 4, "i": 3, "j": 3, "n": 1, "x": 1, "y": 2})
    assert "s_0[sl0_0] = (((sm0 >> 0) & 1) && g >= 0" in text
    inner = _inner(text)
    assert "<= 12" not in inner and "<= 10" in inner


def test_a_constraint_the_copy_cannot_tell_stays_in_the_loop():
    text = _text(OUTER, {"D": (2, 16, 16, 16), "K": (3, 3, 16, 16)}, SEED_TILE)
    inner = _inner(text)
    # the window's padding goes to the copy; x + 2i <= 13 is tested at the multiply-adds
    assert "const int sm0 = " in text
    assert "<= 13)" in inner and "<= 16)" not in inner


@needs_device
@pytest.mark.parametrize("src, shapes, tile", [
    (CONV, SHAPES, {"ci": 4, "co": 16, "i": 3, "j": 3, "n": 1, "x": 4, "y": 5}),
    # the window's rows one reduction tile each: the copy's test moves with the tile
    (CONV, SHAPES, {"ci": 4, "co": 16, "i": 1, "j": 3, "n": 1, "x": 4, "y": 5}),
    # tiles past the image's ends (7 and 9 rows of 4)
    (CONV, {"D": (1, 7, 9, 3), "K": (3, 3, 5, 3)},
     {"ci": 1, "co": 5, "i": 3, "j": 3, "x": 4, "y": 4}),
    # rows long enough that a staged tile's rows stay apart (shorter ones merge x, i, y and
    # j into one staged index, which the copy cannot test: the loop does, as before)
    (STRIDED, {"D": (2, 11, 24, 4), "K": (3, 3, 8, 4)},
     {"ci": 1, "co": 8, "i": 3, "j": 3, "n": 1, "x": 2, "y": 5}),
    (FLIPPED, {"D": (1, 8, 20, 4), "K": (3, 3, 8, 4)},
     {"ci": 1, "co": 8, "i": 3, "j": 3, "x": 4, "y": 4}),
    (OUTER, SHAPES, {"ci": 4, "co": 16, "i": 3, "j": 3, "n": 1, "x": 4, "y": 5})])
@pytest.mark.parametrize("forms", [True, False])
def test_gpu_kernels_with_the_halo_zeroed_in_the_copy_against_numpy(src, shapes, tile, forms):
    exe = run_case(src, shapes, hw="nvidia-h100", seed=13, gpu_forms=forms,
                   tiles={"*": tile}, use_disk_cache=False, use_tuning_records=False)
    (text,) = [s.text for s in exe.sources if s.kind == "contraction"]
    assert "sm0" in text or "sc0_0_" in text, text
    if tile.get("i") == 1:
        assert "sc0_0_" in text and ("r_i" in text or "nr_i" in text)


def test_no_test_in_copies_that_decode_their_elements_every_tile():
    """A depthwise convolution's tile whose channels are not whole vectors (an odd count,
    copied an element at a time): more copies a thread than are precomputed
    (`PRECOMPUTED_COPIES`), so its padding stays at the multiply-adds."""
    from tilec.plan.staged_pad import PRECOMPUTED_COPIES

    src = """function (D[N, X, Y, C], K[I, J, C]) -> (R) {
      R[n, x, y, c : N, X, Y, C] = +(D[n, x+i-1, y+j-1, c] * K[i, j, c]);
    }"""
    text = _text(src, {"D": (2, 32, 28, 126), "K": (3, 3, 126)},
                 {"c": 63, "i": 3, "j": 3, "n": 1, "x": 16, "y": 7})
    threads = re.search(r"threads: (\d+) per group", text)
    assert threads and 63 * 18 * 9 > PRECOMPUTED_COPIES * int(threads.group(1))
    assert "__global const float4*)(b_D" not in text
    assert "sm0" not in text and "sc0_" not in text
    assert "<= 32)" in _inner(text)


DEPTHWISE = """function (D[N, X, Y, C], K[I, J, C]) -> (R) {
  R[n, x, y, c : N, X, Y, C] = +(D[n, x+i-1, y+j-1, c] * K[i, j, c]);
}"""


@pytest.mark.parametrize("src, shapes, tile", [
    # the channels (the contiguous index) copied four at a time: the padding tests, on x and
    # y, are the same for a vector's four lanes, and a vector lies inside D or outside it
    (DEPTHWISE, {"D": (2, 13, 12, 64), "K": (3, 3, 64)},
     {"c": 32, "i": 3, "j": 3, "n": 1, "x": 8, "y": 4}),
    (DEPTHWISE, {"D": (2, 13, 12, 64), "K": (3, 3, 64)},
     {"c": 16, "i": 3, "j": 3, "n": 2, "x": 4, "y": 4}),
    (CONV, {"D": (2, 9, 11, 16), "K": (3, 3, 8, 16)},
     {"ci": 8, "co": 8, "i": 3, "j": 1, "n": 2, "x": 4, "y": 4}),
    (CONV, {"D": (2, 9, 11, 16), "K": (3, 3, 8, 16)},
     {"ci": 4, "co": 8, "i": 1, "j": 3, "n": 1, "x": 4, "y": 8})])
@pytest.mark.parametrize("forms", [True, False])
def test_vector_copies_with_the_padding_applied_against_numpy(src, shapes, tile, forms):
    """A padded tile copied in vectors: each vector's bounds and padding tested once, a
    vector of zeros where they fail; every output checked against numpy (outputs poisoned),
    at sizes the tiles do not divide (partial tiles past the ends)."""
    exe = run_case(src, shapes, hw="nvidia-h100", seed=5, gpu_forms=forms,
                   tiles={"*": tile}, use_disk_cache=False, use_tuning_records=False)
    (text,) = [s.text for s in exe.sources if s.kind == "contraction"]
    assert "__global const float4*)(b_D" in text, text
    assert "(float4)(0.0f)" in text
    assert "sm0" in text or "sc0_0_" in text


def _unrolled(text: str, var: str) -> bool:
    return bool(re.search(r"#pragma unroll\n\s*for \(int " + var + " ", text))


@pytest.mark.parametrize("shape, spatial, pipelined", [
    ((2, 34, 10, 64), {"n": 1, "x": 32, "y": 4}, False),
    ((2, 20, 12, 64), {"n": 2, "x": 8, "y": 4}, True)])
def test_gpu_channel_loops_unrolled_unless_pipelined(shape, spatial, pipelined):
    """A GPU kernel's loop over its staged tile: 16 channels x 3 window rows unrolled (48
    copies of the body, `GPU_UNROLL_COPIES`) where the loop is not pipelined; a pipelined one
    keeps `UNROLL_COPIES` (the window rows rolled).  Both against numpy, outputs poisoned, at
    sizes the tiles do not divide."""
    from tilec.codegen.unroll import GPU_UNROLL_COPIES, UNROLL_COPIES

    assert 16 * 3 <= GPU_UNROLL_COPIES and 16 * 3 > UNROLL_COPIES
    tile = {"ci": 16, "co": 64, "i": 3, "j": 1, **spatial}
    exe = run_case(CONV, {"D": shape, "K": (3, 3, 64, 64)}, hw="nvidia-h100", seed=3,
                   tiles={"*": tile}, use_disk_cache=False, use_tuning_records=False)
    (text,) = [s.text for s in exe.sources if s.kind == "contraction"]
    assert "vector: 4 lanes along co" in text
    assert ("pipelined:" in text) == pipelined
    assert _unrolled(text, "u_ci") and _unrolled(text, "u_j")
    assert _unrolled(text, "u_i") != pipelined, text


def test_integer_vector_copies_with_the_padding_against_numpy():
    """int32 tiles copy as int4 with a vector of integer zeros past the padding."""
    tile = {"c": 16, "i": 3, "j": 3, "n": 1, "x": 4, "y": 4}
    exe = run_case(DEPTHWISE, {"D": (2, 13, 12, 64), "K": (3, 3, 64)}, dtype="int32",
                   hw="nvidia-h100", seed=5, tiles={"*": tile}, use_disk_cache=False,
                   use_tuning_records=False)
    (text,) = [s.text for s in exe.sources if s.kind == "contraction"]
    assert "__global const int4*)(b_D" in text and "(int4)(0)" in text
