"""Tuning on one worker against two: the wall time of `tilec tune` over the GPU suite's kernels
(benchmarks/suite.py) on a local Dask cluster (`--cluster local --device NVIDIA`) with
`--workers 1`, then `--workers 2` (a GPU each), and the ratio (the goal: <= 0.55).

    python benchmarks/tune_scale.py [--device NVIDIA] [--workers 1,2] [--rounds 1]
                                    [--top-k 8] [--repeat 5] [--lws] [--only SUBSTRINGS]

Each run is the whole command, in a subprocess of this Python: start-up, the cluster's start,
planning, and every kernel's candidates built, validated against the numpy reference and
timed.  Each starts cold and alike: a fresh record store (no run resumes from another's
records), a fresh tilec cache directory and a fresh NVIDIA build cache (CUDA_CACHE_PATH), so
that the later run builds no less than the earlier.  The device is opened here first, so that
tilec's device probe is stored before the first timed run.  With --rounds N the worker counts
alternate N times and the median of each is reported.  Nothing is downloaded: the host needs
tilec's dependencies and the [cluster] extra (dask, distributed) already installed."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import suite  # noqa: E402


def write_cases(cases: list[suite.Case], folder: Path) -> list[str]:
    """Each case as a .tile file whose first line gives its shapes (`tilec tune` reads them
    from there, one set a file)."""
    paths = []
    for i, case in enumerate(cases):
        shapes = " ".join(f"{n}={'x'.join(map(str, s))}" for n, s in case.shapes.items())
        path = folder / f"{i:02d}_{case.op}.tile"
        path.write_text(f"// shapes: {shapes}\n// {case.name}\n{case.source}")
        paths.append(str(path))
    return paths


def run_once(files: list[str], workers: int, args: argparse.Namespace,
             scratch: Path, tag: str) -> dict:
    records = scratch / f"records-{tag}.jsonl"
    env = dict(os.environ, TILEC_CACHE_DIR=str(scratch / f"cache-{tag}"),
               CUDA_CACHE_PATH=str(scratch / f"nv-{tag}"), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "tilec.cli", "tune", *files, "--cluster", "local",
           "--workers", str(workers), "--records", str(records), "--top-k", str(args.top_k),
           "--repeat", str(args.repeat), "--quiet"]
    if args.device:
        cmd += ["--device", args.device]
    if args.lws:
        cmd.append("--lws")
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    summary = [line for line in proc.stdout.splitlines()
               if line.startswith(("tuned ", "worker ", "failed", "records", "no records"))
               or "re-run" in line]
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n", file=sys.stderr)
    n = len(records.read_text().splitlines()) if records.exists() else 0
    print(f"  workers={workers}: {wall:.1f} s, rc {proc.returncode}, {n} records; "
          + " | ".join(summary), flush=True)
    return {"workers": workers, "wall_s": wall, "rc": proc.returncode, "records": n,
            "summary": summary, "command": shlex.join(cmd)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="NVIDIA", help="OpenCL device substring (workers get "
                    "one matching GPU each)")
    ap.add_argument("--workers", default="1,2", help="worker counts to compare (first: base)")
    ap.add_argument("--rounds", type=int, default=1, help="times each count runs, alternating")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--lws", action="store_true", help="also tune local work sizes")
    ap.add_argument("--only", help="comma-separated substrings of kernel names to tune")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    counts = [int(w) for w in args.workers.split(",")]

    from tilec.runtime.device import Runtime, all_devices, describe

    Runtime.get(args.device)  # the device probe, stored before any timed run
    devices = [describe(d).label for d in all_devices()]
    cases = suite.select(suite.gpu_cases(), args.only)
    print(f"date: {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"host: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print("devices: " + "; ".join(devices))
    print(f"kernels: {len(cases)} ({', '.join(c.name for c in cases)})")
    runs: dict[int, list[dict]] = {w: [] for w in counts}
    with tempfile.TemporaryDirectory(prefix="tilec-tune-scale-") as tmp:
        scratch = Path(tmp)
        files = write_cases(cases, scratch)
        for r in range(args.rounds):
            order = counts if r % 2 == 0 else counts[::-1]
            for w in order:
                runs[w].append(run_once(files, w, args, scratch, f"{w}w-{r}"))
    wall = {w: statistics.median(x["wall_s"] for x in rs) for w, rs in runs.items()}
    base = counts[0]
    print()
    print("| workers | wall s | / base |")
    print("| ---: | ---: | ---: |")
    for w in counts:
        print(f"| {w} | {wall[w]:.1f} | {wall[w] / wall[base]:.3f} |")
    ok = all(x["rc"] == 0 for rs in runs.values() for x in rs)
    if not ok:
        print("some runs failed (see above)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "date": datetime.datetime.now().isoformat(timespec="seconds"), "devices": devices,
            "kernels": [c.name for c in cases], "runs": runs, "wall_s": wall}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
