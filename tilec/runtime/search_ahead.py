"""Tile searches run ahead by the build workers while the compiling process packs panels and
generates code.

A cold compile of a model searches tiles for each distinct contraction, one after another,
in Python: to choose its panels (`codegen.generate.packed`), then its kernel's tile
(resnet50: about 2.5 s of one core on a Zen 4, 4 s on the GPU host's Xeon), while the build
workers (`prebuild.BuildWorkers`), started early to open the device, wait for the program
text.  A search is a pure function of its arguments and keeps its outcome in the search
cache (`plan.search`), where a later search with the same arguments finds it; so the
workers take the searches of a stage from its end while this process works from its start,
asking for each search's outcome first (`settle`): one a worker has finished is read from
the cache, one it is running is awaited, one not started is done here.  A search that fails
or is lost in a worker is done here as well: nothing depends on the workers."""

from __future__ import annotations

import os
import pickle
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from ..plan.search import search_key
from .prebuild import BuildWorkers

# A kernel's search: not handed out yet, taken by a worker, answered, or left to this process.
_QUEUED, _RUNNING, _DONE, _OWN = "queued", "running", "done", "own"


def _key(kwargs: dict) -> str:
    """What the search with these arguments keeps its outcome under (`search_key`)."""
    return search_key(**{k: v for k, v in kwargs.items() if k not in ("cache", "log")})


class SearchAhead:
    """The searches `jobs` (`plan.search.search`'s keyword arguments, in the order the
    compile will ask for them, each outcome once) handed to `workers` from the last one
    back."""

    def __init__(self, workers: BuildWorkers, jobs: Sequence[dict]):
        self._index: dict[str, int] = {}
        todo = []
        for kwargs in jobs:
            key = _key(kwargs)
            if key not in self._index:
                self._index[key] = len(todo)
                todo.append(kwargs)
        fd, name = tempfile.mkstemp(prefix="tilec-searches-", suffix=".pickle")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(todo, f)
        self._file = Path(name)
        self._state = [_QUEUED] * len(todo)
        self._queue = list(range(len(todo) - 1, -1, -1))
        self._cond = threading.Condition()
        self.ahead = 0  # searches the workers answered (for tests and reports)
        self._thread = threading.Thread(target=workers.serve, args=(self._take, self._done),
                                        name="tilec-search-ahead", daemon=True)
        self._thread.start()

    def _take(self) -> tuple[int, dict] | None:
        with self._cond:
            if not self._queue:
                return None
            i = self._queue.pop(0)
            self._state[i] = _RUNNING
            return i, {"op": "search", "file": str(self._file), "index": i}

    def _done(self, i: int, good: bool) -> None:
        with self._cond:
            self._state[i] = _DONE
            self.ahead += int(good)
            self._cond.notify_all()

    def settle(self, kwargs: dict) -> None:
        """Before the search with these arguments runs here: one not handed out is withdrawn
        (this process does it), one running in a worker is awaited (its outcome is then in
        the cache)."""
        i = self._index.get(_key(kwargs))
        if i is None:
            return
        with self._cond:
            if self._state[i] == _QUEUED:
                self._queue.remove(i)
                self._state[i] = _OWN
            while self._state[i] == _RUNNING and self._thread.is_alive():
                self._cond.wait(0.25)

    def close(self) -> None:
        """Withdraw what no worker took, wait for those they did; the workers are then free
        for the builds."""
        with self._cond:
            for i in self._queue:
                self._state[i] = _OWN
            self._queue.clear()
        self._thread.join()
        self._file.unlink(missing_ok=True)


def start(workers: BuildWorkers | None, jobs: Sequence[dict]) -> SearchAhead | None:
    """Searches ahead where there are workers and at least two searches (one is as fast
    here)."""
    if workers is None or len(jobs) < 2:
        return None
    return SearchAhead(workers, jobs)


__all__ = ["SearchAhead", "start"]
