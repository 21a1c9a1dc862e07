"""tilec benchmarks against the peers a user would pick instead, measured side by side in one run.

    python benchmarks/run.py [--suite cpu] [--repeat N] [--budget S] [--only KERNELS]
                             [--skip KERNELS] [--plaidml-skip KERNELS]
                             [--plaidml-python PATH] [--device SUBSTRING] [--rounds R]

The CPU suite (benchmarks/suite.py): fp32 matmul 256..4096 and 4096x4096x1024, the seed's
conv 3x3 + ReLU at N=1 56x56 and 224x224 (64->64), a depthwise 3x3, 2x2 max pooling and a
softmax over 1000 columns.  Peers: numpy/OpenBLAS (matmul; as the environment has it, and again
in a process with OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset when they are set), onnxruntime
(conv, depthwise, pooling, softmax) and PlaidML 0.7.0 on `llvm_cpu.0` running the same Tile
text in its own venv (benchmarks/plaidml_runner.py).  Then compile figures for the seed conv:
tilec cold and cached in fresh processes, PlaidML's first call.

Every figure is the median of repeated runs after a warm-up (at most --repeat, fewer when they
would take more than --budget seconds, never fewer than 3 unless one run alone is longer);
inputs are random and every result, tilec's and each peer's, is checked against the numpy
reference before its time counts.  The machine is shared: the script reads from /proc/stat how
much of the CPUs other processes took while a kernel was measured (the "others' CPU" column)
and measures that kernel again, once they are quiet, when it was more than --quiet.  With
--rounds R, tilec and the in-process peers are timed in turn R times and each figure is the
median over the rounds: a VM's slow and fast phases then fall on all of them alike.
tilec's time is the kernels' OpenCL event time (the model's first-choice tile, no tuning
records); its wall time per run (launch + wait) is shown beside it.  Peers' times are wall
times of the call (numpy, onnxruntime) or of the invocation and wait (PlaidML).  For
convolutions, "tilec call, weights bound" is the wall time of a whole call of tilec's
executable with the filter bound once (what onnxruntime's initializer is): the input's upload,
the launch and the output's download each call.

Prints markdown tables (paste into BENCHMARKS.md), writes the figures as JSON
(benchmarks/results-cpu.json) and, with matplotlib, the roofline (benchmarks/roofline-cpu.png)."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import harness  # noqa: E402
import suite  # noqa: E402

DEFAULT_PLAIDML_PYTHON = "/tmp/plaidml-venv/bin/python"
OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
NUMPY_UNSET = "numpy (OPENBLAS_* unset)"
BOUND = "tilec call, weights bound"
PEERS = [BOUND, "numpy", NUMPY_UNSET, "onnxruntime", "PlaidML"]


def copy_bandwidth(mib: int = 512, repeat: int = 10) -> float:
    """Bytes/s of a large numpy copy (read + write), the best of one and of two threads (numpy
    drops the GIL while copying, so two threads copy halves in parallel)."""
    n = mib * 2**20 // 4
    src = np.random.default_rng(1).random(n, dtype=np.float32)
    dst = np.empty_like(src)
    best = 0.0
    for threads in (1, os.cpu_count() or 1):
        edges = [n * i // threads for i in range(threads + 1)]
        spans = list(zip(edges[:-1], edges[1:], strict=True))
        with ThreadPoolExecutor(threads) as pool:
            def copy(span):
                np.copyto(dst[span[0]:span[1]], src[span[0]:span[1]])

            times = []
            for _ in range(repeat + 1):
                t = time.perf_counter()
                list(pool.map(copy, spans))
                times.append(time.perf_counter() - t)
        best = max(best, 2 * src.nbytes / statistics.median(times[1:]))
    return best


def fma_peak(threads: int) -> tuple[float, float] | None:
    """(all threads, one thread) GFLOP/s of benchmarks/fma_peak.c, or None without a C
    compiler or AVX-512."""
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        exe = f"{d}/fma_peak"
        try:
            subprocess.run([cc, "-O2", "-mavx512f", "-pthread", "-o", exe,
                            str(HERE / "fma_peak.c")], check=True, capture_output=True)
            # Best of three runs: a neighbour's burst only ever lowers the figure.
            runs = [subprocess.run([exe, str(threads)], check=True, capture_output=True,
                                   text=True).stdout.split() for _ in range(3)]
        except (OSError, subprocess.CalledProcessError):
            return None
    return max(float(r[0]) for r in runs), max(float(r[1]) for r in runs)


def cpu_clock_ghz() -> float:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return float(line.split(":")[1]) / 1e3
    except OSError:
        pass
    return 0.0


def blas_arch() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "? (threadpoolctl not installed)"
    return ", ".join(f"{i.get('internal_api')} {i.get('version')} {i.get('architecture')} "
                     f"({i.get('num_threads')} threads)" for i in threadpool_info()
                     if i.get("user_api") == "blas")


def measure_case(case, args, config, pl_env, plaidml_python, pl_skip: bool,
                 unset_env: dict | None) -> harness.Result:
    """tilec and every peer on one kernel, and how much of the CPUs others took meanwhile."""
    print(f"[{time.strftime('%H:%M:%S')}] {case.name} (load {harness.loadavg()})",
          file=sys.stderr, flush=True)
    others = harness.Neighbours()
    res, arrays, ref, exe = harness.measure_tilec(case, config, args.repeat, args.budget)
    if arrays is None:
        print(f"  tilec: {res.error}", file=sys.stderr)
        return res
    again = {}
    builds = [("numpy", suite.numpy_peer), ("onnxruntime", suite.onnxruntime_peer)]
    if case.op in suite.WEIGHTS:
        # What a model's call does: the filter bound once (as onnxruntime's initializer is),
        # the input uploaded and the output read back each call; timed as the peers are.
        builds.insert(0, (BOUND, lambda c, a: suite.tilec_bound_peer(c, a, config)))
    for name, build in builds:
        keep: dict = {}
        entry = harness.run_peer(build, case, arrays, ref, exe, args.repeat, args.budget,
                                 keep=keep)
        if entry is not None:
            res.peers[name] = entry
        if "fn" in keep:
            again[name] = keep["fn"]
    harness.alternate(res, exe, arrays, again, args.rounds, args.repeat, args.budget)
    with tempfile.TemporaryDirectory(prefix="tilec-bench-") as d:
        data = Path(d)
        harness.write_data(data, arrays, ref, case.source)
        if case.op == "matmul" and unset_env is not None:
            r = harness.run_json([sys.executable, str(HERE / "numpy_runner.py"), "--data", d,
                                  "--repeat", str(args.repeat), "--budget", str(args.budget)],
                                 unset_env, 1200)
            res.peers[NUMPY_UNSET] = ({"s": r["median_s"], "blas": r.get("blas")}
                                      if r.get("ok") else
                                      {"s": None, "note": r.get("error", "wrong result")})
        if plaidml_python and pl_skip:
            res.peers["PlaidML"] = {"s": None, "note": "left out of this run (--plaidml-skip)"}
        elif plaidml_python:
            res.peers["PlaidML"] = harness.plaidml_peer(plaidml_python, pl_env, data, case,
                                                        args.repeat, args.budget)
    del arrays, ref, exe
    summary = ", ".join(f"{k} {v['s'] * 1e3:.2f} ms" if v.get("s") else f"{k} n/a"
                        for k, v in res.peers.items())
    res.neighbours = others.share()
    print(f"  tilec {res.tilec_s * 1e3:.2f} ms; {summary}; other processes "
          f"{res.neighbours or 0:.0%} of the CPUs", file=sys.stderr, flush=True)
    return res


def wait_quiet(threshold: float, max_wait: float) -> None:
    """Until other processes take less than half of `threshold` of the CPUs over 10 s (or
    `max_wait` seconds have passed: then measure anyway, and the table says how noisy)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < max_wait:
        probe = harness.Neighbours()
        time.sleep(10)
        share = probe.share() or 0
        if share < threshold / 2:
            return
        print(f"  waiting: other processes take {share:.0%} of the CPUs", file=sys.stderr,
              flush=True)


