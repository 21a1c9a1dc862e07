"""The corpus's data type, input generation and comparison rules.

A `Case` is one PlaidML Tile program instantiated with concrete parameters:

* ``name``    unique id, ``<module>.<op>.<variant>``
* ``origin``  ``"plaidml/op.py:ArgMax"``: the file (at PlaidML 0.7.0) and the Python class or
  function whose code builds the Tile text.
* ``program`` the Tile text, as PlaidML generates it for ``params`` (whitespace aside).
* ``inputs``  input name -> (shape tuple, numpy dtype string), in the function header's order.
* ``oracle``  numpy, written from the op's meaning; three conventions (``params["expect"]``):

  - ``"values"`` (default): ``oracle(**arrays) -> {output: ndarray}``.  Every output the
    oracle names is compared: same shape; float outputs with rtol 1e-4 / atol 1e-5 (or the
    case's ``params["rtol"]`` / ``params["atol"]``) and a float dtype; integer, unsigned and
    bool outputs exactly and with exactly the oracle's dtype (unless
    ``params["check_dtype"]`` is False).
  - ``"properties"``: for random-number programs. ``oracle(run, **arrays)`` gets ``run``, a
    function ``dict of arrays -> dict of outputs`` (tilec.evaluate or a compiled executable),
    calls it as often as it needs and asserts the properties (shape, dtype, range,
    determinism).  It returns nothing.
  - ``"error"``: PlaidML itself rejects the program (``notes`` says why); running it must
    raise ``tilec.TileError``.  The oracle is not called.

* ``params``  the parameters the program was generated from, plus:
  ``gen`` (name -> generator spec for `make_inputs`), ``via`` (the public entry points that
  produce this text), optionally ``rtol``/``atol``/``check_dtype``/``expect``.
* ``notes``   anything a reader should know (PlaidML quirks, doubtful oracles).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Case:
    name: str
    origin: str
    program: str
    inputs: Mapping[str, tuple[tuple[int, ...], str]]
    oracle: Callable[..., Any]
    params: Mapping[str, Any] = field(default_factory=dict)
    notes: str = ""

    @property
    def expect(self) -> str:
        return self.params.get("expect", "values")

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v[0]) for k, v in self.inputs.items()}

    @property
    def dtypes(self) -> dict[str, str]:
        return {k: v[1] for k, v in self.inputs.items()}

    def __hash__(self) -> int:  # params holds dicts and callables
        return hash(self.name)


# ---------------------------------------------------------------------------------------------
# Input generation.  Generator specs (Case.params["gen"][name]):
#   ("signed", lo, hi)   magnitude uniform in [lo, hi), random sign   (default for floats)
#   ("uniform", lo, hi)  uniform in [lo, hi)
#   ("int", lo, hi)      integers in [lo, hi)                          (default for ints: 1..5)
#   ("choice", values)   each element drawn from values
#   ("bool", p)          True with probability p
#   ("fixed", value)     exactly this value (cast to the input's dtype)
#   ("derived", fn)      fn(arrays made so far) -> value; made after the others
# Defaults never produce zeros.


def _one(spec, shape, dtype, rng, made):
    kind = spec[0]
    if kind == "signed":
        lo, hi = spec[1], spec[2]
        mag = rng.uniform(lo, hi, size=shape)
        sign = rng.choice(np.array([-1.0, 1.0]), size=shape)
        return (mag * sign).astype(dtype)
    if kind == "uniform":
        return rng.uniform(spec[1], spec[2], size=shape).astype(dtype)
    if kind == "int":
        return rng.integers(spec[1], spec[2], size=shape, dtype=np.int64).astype(dtype)
    if kind == "choice":
        return rng.choice(np.asarray(spec[1]), size=shape).astype(dtype)
    if kind == "bool":
        return (rng.uniform(size=shape) < spec[1]).astype(dtype)
    if kind == "fixed":
        return np.broadcast_to(np.asarray(spec[1]), shape).astype(dtype).copy()
    if kind == "derived":
        return np.asarray(spec[1](made)).astype(dtype).reshape(shape)
    raise ValueError(f"unknown generator {spec!r}")


def _default_spec(dtype: str):
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return ("signed", 0.1, 1.0)
    if dt.kind == "b":
        return ("bool", 0.5)
    return ("int", 1, 5)


def make_inputs(case: Case, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random inputs for `case` (see the generator specs above)."""
    gen = case.params.get("gen", {})
    made: dict[str, np.ndarray] = {}
    later = []
    for name, (shape, dtype) in case.inputs.items():
        spec = gen.get(name, _default_spec(dtype))
        if spec[0] == "derived":
            later.append((name, spec, shape, dtype))
            continue
        made[name] = _one(spec, tuple(shape), dtype, rng, made)
    for name, spec, shape, dtype in later:
        made[name] = _one(spec, tuple(shape), dtype, rng, made)
    return {name: made[name] for name in case.inputs}


# ---------------------------------------------------------------------------------------------
# Comparison


def compare(case: Case, got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> None:
    """Assert that `got` matches the oracle's `want` under the case's rules."""
    rtol = case.params.get("rtol", 1e-4)
    atol = case.params.get("atol", 1e-5)
    check_dtype = case.params.get("check_dtype", True)
    for key, ref in want.items():
        ref = np.asarray(ref)
        assert key in got, f"output {key!r} missing (got {sorted(got)})"
        out = np.asarray(got[key])
        assert out.shape == ref.shape, f"{key}: shape {out.shape}, expected {ref.shape}"
        if ref.dtype.kind == "f":
            if check_dtype:
                assert out.dtype.kind == "f", f"{key}: dtype {out.dtype}, expected a float"
            np.testing.assert_allclose(out.astype(np.float64), ref.astype(np.float64),
                                       rtol=rtol, atol=atol, err_msg=f"output {key}")
        else:
            if check_dtype:
                assert out.dtype == ref.dtype, f"{key}: dtype {out.dtype}, expected {ref.dtype}"
            np.testing.assert_array_equal(out.astype(np.float64), ref.astype(np.float64),
                                          err_msg=f"output {key}")


def check_case(case: Case, run: Callable[[dict], Mapping[str, np.ndarray]],
               arrays: dict[str, np.ndarray]) -> None:
    """Run `case` through `run` (arrays -> outputs) and check it by the case's convention."""
    import tilec

    if case.expect == "error":
        try:
            run(arrays)
        except tilec.TileError:
            return
        raise AssertionError("PlaidML rejects this program; expected a tilec.TileError")
    if case.expect == "properties":
        case.oracle(run, **arrays)
        return
    compare(case, run(arrays), case.oracle(**arrays))
