"""Errors a user can cause.  Every one is a `TileError`: a message that says what was expected
and, where the error has a place in a source text, the file, line, column, the line and a caret."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """A Tile program's text and where it came from (a path, or `<string>`)."""

    text: str
    name: str = "<string>"

    def line(self, lineno: int) -> str:
        lines = self.text.split("\n")  # as lark counts lines: "\f", "\u2028" do not end one
        return lines[lineno - 1].removesuffix("\r") if 1 <= lineno <= len(lines) else ""


@dataclass(frozen=True)
class Span:
    """1-based line and column of the first character of a construct, and of its end."""

    line: int
    col: int
    end_line: int = 0
    end_col: int = 0


class TileError(Exception):
    """Base of every error tilec reports to its user."""

    def __init__(self, message: str, *, source: Source | None = None, span: Span | None = None):
        self.message = message
        self.source = source
        self.span = span
        super().__init__(self._render())

    @property
    def line(self) -> int | None:
        return self.span.line if self.span else None

    @property
    def col(self) -> int | None:
        return self.span.col if self.span else None

    def _render(self) -> str:
        if self.span is None or self.source is None:
            where = f"{self.source.name}: " if self.source is not None else ""
            return f"{where}{self.message}"
        head = f"{self.source.name}:{self.span.line}:{self.span.col}: {self.message}"
        text = self.source.line(self.span.line)
        if not text:
            return head
        width = 1
        if self.span.end_line == self.span.line and self.span.end_col > self.span.col:
            width = self.span.end_col - self.span.col
        indent = "".join(c if c == "\t" else " " for c in text[:self.span.col - 1])  # keep tabs
        caret = indent + "^" * max(1, min(width, len(text) - self.span.col + 1))
        return f"{head}\n    {text}\n    {caret}"


class TileWarning(UserWarning):
    """Something a program does that runs but deserves a look (a false, unused assertion)."""


class TileSyntaxError(TileError):
    """The text is not a Tile program."""


class TileCheckError(TileError):
    """A well-formed program that means nothing: unknown names, shapes, ranks, non-linearity."""


class HardwareModelError(TileError):
    """A hardware model file is missing fields or has fields of the wrong type."""


class DeviceError(TileError):
    """No OpenCL platform or device, a launch failure, or a buffer the device cannot hold."""


class BuildError(DeviceError):
    """The OpenCL compiler rejected a generated kernel."""


class CacheError(TileError):
    """A cache or tuning-record file that cannot be used."""


class ValidationError(TileError):
    """A kernel's output disagrees with the numpy reference."""
