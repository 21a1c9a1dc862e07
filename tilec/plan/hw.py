"""Hardware models: the handful of numbers the tile search and the layout plan for.

A model comes from a TOML file (`hwmodels/*.toml`, shipped as `tilec.hwmodels`, or any path), or
is derived from an OpenCL device's queries (`hw_device.from_device`).  hwmodels/README.md is the
schema: every field's meaning, unit, default, and the rules `from_device` follows.

Required fields: name, kind, threads, mem_width, max_mem, max_regs, goal_groups,
goal_flops_per_byte, staging.  Everything else is optional, with the defaults below; a CPU model
(kind = "cpu") must also give registers, l1_bytes and l2_bytes, which the register tile needs.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from ..errors import HardwareModelError, Source, Span
from .calibration import ACCESS_FORMS, DEFAULT_MULADD, MULADD_FORMS
from .read_curve import describe_curve, normal_curve

KINDS = ("gpu", "cpu")
# Non-negative measured or quoted rates and times (goal_flops_per_byte is checked on its own).
_FLOAT_FIELDS = ("peak_gflops", "bandwidth_gbs", "l1_gbs", "l2_gbs", "local_gbs", "launch_us",
                 "group_us", "start_us", "exp_gops", "correct_compute", "correct_l1", "correct_l2",
                 "correct_dram", "correct_launch")
# The time model's per-device correction: a factor for predictions limited by each resource.
CORRECTIONS = ("compute", "L1", "L2", "DRAM", "launch")
STAGINGS = ("local", "global")
VEC_SIZES = (1, 2, 4, 8, 16)
DEFAULT_ELEM_BYTES: tuple[tuple[str, int], ...] = (
    ("bool", 1), ("float16", 2), ("float32", 4), ("int32", 4),
    ("int8", 1), ("uint8", 1), ("int16", 2), ("uint16", 2), ("uint32", 4),
)



@dataclass(frozen=True)
class HwModel:
    """One device as the cost model sees it.  Sizes are in bytes unless the name says otherwise."""

    name: str
    kind: str  # "gpu" or "cpu"
    threads: int  # work-items per work-group the cost model plans for
    mem_width: int  # cache line: the smallest efficient memory transaction
    max_mem: int  # local-memory bytes one tile may stage (CPU: the L1 budget of a tile's inputs)
    max_regs: int  # accumulator bytes per work-group
    goal_groups: int  # work-groups needed to fill the device
    goal_flops_per_byte: float  # compute/memory ratio at which a tile stops being memory-bound
    staging: str  # "local": inputs staged in local memory; "global": read through the cache
    vec_size: int = 1  # widest float vector the codegen may use
    elem_bytes: tuple[tuple[str, int], ...] = DEFAULT_ELEM_BYTES  # a mapping is accepted too
    # CPU register-tile facts (MegEngine's blocking); required when kind == "cpu".
    registers: int = 0  # architectural vector registers (AVX2 16, AVX-512 and NEON 32)
    l1_bytes: int = 0  # L1 data cache per core
    l2_bytes: int = 0  # L2 per core (GPU: the device's L2)
    # Facts for reports only; 0 or "" means unknown.
    device_name: str = ""
    compute_units: int = 0
    clock_mhz: int = 0
    peak_gflops: float = 0.0  # fp32
    bandwidth_gbs: float = 0.0  # global memory
    max_work_group_size: int = 0
    local_mem_bytes: int = 0  # per work-group, as OpenCL reports it
    # GPU: the unit its L2 serves global reads in (NVIDIA: 32-byte sectors of the 128-byte
    # line), which the time model counts a staging copy's reads in; 0: unknown, the bytes
    # staged are counted.
    sector_bytes: int = 0
    source: str = ""  # where the values came from
    # Measured facts (`tilec devices --calibrate`, plan/calibration.py), or a TOML's.  The
    # defaults are what tilec assumed before it measured: `fma()` and nothing known.
    muladd: str = DEFAULT_MULADD  # how the codegen writes a*b+c: "fma", "mad" or "mul_add"
    muladd_vec: int = 0  # narrowest float vector width at full mul-add speed (0: unknown)
    l1_gbs: float = 0.0  # bandwidth of repeated reads from half the L1 (all compute units)
    l2_gbs: float = 0.0  # the same from half the L2
    local_gbs: float = 0.0  # reads from local memory
    launch_us: float = 0.0  # device time of an empty kernel
    group_us: float = 0.0  # device time per extra work-group of an empty kernel
    start_us: float = 0.0  # device time to set every compute unit to work (CPUs)
    exp_gops: float = 0.0  # exp() a second, billions of lanes (row kernels' softmax)
    # (MiB, GB/s): reading a working set of that size with every core (`plan.read_curve`;
    # measured on CPUs; TOML: a table `read_gbs = { 32 = 570.0, 256 = 125.0 }`).
    read_gbs: tuple[tuple[float, float], ...] = ()
    # How vectors of global memory are read and written: "vload" (vloadN/vstoreN), "plain"
    # (a pointer to the vector type), "" not measured (codegen.contraction.plain_vector_access).
    vector_access: str = ""
    # Measured over predicted time of the tiles `tilec tune` timed, by the prediction's
    # limiting resource (`tune.correction`; 1: none).  Compiles multiply predictions by them.
    correct_compute: float = 1.0
    correct_l1: float = 1.0
    correct_l2: float = 1.0
    correct_dram: float = 1.0
    correct_launch: float = 1.0

    def __post_init__(self) -> None:
        # Normalised here so that models built in code compare and hash like loaded ones.
        object.__setattr__(self, "elem_bytes", _merge_elem_bytes(self.elem_bytes))
        try:
            object.__setattr__(self, "read_gbs", normal_curve(self.read_gbs))
        except (TypeError, ValueError) as exc:
            raise HardwareModelError(f"hardware model {self.name!r}: field 'read_gbs': {exc}"
                                     ) from None
        object.__setattr__(self, "goal_flops_per_byte", float(self.goal_flops_per_byte))
        object.__setattr__(self, "peak_gflops", float(self.peak_gflops))
        for name in _FLOAT_FIELDS:
            object.__setattr__(self, name, float(getattr(self, name)))
        problems = _value_problems({f.name: getattr(self, f.name) for f in fields(self)})
        if problems:
            field, why = problems[0]
            raise HardwareModelError(f"hardware model {self.name!r}: field {field!r}: {why}")

    # -- element sizes -------------------------------------------------------------------------

    def correction(self, bottleneck: str) -> float:
        """The factor for predictions limited by `bottleneck` (1 for any other)."""
        return float(getattr(self, "correct_" + bottleneck.lower(), 1.0))

    def elem_size(self, dtype: str) -> int:
        """Bytes of one element of `dtype` on this device."""
        for name, size in self.elem_bytes:
            if name == dtype:
                return size
        known = ", ".join(n for n, _ in self.elem_bytes)
        raise HardwareModelError(
            f"hardware model {self.name!r} has no element size for dtype {dtype!r} "
            f"(it knows {known}; add it under [elem_bytes])"
        )

    # -- CPU blocking (seed 004: MegEngine's MatMul) --------------------------------------------

    def register_tile(self) -> tuple[int, int]:
        """The (mr, nr) accumulator tile one work-item keeps in vector registers.

        With v = vec_size lanes and nr = b*v, the tile must fit the register file:
        mr*nr/v (accumulators) + nr/v (one row of B) + 1 (the broadcast A element) <= registers.
        Among b in powers of two (so nr divides the power-of-two tiles the search makes) and the
        largest mr that fits, pick the most FMAs per load, mr*b / (mr + b): each k step loads mr
        A scalars and b B vectors and issues mr*b vector FMAs.  Ties go to more accumulators.
        AVX2 (16 registers, v=8) gives 6x16; AVX-512 (32, v=16) 6x64; NEON (32, v=4) 6x16.
        """
        self._need_cpu_facts("register_tile", l1=False)
        return register_tile_for(self.registers, self.vec_size)

    def kr(self, dtype: str = "float32") -> int:
        """Reduction depth of a block: Kr = L1 / ((mr + nr) * elem), rounded down.

        An mr x Kr panel of A and a Kr x nr panel of B then fill L1 together, so the inner
        kernel reads both from L1 (MegEngine's rule; seed 004).
        """
        self._need_cpu_facts("kr")
        mr, nr = self.register_tile()
        return max(1, self.l1_bytes // ((mr + nr) * self.elem_size(dtype)))

    def nr_block(self, dtype: str = "float32") -> int:
        """Columns of B kept in L2: Nr = (L2 - L1) / (Kr * elem), rounded down to a multiple of nr.

        L1 is subtracted because the caches are inclusive: the L1 panels also occupy L2.
        The rounding keeps whole register tiles in a block; the result is at least nr.
        """
        self._need_cpu_facts("nr_block")
        _, nr = self.register_tile()
        cols = (self.l2_bytes - self.l1_bytes) // (self.kr(dtype) * self.elem_size(dtype))
        return max(nr, cols // nr * nr)

    def _need_cpu_facts(self, what: str, l1: bool = True) -> None:
        missing = [n for n in ("registers", "l1_bytes", "l2_bytes")[: 3 if l1 else 1]
                   if getattr(self, n) <= 0]
        if missing:
            raise HardwareModelError(
                f"hardware model {self.name!r}: {what} needs {', '.join(missing)}, "
                "which this model does not give"
            )

    # -- construction --------------------------------------------------------------------------

    @classmethod
    def load(cls, path_or_name: str | os.PathLike[str]) -> HwModel:
        """A model from a .toml path, or the name of a shipped model (see `list_models()`)."""
        if isinstance(path_or_name, os.PathLike) or _looks_like_path(path_or_name):
            path = Path(path_or_name)
            try:
                text = path.read_text(encoding="utf-8")
            except FileNotFoundError:
                raise HardwareModelError(f"{path}: no such hardware model file") from None
            except (OSError, UnicodeDecodeError) as exc:
                raise HardwareModelError(f"{path}: cannot read hardware model: {exc}") from None
            return cls.loads(text, str(path))
        shipped = _shipped_files()
        if path_or_name not in shipped:
            hint = difflib.get_close_matches(path_or_name, shipped, n=1)
            did = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise HardwareModelError(
                f"unknown hardware model {path_or_name!r}{did}; shipped models: "
                f"{', '.join(sorted(shipped))}; or give the path of a .toml file"
            )
        entry = shipped[path_or_name]
        return cls.loads(entry.read_text(encoding="utf-8"), str(entry))

    @classmethod
    def loads(cls, text: str, filename: str = "<string>") -> HwModel:
        """A model from TOML text; `filename` is what error messages name."""
        source = Source(text, filename)
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise _syntax_error(exc, source) from None
        return cls(**_checked_values(data, source))

    # -- output --------------------------------------------------------------------------------

    def describe(self) -> str:
        """A few lines for `tilec devices` and `tilec explain`."""
        staged = ("inputs staged in local memory" if self.staging == "local"
                  else "inputs read through the cache")
        head = f"{self.name} ({self.kind})" + (f": {self.device_name}" if self.device_name else "")
        lines = [
            head,
            f"  cost model: threads {self.threads}, mem_width {self.mem_width} B, "
            f"max_mem {_size(self.max_mem)}, max_regs {_size(self.max_regs)}, "
            f"goal_groups {self.goal_groups}, goal {self.goal_flops_per_byte:g} flops/byte",
            f"  codegen: vec_size {self.vec_size}, staging {self.staging} ({staged}), "
            f"mul-add {self.muladd}"
            + (f", vector access {self.vector_access}" if self.vector_access else ""),
        ]
        if self.registers > 0 and self.l1_bytes > 0 and self.l2_bytes > self.l1_bytes:
            mr, nr = self.register_tile()
            lines.append(
                f"  cpu blocking: {self.registers} vector registers, L1 {_size(self.l1_bytes)}, "
                f"L2 {_size(self.l2_bytes)} -> register tile {mr}x{nr}, Kr {self.kr()}, "
                f"Nr {self.nr_block()} (float32)"
            )
        facts = [
            f"{self.compute_units} compute units" if self.compute_units else "",
            f"{self.clock_mhz} MHz" if self.clock_mhz else "",
            f"peak {self.peak_gflops:g} GFLOP/s fp32" if self.peak_gflops else "",
            f"{self.bandwidth_gbs:g} GB/s" if self.bandwidth_gbs else "",
            f"max work-group {self.max_work_group_size}" if self.max_work_group_size else "",
            f"local memory {_size(self.local_mem_bytes)}" if self.local_mem_bytes else "",
        ]
        if any(facts):
            lines.append("  device: " + ", ".join(f for f in facts if f))
        measured = [
            f"full mul-add speed from {self.muladd_vec}-wide vectors" if self.muladd_vec else "",
            f"L2 {self.l2_gbs:g} GB/s" if self.l2_gbs else "",
            f"L1 {self.l1_gbs:g} GB/s" if self.l1_gbs else "",
            f"local {self.local_gbs:g} GB/s" if self.local_gbs else "",
            f"launch {self.launch_us:g} us" if self.launch_us else "",
            f"{self.group_us:g} us a work-group" if self.group_us else "",
            f"every core at work after {self.start_us:g} us" if self.start_us else "",
            f"exp {self.exp_gops:g} G/s" if self.exp_gops else "",
            f"reads by working set {describe_curve(self.read_gbs)}" if self.read_gbs else "",
        ]
        if any(measured):
            lines.append("  measured: " + ", ".join(f for f in measured if f))
        factors = [f"{b} x{self.correction(b):.3g}" for b in CORRECTIONS
                   if self.correction(b) != 1.0]
        if factors:
            lines.append("  time model corrected from tuning records: " + ", ".join(factors))
        if self.source:
            lines.append(f"  source: {self.source}")
        return "\n".join(lines)

    def to_toml(self) -> str:
        """TOML text that `loads` reads back into an equal model (to save a derived model)."""
        out = [f"# tilec hardware model {self.name}"]
        table: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "elem_bytes":
                table = ["", "[elem_bytes]"] + [f"{k} = {v}" for k, v in value]
            elif f.name == "read_gbs":
                if value:
                    pairs = ", ".join(f'"{m:g}" = {g!r}' for m, g in value)
                    out.append(f"read_gbs = {{ {pairs} }}")
            elif f.default is MISSING or value != f.default:
                out.append(f"{f.name} = {_toml_value(value)}")
        return "\n".join(out + table) + "\n"


def list_models() -> list[str]:
    """Names of the shipped models, for `HwModel.load(name)`."""
    return sorted(_shipped_files())


def register_tile_for(registers: int, vec: int) -> tuple[int, int]:
    """`HwModel.register_tile` for a bare register count and vector width."""
    best: tuple[float, int, int] | None = None
    best_tile = (1, vec)
    b = 1
    while b + 2 <= registers:
        mr = (registers - 1 - b) // b
        if mr >= 1:
            key = (mr * b / (mr + b), mr * b, b)
            if best is None or key > best:
                best, best_tile = key, (mr, b * vec)
        b *= 2
    return best_tile


# -- reading TOML ------------------------------------------------------------------------------

_FIELDS = {f.name: f for f in fields(HwModel)}
_PY_TYPES = {"int": int, "float": float, "str": str}


def _checked_values(data: dict[str, Any], source: Source) -> dict[str, Any]:
    """Type-check a parsed TOML table against the schema; raise on the first problem."""

    def fail(field: str, why: str) -> HardwareModelError:
        return HardwareModelError(f"field {field!r}: {why}", source=source,
                                  span=_key_span(source.text, field))

    values: dict[str, Any] = {}
    for key, value in data.items():
        f = _FIELDS.get(key)
        if f is None:
            hint = difflib.get_close_matches(key, _FIELDS, n=1)
            did = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise fail(key, f"unknown field{did}; hwmodels/README.md lists the fields")
        if key == "elem_bytes":
            if not isinstance(value, dict) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value.values()
            ):
                raise fail(key, "expected a table of dtype = bytes, e.g. { float32 = 4 }")
            values[key] = tuple(value.items())
            continue
        if key == "read_gbs":
            try:
                if not isinstance(value, dict):
                    raise ValueError("expected a table of MiB = GB/s, e.g. { 32 = 570.0 }")
                values[key] = normal_curve(value)
            except ValueError as exc:
                raise fail(key, str(exc)) from None
            continue
        want = _PY_TYPES[str(f.type)]
        ok = isinstance(value, want) and not isinstance(value, bool)
        if want is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok:
            raise fail(key, f"expected {_type_word(want)}, got {_type_word(type(value))} "
                            f"({value!r})")
        values[key] = value
    required = [n for n, f in _FIELDS.items() if f.default is MISSING]
    for name in required:
        if name not in values:
            raise HardwareModelError(
                f"missing required field {name!r} (required: {', '.join(required)})",
                source=source,
            )
    defaults = {n: f.default for n, f in _FIELDS.items() if f.default is not MISSING}
    problems = _value_problems(defaults | values)
    if problems:
        raise fail(*problems[0])
    return values


def _value_problems(v: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, why) for every value out of range; types are already right."""
    out: list[tuple[str, str]] = []
    if not v["name"]:
        out.append(("name", "must not be empty"))
    if v["kind"] not in KINDS:
        out.append(("kind", f"must be one of {', '.join(map(repr, KINDS))}, not {v['kind']!r}"))
    for name in ("threads", "mem_width"):
        if not _is_pow2(v[name]):
            out.append((name, f"must be a positive power of two, not {v[name]}"))
    for name in ("max_regs", "goal_groups"):
        if v[name] < 1:
            out.append((name, f"must be positive, not {v[name]}"))
    gfb = v["goal_flops_per_byte"]
    if not (gfb > 0 and math.isfinite(gfb)):
        out.append(("goal_flops_per_byte", f"must be a positive number, not {gfb}"))
    if v["staging"] not in STAGINGS:
        out.append(("staging", f"must be 'local' (inputs staged in local memory) or 'global' "
                               f"(read through the cache), not {v['staging']!r}"))
    if v["staging"] == "local" and v["max_mem"] < 1:
        out.append(("max_mem", "must be positive when staging is 'local'"))
    if v["vec_size"] not in VEC_SIZES:
        out.append(("vec_size", f"must be one of {VEC_SIZES}, not {v['vec_size']}"))
    if v["muladd"] not in MULADD_FORMS:
        out.append(("muladd", f"must be one of {', '.join(map(repr, MULADD_FORMS))} (fma(a, b, "
                              f"c), mad(a, b, c), a * b + c), not {v['muladd']!r}"))
    if v["vector_access"] not in ("", *ACCESS_FORMS):
        out.append(("vector_access", f"must be '' (not measured) or one of "
                                     f"{', '.join(map(repr, ACCESS_FORMS))}, "
                                     f"not {v['vector_access']!r}"))
    if v["muladd_vec"] not in (0, *VEC_SIZES):
        out.append(("muladd_vec", f"must be 0 (unknown) or one of {VEC_SIZES}, "
                                  f"not {v['muladd_vec']}"))
    for dtype, size in v["elem_bytes"]:
        if size not in (1, 2, 4, 8):
            out.append(("elem_bytes", f"{dtype} = {size}: an element is 1, 2, 4 or 8 bytes"))
    for name in ("max_mem", "registers", "l1_bytes", "l2_bytes", "compute_units", "clock_mhz",
                 "max_work_group_size", "local_mem_bytes", "sector_bytes", *_FLOAT_FIELDS):
        if v[name] < 0 or v[name] != v[name]:
            out.append((name, f"must not be negative, not {v[name]}"))
    for b in CORRECTIONS:
        name = "correct_" + b.lower()
        if not (0 < v[name] < math.inf):
            out.append((name, f"must be a positive factor, not {v[name]}"))
    if v["kind"] == "cpu":
        if v["registers"] < 3:
            out.append(("registers", "a cpu model needs the vector register count (>= 3)"))
        if v["l1_bytes"] < 1:
            out.append(("l1_bytes", "a cpu model needs the L1 data cache size"))
        if v["l2_bytes"] <= v["l1_bytes"]:
            out.append(("l2_bytes", "a cpu model needs an L2 larger than its L1"))
    return out


def _syntax_error(exc: tomllib.TOMLDecodeError, source: Source) -> HardwareModelError:
    message = str(exc)
    m = re.search(r"\s*\(at line (\d+), column (\d+)\)\s*$", message)
    if m is None:
        return HardwareModelError(f"TOML syntax error: {message}", source=source)
    line, col = int(m.group(1)), int(m.group(2))
    return HardwareModelError(f"TOML syntax error: {message[: m.start()]}", source=source,
                              span=Span(line, col))


def _key_span(text: str, key: str) -> Span | None:
    """Where `key = ...` or `[key]` sits in the text: a cheap search, not a TOML re-parse."""
    pattern = rf"^[ \t]*(?:\[[ \t]*)?({re.escape(key)})[ \t]*(?:=|\])"
    m = re.search(pattern, text, re.MULTILINE)
    if m is None:
        return None
    line = text.count("\n", 0, m.start(1)) + 1
    col = m.start(1) - (text.rfind("\n", 0, m.start(1)) + 1) + 1
    return Span(line, col, line, col + len(key))


def _merge_elem_bytes(given: Any) -> tuple[tuple[str, int], ...]:
    pairs = given.items() if isinstance(given, Mapping) else given
    merged = dict(DEFAULT_ELEM_BYTES) | {str(k): v for k, v in pairs}
    return tuple(sorted(merged.items()))


def _shipped_files() -> dict[str, Traversable]:
    """Shipped models by name: the installed package data, else the repo's hwmodels/."""
    roots: list[Traversable] = []
    try:
        roots.append(resources.files("tilec.hwmodels"))
    except (ModuleNotFoundError, TypeError):
        pass  # a source checkout on sys.path without the editable install's package mapping
    roots.append(Path(__file__).resolve().parents[2] / "hwmodels")
    for root in roots:
        try:
            found = {e.name[: -len(".toml")]: e for e in root.iterdir()
                     if e.name.endswith(".toml") and e.is_file()}
        except (FileNotFoundError, NotADirectoryError):
            continue
        if found:
            return found
    return {}


def _looks_like_path(s: str) -> bool:
    return s.endswith(".toml") or "/" in s or os.sep in s


# -- deriving from an OpenCL device ------------------------------------------------------------

def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _floor_pow2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _size(n: int) -> str:
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n >> 10} KiB"
    return f"{n} B"


def _type_word(t: type) -> str:
    words = {str: "a string", int: "an integer", float: "a number", bool: "a boolean",
             dict: "a table", list: "an array"}
    return words.get(t, t.__name__)


def _toml_value(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, float):
        return repr(value)
    return str(value)
