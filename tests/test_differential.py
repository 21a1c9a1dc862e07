"""Differential testing: random contraction programs, compiled with random forced tiles (partial
tiles, padding, every staging and vector width, thread budgets, hardware models), run on the CPU
device with poisoned outputs and compared with the numpy reference.

Program N is `progen.contraction_program(RandomPicker(N))`, its configuration
`progen.choose(RandomPicker(N + CHOICE_SALT), plan)`: a failure names its seed, and
`pytest tests/test_differential.py --diff-start N --diff-programs 1` runs it again.  CI runs the
first `--diff-programs` (120) seeds; the full run is `--diff-programs 1000` or more.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilec
from tilec.config import Config
from tilec.errors import TileCheckError, TileError
from tilec.lang.reference import evaluate_program, random_array
from tilec.plan.fuse import plan_kernels
from tilec.runtime.validate import compare

from .device import needs_device
from .progen import CHOICE_SALT, TALLY, RandomPicker, choose, contraction_program

pytestmark = needs_device


def describe(seed: int, gen, choice=None) -> str:
    text = f"seed {seed}, dtype {gen.dtype}, shapes {gen.shapes}\n{gen.text}"
    if choice is not None:
        text += f"config {choice.config_kwargs()}\n"
    return text


def test_random_program_matches_the_reference(diff_seed: int) -> None:
    seed = diff_seed
    gen = contraction_program(RandomPicker(seed))
    try:
        program = tilec.check_program(gen.text, gen.shapes, gen.dtype)
        plan = plan_kernels(program)
    except TileCheckError as e:
        # The generator aims at valid programs; a rejection must still be a located error.
        TALLY["differential: rejected by check/fuse"] += 1
        pytest.skip(f"rejected: {e.message}")
    choice = choose(RandomPicker(seed + CHOICE_SALT), plan)
    config = Config(**choice.config_kwargs(), use_disk_cache=False)
    rng = np.random.default_rng(seed)
    arrays = {n: random_array(rng, program.tensors[n].shape, program.tensors[n].dtype)
              for n in program.inputs}
    try:
        ref = evaluate_program(program, arrays)
    except TileError as e:
        TALLY["differential: skipped (the reference refuses it)"] += 1
        pytest.skip(f"reference: {e.message}")
    try:
        exe = tilec.compile(gen.text, gen.shapes, dtype=gen.dtype, config=config)
        outs = exe.run(arrays, poison=True)
    except TileError as e:
        raise AssertionError(f"{type(e).__name__}: {e}\n{describe(seed, gen, choice)}") from e
    v = compare(ref, outs, exe.program, exe.config)
    assert v.ok, f"{v.worst}\n{describe(seed, gen, choice)}"
    TALLY["differential: programs compared"] += 1
    TALLY["differential: kernels run"] += len(exe.kernels)
    TALLY["differential: kernels with a split reduction"] += sum(
        "__local" in s.text and "l_red[" in s.text for s in exe.sources)
    for f in gen.features:
        TALLY[f"differential feature: {f}"] += 1
