"""Progress of long operations (model compiles, tuning) on stderr.

A bar appears only on a terminal, only once the operation has run `delay` seconds (a compile
that finishes sooner prints nothing), and never with `quiet`; `force` shows it anywhere (tests,
logs that want it).  tqdm draws it; its redraws are rate-limited, so updating per kernel costs
nothing.  Every stage that can take long takes a `Progress` (or None) and calls `step`."""

from __future__ import annotations

import sys
from typing import Any, TextIO

# Seconds before a bar appears: a compile that takes less stays silent.
DELAY_S = 2.0


def wanted(quiet: bool = False, stream: TextIO | None = None, force: bool = False) -> bool:
    """Whether a bar would be drawn: forced, or not quiet and the stream is a terminal."""
    if force:
        return True
    if quiet:
        return False
    stream = stream if stream is not None else sys.stderr
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or minimal stream
        return False


class Progress:
    """One bar: `total` steps (which may grow), labelled by the step under way."""

    def __init__(self, total: int = 0, desc: str = "", *, quiet: bool = False,
                 force: bool = False, stream: TextIO | None = None,
                 delay: float | None = None, unit: str = "step"):
        # Looked up now, not at import: tests and callers may have replaced sys.stderr.
        self.stream = stream if stream is not None else sys.stderr
        self.shown = wanted(quiet, self.stream, force)
        self.done = 0
        self.total = total
        self._bar: Any = None
        if self.shown:
            from tqdm import tqdm

            self._bar = tqdm(total=total or None, desc=desc, file=self.stream, unit=unit,
                             delay=0.0 if force else DELAY_S if delay is None else delay,
                             leave=False, dynamic_ncols=True,
                             bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} "
                             "[{elapsed}] {postfix}")

    def add(self, steps: int) -> None:
        """More steps than first announced (a stage whose size is known only now)."""
        self.total += steps
        if self._bar is not None:
            self._bar.total = self.total
            self._bar.refresh()

    def step(self, label: str = "", n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            if label:
                self._bar.set_postfix_str(label[:60], refresh=False)
            self._bar.update(n)

    def __call__(self, done: int, total: int, label: str) -> None:
        """The (done, total, label) callback that `tilec.tune.tune` reports through."""
        if total != self.total:
            self.add(total - self.total)
        self.step(label, done - self.done)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def step(progress: Progress | None, label: str = "", n: int = 1) -> None:
    """`progress.step` where a stage may run without one."""
    if progress is not None:
        progress.step(label, n)


__all__ = ["DELAY_S", "Progress", "step", "wanted"]
