"""Reading Tile programs from files or strings, with the default shapes a file may carry in a
first-line comment: `// shapes: D=32x224x224x64 K=3x3x64x64`."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import Source, Span, TileError

_SHAPES = re.compile(r"^\s*//\s*shapes\s*:(.*)$")


def parse_shape(text: str, where: str = "--shape") -> tuple[str, tuple[int, ...]]:
    """`D=32x224x224x64` -> ("D", (32, 224, 224, 64)); `S=` or `S=scalar` is a scalar."""
    name, sep, dims = text.partition("=")
    name = name.strip()
    if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise TileError(f"{where}: expected NAME=AxBxC, got {text!r}")
    dims = dims.strip()
    if dims in ("", "scalar", "()"):
        return name, ()
    try:
        shape = tuple(int(d) for d in re.split(r"[x,]", dims))
    except ValueError:
        raise TileError(f"{where}: the shape of {name} must be integers joined by 'x', "
                        f"got {dims!r}") from None
    if any(d <= 0 for d in shape):
        raise TileError(f"{where}: the shape of {name} has a non-positive size: {dims!r}")
    return name, shape


def default_shapes(source: Source) -> dict[str, tuple[int, ...]]:
    """Shapes from a `// shapes:` comment on the first line, if any."""
    lines = source.text.splitlines()
    if not lines:
        return {}
    m = _SHAPES.match(lines[0])
    if not m:
        return {}
    out = {}
    for item in m.group(1).split():
        try:
            name, shape = parse_shape(item, "shapes comment")
        except TileError as e:
            col = lines[0].find(item) + 1
            raise TileError(e.message, source=source, span=Span(1, col, 1, col + len(item))) \
                from None
        out[name] = shape
    return out


def read_source(path: str | Path) -> Source:
    p = Path(path)
    try:
        return Source(p.read_text(), str(path))
    except OSError as e:
        raise TileError(f"{path}: cannot read the file ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise TileError(f"{path}: not a text file (expected UTF-8 Tile source)") from None
