"""GPU benchmarks: tilec on the GPU's OpenCL against torch (cuBLAS / cuDNN fp32, TF32 off) and,
given its wheel, PlaidML 0.7.0 on the same OpenCL device, side by side in one run.

    python benchmarks/gpu.py [--repeat N] [--budget S] [--hw MODEL] [--only SUBSTRINGS]
                             [--plaidml DIR] [--peak-tflops 66.9] [--bandwidth-gbs 3350]
                             [--estimate-registers]

The GPU suite (benchmarks/suite.py): fp32 matmul 256..4096 and 4096x4096x1024, the seed conv
3x3 + ReLU at N=1 56x56, N=1 224x224 and the seed's full N=32 224x224 (64->64), a depthwise
3x3, 2x2 max pooling and a softmax over 1000 columns; then compile figures for the seed conv.

tilec's time is the median OpenCL event time of its kernels; torch's the median CUDA event time
of the same operation (convolutions in NCHW, tilec's in NHWC); PlaidML's the wall time of one
invocation and the wait for it, which in PlaidML's API is a map of the output and so includes
its copy to the host (benchmarks/plaidml_runner.py; the copy alone is in the JSON as map_s).
Inputs are random and every result is checked against the numpy reference first.

--plaidml DIR: a folder with the plaidml-0.7.0 wheel and six (the wheels are unpacked into a
temporary folder), or a folder where they are unpacked already.  PlaidML then runs in a
subprocess of this Python with PLAIDML_NATIVE_PATH, the two configs and PYTHONPATH pointing
into it and PLAIDML_EXPERIMENTAL=1, on the device whose id contains --plaidml-device."""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import harness  # noqa: E402
import suite  # noqa: E402

PEERS = ["torch", "PlaidML"]
# fp32 (non-tensor) peak and HBM bandwidth of the SXM parts; other GPUs: give them.
KNOWN = {"H100": (66.9e12, 3.35e12), "H200": (66.9e12, 4.8e12)}


def torch_timer(fn, repeat: int, budget: float):
    """Median CUDA event time of fn() after a warm-up, and the warm-up's result."""
    import torch

    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    first = time.perf_counter() - t
    times = []
    for _ in range(harness.repeats_for(first, repeat, budget)):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(times), out


