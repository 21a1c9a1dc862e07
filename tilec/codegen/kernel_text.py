"""What every kernel generator shares: the kernel's description (`KernelSource`, `KernelArg`),
the template environment, buffer names, affine-expression text and the 32-bit offset limit."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import jinja2

from ..errors import TileCheckError
from . import clexpr

LANES = "0123456789abcdef"
# Generated kernels compute element offsets in OpenCL `int`.
INT_MAX = 2**31 - 1


def check_int_offsets(what: str, lo: int, hi: int) -> None:
    """Fix (limits): a tensor past 2**31 elements fits some devices' allocations (4 GiB of
    bool on PoCL, 8 GiB of float32 on a large GPU) but its offsets wrapped around in the
    kernel: out-of-bounds accesses instead of an error."""
    if lo < -INT_MAX - 1 or hi > INT_MAX:
        raise TileCheckError(f"{what} reaches element offset {hi if hi > INT_MAX else lo}; "
                             f"tilec's kernels index with 32-bit integers (at most {INT_MAX} "
                             "elements per tensor)")


@dataclass(frozen=True)
class KernelArg:
    tensor: str
    role: str  # "in" or "out"
    dtype: str
    elems: int


@dataclass(frozen=True)
class KernelSource:
    name: str
    kind: str  # "contraction", "elementwise" or "init"
    text: str
    args: tuple[KernelArg, ...]
    global_size: int
    local_size: int | None
    tile: dict[str, int] = field(default_factory=dict)
    cost: str = ""
    flops: int = 0
    bytes_moved: int = 0
    # The kernels one launch runs (`siblings.merge`, `phases.fuse`), as they were generated.
    members: tuple[KernelSource, ...] = ()


@functools.cache
def template_env() -> jinja2.Environment:
    try:
        root = resources.files("tilec.templates")
        loader: jinja2.BaseLoader = jinja2.FunctionLoader(
            lambda n: root.joinpath(n).read_text())
        root.joinpath("macros.cl.j2").read_text()
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
        loader = jinja2.FileSystemLoader(Path(__file__).resolve().parents[2] / "templates")
    return jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined,
                              trim_blocks=False, lstrip_blocks=False, keep_trailing_newline=True,
                              bytecode_cache=_bytecode_cache())


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates kept in tilec's cache directory (jinja checks each against its
    template's source before use): compiling them is a fifth of a warm compile."""
    from ..memo import default_cache_root

    try:
        folder = default_cache_root() / "templates"
        folder.mkdir(parents=True, exist_ok=True)
        return jinja2.FileSystemBytecodeCache(str(folder))
    except (OSError, RuntimeError):
        return None


def row_major_strides(shape) -> list[int]:
    """Element strides of a row-major (C order) tensor of `shape`."""
    out, s = [], 1
    for d in reversed(tuple(shape)):
        out.append(s)
        s *= d
    return out[::-1]


def buf(name: str) -> str:
    return f"b_{name}"


def arg_decl(a: KernelArg) -> str:
    const = "const " if a.role == "in" else ""
    restrict = " restrict" if a.role == "in" else ""
    return f"__global {const}{clexpr.STORAGE[a.dtype]}*{restrict} {buf(a.tensor)}"


def _lin(terms: list[tuple[int, str]], const: int = 0) -> str:
    """`const + sum(coef * var)` as compact C."""
    parts = [str(const)] if const else []
    for c, v in terms:
        if c == 0:
            continue
        parts.append(v if c == 1 else f"{c} * {v}" if c > 0 else f"({c}) * {v}")
    return " + ".join(parts) if parts else "0"


def _vec(ctype: str, w: int) -> str:
    return ctype if w == 1 else f"{ctype}{w}"


def prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n