def cpu_suite(args, config, notes: list[str]) -> tuple[list, list]:
    import onnxruntime  # noqa: F401 - fail early, not in the middle of the run

    plaidml_python = args.plaidml_python if Path(args.plaidml_python).exists() else None
    if plaidml_python is None:
        notes.append(f"PlaidML: n/a ({args.plaidml_python} not found; create it with "
                     "`python3 -m venv /tmp/plaidml-venv && /tmp/plaidml-venv/bin/pip "
                     "install plaidml==0.7.0 numpy`)")
    pl_env = harness.plaidml_env({"PLAIDML_DEVICE_IDS": "llvm_cpu.0"})
    unset_env = {k: v for k, v in os.environ.items() if k not in OPENBLAS_VARS}
    want_unset = any(k in os.environ for k in OPENBLAS_VARS) and not args.no_numpy_unset
    all_cases = suite.cpu_cases()
    skip = {c.name for c in suite.select(all_cases, args.skip)} if args.skip else set()
    pl_skip = ({c.name for c in suite.select(all_cases, args.plaidml_skip)}
               if args.plaidml_skip else set())
    cases = [c for c in suite.select(all_cases, args.only) if c.name not in skip]
    results = []
    for case in cases:
        best = first = None
        for attempt in range(1 + args.retries):
            if attempt:
                wait_quiet(args.quiet, args.max_wait)
            res = measure_case(case, args, config, pl_env if plaidml_python else None,
                               plaidml_python, case.name in pl_skip, unset_env if want_unset
                               else None)
            first = first or res
            if best is None or (res.neighbours or 0) < (best.neighbours or 0):
                best = res
            if (res.neighbours or 0) <= args.quiet or res.error:
                break
        # A second compile of the same text finds PoCL's cache warm: the first is the cold one.
        best.tilec_compile_s = first.tilec_compile_s
        best.attempts = attempt + 1
        results.append(best)
    compile_rows = []
    if not args.no_compile:
        print(f"[{time.strftime('%H:%M:%S')}] compile figures", file=sys.stderr, flush=True)
        seed = suite.conv(1, 56, 64)
        compile_rows = harness.compile_figures(
            seed, dict(os.environ), args.device,
            harness.plaidml_first_calls(plaidml_python, pl_env, seed) if plaidml_python
            else None)
    return results, compile_rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="cpu", choices=["cpu"],
                    help="the GPU suite is benchmarks/gpu.py (run on the GPU host)")
    ap.add_argument("--repeat", type=int, default=20, help="most timed runs a measurement")
    ap.add_argument("--budget", type=float, default=15.0,
                    help="seconds one measurement's repeats may take (fewer repeats past it)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time tilec and the in-process peers (numpy, onnxruntime) in turn "
                    "this many times; each figure is the median over the rounds")
    ap.add_argument("--device", help="OpenCL device substring (default: tilec's choice)")
    ap.add_argument("--only", help="comma-separated substrings of kernel names to run")
    ap.add_argument("--skip", help="kernels to leave out (names or substrings, as --only)")
    ap.add_argument("--plaidml-skip", metavar="KERNELS",
                    help="kernels to run without PlaidML (as --only); its llvm_cpu takes "
                    "about 90 s for one 4096 matmul")
    ap.add_argument("--plaidml-python", default=DEFAULT_PLAIDML_PYTHON,
                    help="python of a venv with plaidml==0.7.0 and numpy")
    ap.add_argument("--no-numpy-unset", action="store_true",
                    help="skip numpy with OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset")
    ap.add_argument("--no-compile", action="store_true", help="skip the compile figures")
    ap.add_argument("--quiet", type=float, default=0.10,
                    help="a kernel measured while other processes took more than this share "
                    "of the CPUs is measured again, once they are quiet (default 0.10)")
    ap.add_argument("--retries", type=int, default=3, help="most re-measurements a kernel")
    ap.add_argument("--max-wait", type=float, default=600.0,
                    help="seconds to wait for quiet before a re-measurement")
    ap.add_argument("--clock-ghz", type=float, default=None,
                    help="peak FLOP/s = cores x --flops-per-cycle x this (default: the clock "
                    "benchmarks/fma_peak.c runs at, else /proc/cpuinfo's cpu MHz)")
    ap.add_argument("--flops-per-cycle", type=float, default=64.0,
                    help="fp32 FLOP per cycle per core (default 64: two 512-bit FMA pipes)")
    ap.add_argument("--bandwidth", type=float, default=None,
                    help="GB/s for the roofline (default: measured with a numpy copy)")
    ap.add_argument("--json", help="where the figures go (default: benchmarks/results-cpu.json "
                    "for the whole suite, the temporary folder for part of it)")
    ap.add_argument("--png", help="where the roofline goes (default: beside the figures)")
    args = ap.parse_args()
    args.json, args.png = (str(p) for p in harness.output_paths(args, "cpu", HERE))

    # A PoCL kernel cache of our own, empty: every compile figure in the table is a cold build.
    os.environ["POCL_CACHE_DIR"] = harness.scratch("tilec-bench-pocl-")
    from tilec.config import Config
    from tilec.runtime.device import Runtime

    rt = Runtime.get(args.device)
    config = Config(device=args.device, use_tuning_records=False,
                    cache_dir=Path(harness.scratch("tilec-bench-cache-")))
    # The peaks are measured too, and a neighbour's burst would lower them.
    wait_quiet(args.quiet, args.max_wait)
    load_start = harness.loadavg()
    others = harness.Neighbours()
    cores = os.cpu_count() or 1
    measured = None if args.clock_ghz else fma_peak(cores)
    if args.clock_ghz:
        ghz, how = args.clock_ghz, "clock given"
    elif measured:
        # The clock the FMA loop ran at: turbo is above the nominal /proc/cpuinfo figure.
        ghz = measured[0] * 1e9 / (cores * args.flops_per_cycle * 1e9)
        how = (f"clock from an AVX-512 FMA loop, {measured[0]:.0f} GFLOP/s on {cores} threads, "
               f"{measured[1]:.0f} on one; /proc/cpuinfo says {cpu_clock_ghz():.2f} GHz")
    else:
        ghz, how = cpu_clock_ghz(), "clock from /proc/cpuinfo"
    bw = args.bandwidth * 1e9 if args.bandwidth else copy_bandwidth()
    peaks = {"flops": cores * args.flops_per_cycle * ghz * 1e9, "bytes": bw}
    notes: list[str] = []
    results, compile_rows = cpu_suite(args, config, notes)
    load_end = harness.loadavg()
    neighbours = others.share()

    import onnxruntime

    pl_version = next((r.peers["PlaidML"].get("version") for r in results
                       if r.peers.get("PlaidML", {}).get("version")), None)
    meta = {
        "date": str(datetime.date.today()),
        "machine": f"{platform.machine()} {platform.processor() or ''} {cores} cores",
        "device": rt.info.label, "platform_version": rt.info.platform_version,
        "numpy": np.__version__, "blas": blas_arch(),
        "openblas_env": {k: os.environ.get(k) for k in OPENBLAS_VARS},
        "onnxruntime": onnxruntime.__version__, "plaidml": pl_version or "n/a",
        "peak_flops": peaks["flops"], "peak_bytes": peaks["bytes"],
        "peak_note": (f"{cores} cores x {args.flops_per_cycle:g} FLOP/cycle x {ghz:.2f} GHz "
                      f"({how}); bandwidth "
                      f"{'given' if args.bandwidth else 'a 512 MiB numpy copy, read + write'}"),
        "load_start": load_start, "load_end": load_end, "neighbours": neighbours,
        "command": "python benchmarks/run.py " + shlex.join(sys.argv[1:]),
    }
    unset = next((r.peers[NUMPY_UNSET].get("blas") for r in results
                  if r.peers.get(NUMPY_UNSET, {}).get("blas")), None)
    if unset:
        meta["blas_unset"] = ", ".join(f"{b['internal_api']} {b['version']} "
                                       f"{b['architecture']} ({b['num_threads']} threads)"
                                       for b in unset if isinstance(b, dict))
    harness.save_json(Path(args.json), meta, results, compile_rows)
    print(f"date: {meta['date']}; machine: {meta['machine']}; load average {load_start} "
          f"(start), {load_end} (end); other processes took {neighbours or 0:.0%} of the CPUs "
          "during the run (worst kernel: "
          f"{max((r.neighbours or 0 for r in results), default=0):.0%})")
    print(f"device: {meta['device']}; platform {meta['platform_version']}")
    print(f"peaks: {peaks['flops'] * 1e-9:.0f} GFLOP/s ({meta['peak_note']}), "
          f"{peaks['bytes'] * 1e-9:.1f} GB/s")
    print(f"numpy {np.__version__} ({meta['blas']}; env {meta['openblas_env']}); with both "
          f"unset: {meta.get('blas_unset', 'not run')}; onnxruntime {meta['onnxruntime']}; "
          f"PlaidML {meta['plaidml']} (llvm_cpu.0)")
    print(f"command: {meta['command']}")
    for n in notes:
        print(n)
    print()
    print(harness.tables(results, PEERS, peaks, "GFLOP/s"))
    if compile_rows:
        print("\nCompile figures, seed conv 3x3 + ReLU N=1 56x56 64->64:\n")
        print(harness.compile_table(compile_rows))
    try:
        import roofline

        roofline.plot(Path(args.json), Path(args.png))
        print(f"\nroofline: {args.png}")
    except ImportError as e:
        print(f"\nno roofline ({e}); pip install matplotlib", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