def plaidml_setup(folder: str) -> tuple[dict, str]:
    """Environment for PlaidML from a folder of wheels or of unpacked wheels; (env, note)."""
    root = Path(folder)
    wheels = sorted(root.glob("*.whl"))
    if wheels:
        root = Path(harness.scratch("plaidml-"))
        for w in wheels:
            if w.name.split("-")[0].lower() in ("plaidml", "six", "cffi", "pycparser"):
                with zipfile.ZipFile(w) as z:
                    z.extractall(root)
    data = next(root.glob("plaidml-*.data"), None)
    if data is None:
        raise SystemExit(f"--plaidml {folder}: no plaidml-*.whl there, nor an unpacked "
                         "plaidml-*.data folder")
    share = data / "data" / "share" / "plaidml"
    env = harness.plaidml_env({
        "PLAIDML_NATIVE_PATH": str(data / "data" / "lib" / "libplaidml.so"),
        "PLAIDML_EXPERIMENTAL_CONFIG": str(share / "experimental.json"),
        "PLAIDML_DEFAULT_CONFIG": str(share / "config.json"),
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    })
    return env, str(root)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20, help="most timed runs a measurement")
    ap.add_argument("--budget", type=float, default=10.0,
                    help="seconds one measurement's repeats may take (fewer repeats past it)")
    ap.add_argument("--hw", default=None, help="hardware model (default: derived from device)")
    ap.add_argument("--device", help="OpenCL device substring (default: tilec's choice, a GPU)")
    ap.add_argument("--only", help="comma-separated substrings of kernel names to run")
    ap.add_argument("--plaidml", metavar="DIR", help="PlaidML 0.7.0 wheels (see above)")
    ap.add_argument("--plaidml-device", default="nvidia",
                    help="substring of PlaidML's device id (default: nvidia)")
    ap.add_argument("--peak-tflops", type=float, help="fp32 peak (default: H100/H200 by name)")
    ap.add_argument("--bandwidth-gbs", type=float, help="memory bandwidth (default: by name)")
    ap.add_argument("--no-compile", action="store_true", help="skip the compile figures")
    ap.add_argument("--estimate-registers", action="store_true",
                    help="rank tiles with the time model's register estimate, not the "
                         "driver compiler's counts (Config.compiler_registers=False)")
    ap.add_argument("--json", help="where the figures go (default: benchmarks/results-gpu.json "
                    "for the whole suite, the temporary folder for part of it)")
    ap.add_argument("--png", help="where the roofline goes (default: beside the figures)")
    args = ap.parse_args()
    args.json, args.png = (str(p) for p in harness.output_paths(args, "gpu", HERE))
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # An empty NVIDIA build cache of our own: the compile column is a cold build.
    os.environ["CUDA_CACHE_PATH"] = harness.scratch("tilec-bench-nv-")
    from tilec.config import Config
    from tilec.runtime.device import Runtime

    rt = Runtime.get(args.device)
    gpu_name = torch.cuda.get_device_name()
    known = next((v for k, v in KNOWN.items() if k in gpu_name), None)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else (known or (None, None))[0]
    bw = args.bandwidth_gbs * 1e9 if args.bandwidth_gbs else (known or (None, None))[1]
    if peak is None or bw is None:
        raise SystemExit(f"{gpu_name}: give --peak-tflops and --bandwidth-gbs")
    peaks = {"flops": peak, "bytes": bw}
    config = Config(device=args.device, hw=args.hw, use_tuning_records=False,
                    cache_dir=Path(harness.scratch("tilec-bench-cache-")),
                    compiler_registers=not args.estimate_registers)
    pl_env = None
    if args.plaidml:
        pl_env, pl_root = plaidml_setup(args.plaidml)
    results = []
    for case in suite.select(suite.gpu_cases(), args.only):
        print(f"[{time.strftime('%H:%M:%S')}] {case.name}", file=sys.stderr, flush=True)
        res, arrays, ref, exe = harness.measure_tilec(case, config, args.repeat, args.budget)
        results.append(res)
        if arrays is None:
            print(f"  tilec: {res.error}", file=sys.stderr)
            continue
        entry = harness.run_peer(suite.torch_peer, case, arrays, ref, exe, args.repeat,
                                 args.budget, timer=torch_timer)
        if entry is not None:
            res.peers["torch"] = entry
        torch.cuda.empty_cache()
        if pl_env is not None:
            with tempfile.TemporaryDirectory(prefix="tilec-bench-") as d:
                harness.write_data(Path(d), arrays, ref, case.source)
                res.peers["PlaidML"] = harness.plaidml_peer(
                    sys.executable, pl_env, Path(d), case, args.repeat, args.budget,
                    args.plaidml_device)
        del arrays, ref, exe
        summary = ", ".join(f"{k} {v['s'] * 1e3:.3f} ms" if v.get("s") else f"{k} n/a"
                            for k, v in res.peers.items())
        tl = f"{res.tilec_s * 1e3:.3f} ms" if res.tilec_s else res.error
        print(f"  tilec {tl}; {summary}", file=sys.stderr, flush=True)
    compile_rows = []
    if not args.no_compile:
        print(f"[{time.strftime('%H:%M:%S')}] compile figures", file=sys.stderr, flush=True)
        seed = suite.conv(32, 224, 64)
        compile_rows = harness.compile_figures(
            seed, dict(os.environ), args.device,
            harness.plaidml_first_calls(sys.executable, pl_env, seed, args.plaidml_device)
            if pl_env else None)
    pl_version = next((r.peers["PlaidML"].get("version") for r in results
                       if r.peers.get("PlaidML", {}).get("version")), None)
    meta = {
        "date": str(datetime.date.today()), "device": rt.info.label,
        "platform_version": rt.info.platform_version, "driver": rt.info.driver,
        "gpu": gpu_name, "torch": torch.__version__, "hw": args.hw or "derived from device",
        "plaidml": (f"{pl_version} from {args.plaidml} ({pl_root})" if args.plaidml
                    else "not run (no --plaidml)"),
        "peak_flops": peak, "peak_bytes": bw,
        "peak_note": f"fp32 {peak * 1e-12:.1f} TFLOP/s, {bw * 1e-9:.0f} GB/s "
                     f"({'given' if args.peak_tflops else 'the ' + gpu_name + ' datasheet'})",
        "command": "python benchmarks/gpu.py " + shlex.join(sys.argv[1:]),
    }
    harness.save_json(Path(args.json), meta, results, compile_rows)
    print(f"date: {meta['date']}; device: {meta['device']}, driver {meta['driver']}; "
          f"torch {meta['torch']} on {gpu_name}, TF32 off; hw model: {meta['hw']}; "
          f"PlaidML: {meta['plaidml']}; peaks: {meta['peak_note']}")
    print(f"command: {meta['command']}")
    print()
    print(harness.tables(results, PEERS, peaks, "TFLOP/s"))
    if compile_rows:
        print("\nCompile figures, seed conv 3x3 + ReLU N=32 224x224 64->64:\n")
        print(harness.compile_table(compile_rows))
    try:
        import roofline

        roofline.plot(Path(args.json), Path(args.png))
        print(f"\nroofline: {args.png}")
    except ImportError as e:
        print(f"\nno roofline ({e}); python benchmarks/roofline.py {args.json} -o PNG "
              "where matplotlib is installed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
