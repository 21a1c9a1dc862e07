"""Planning work spread over worker processes: `map_in_processes(fn, jobs, workers)`.

Tile searches are Python and numpy on one core; a model's split-K decisions are a hundred of
them (`plan.splitk`), independent of each other.  Each worker is `python -m
tilec.plan.workers`, a new interpreter (not a fork of this one, which may hold a device
driver's threads and locks, and not multiprocessing's spawn, which imports the caller's main
module again: a user's script without a `__main__` guard would run in every worker).  It
reads one pickled (function, jobs) from stdin and writes the pickled list of results to
stdout.  Where a worker cannot start or fails, its jobs run in this process: the results are
the same, only later."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def map_in_processes(fn: Callable, jobs: Sequence, workers: int) -> list:
    """[fn(job) for job in jobs], the jobs dealt round-robin to `workers` processes.  `fn`
    must be a module-level function and the jobs picklable."""
    count = min(workers, len(jobs))
    if count < 2:
        return [fn(j) for j in jobs]
    shares = [list(range(i, len(jobs), count)) for i in range(count)]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # where this tilec is imported from
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    procs: list[subprocess.Popen | None] = []
    for _ in shares:  # all started before any is fed: their imports overlap
        try:
            procs.append(subprocess.Popen([sys.executable, "-m", "tilec.plan.workers"],
                                          env=env, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
        except OSError:
            procs.append(None)
    for k, (p, share) in enumerate(zip(procs, shares, strict=True)):
        if p is None:
            continue
        try:
            p.stdin.write(pickle.dumps((fn, [jobs[i] for i in share])))
            p.stdin.close()
        except (OSError, pickle.PicklingError, AttributeError, TypeError):
            p.kill()
            p.wait()
            procs[k] = None
    results: list = [None] * len(jobs)
    for p, share in zip(procs, shares, strict=True):
        got = None
        if p is not None:
            try:
                got = pickle.loads(p.stdout.read())
                p.wait()
            except (OSError, EOFError, pickle.UnpicklingError):
                got = None
            if p.returncode not in (0, None) or not isinstance(got, list) or \
                    len(got) != len(share):
                got = None
        if got is None:  # the worker failed: its share here
            got = [fn(jobs[i]) for i in share]
        for i, r in zip(share, got, strict=True):
            results[i] = r
    return results


def _serve() -> None:
    fn, jobs = pickle.loads(sys.stdin.buffer.read())
    out = pickle.dumps([fn(j) for j in jobs])
    sys.stdout.buffer.write(out)
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    _serve()
