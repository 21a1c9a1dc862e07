"""Planning work in worker processes (`plan.workers`): results in order, computed elsewhere,
and a worker that fails has its share done here."""

from __future__ import annotations

import os

from tilec.plan.workers import map_in_processes


def _square_and_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def _fails_elsewhere(parent: int) -> str:
    if os.getpid() != parent:
        raise RuntimeError("only the parent process can do this")
    return "here"


def test_jobs_run_in_other_processes_and_come_back_in_order():
    got = map_in_processes(_square_and_pid, list(range(7)), 3)
    assert [v for v, _ in got] == [x * x for x in range(7)]
    pids = {pid for _, pid in got}
    assert os.getpid() not in pids and len(pids) == 3


def test_a_failing_worker_has_its_jobs_done_here():
    me = os.getpid()
    assert map_in_processes(_fails_elsewhere, [me] * 4, 2) == ["here"] * 4


def test_one_worker_is_this_process():
    assert map_in_processes(_square_and_pid, [3], 4) == [(9, os.getpid())]
