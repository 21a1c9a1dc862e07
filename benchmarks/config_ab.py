"""One `Config` setting against another on whole ONNX models: latency in interleaved rounds
(warm caches, medians) and, with --cold, load + first run with fresh tilec and driver caches
(each in a process of its own), side by side in one run.

    python benchmarks/config_ab.py MODEL.onnx [...] --field halos --values false,true
                                   [--device Portable] [--rounds 15] [--cold 2]

The outputs of the two settings are compared (the largest difference over the largest
magnitude) before any time counts."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

_COLD = """
import ast, sys, time
t0 = time.perf_counter()
from pathlib import Path
import numpy as np
import tilec.onnx
from tilec.config import Config
config = Config(device=sys.argv[2] or None, cache_dir=Path(sys.argv[3]), use_tuning_records=False,
                **{sys.argv[4]: ast.literal_eval(sys.argv[5])})
t = time.perf_counter()
exe = tilec.onnx.load(sys.argv[1], config=config, quiet=True)
load = time.perf_counter() - t
name, spec = next(iter(exe.last.graph.inputs.items()))
x = np.random.default_rng(1).standard_normal(spec.shape).astype(np.float32)
t = time.perf_counter()
exe(**{name: x})
print(f"{load:.3f} {time.perf_counter() - t:.3f} {time.perf_counter() - t0:.3f}")
"""


def value(text: str):
    low = text.strip().lower()
    return {"true": True, "false": False, "none": None}.get(low, text.strip())


def warm(paths: list[str], field: str, values: list, device: str | None, rounds: int) -> None:
    import numpy as np

    import tilec.onnx
    from tilec.config import Config

    cache = Path(tempfile.mkdtemp(prefix="tilec-ab-"))
    for path in paths:
        exes = [tilec.onnx.load(path, quiet=True, config=Config(
            device=device, cache_dir=cache, use_tuning_records=False, **{field: v}))
            for v in values]
        name, spec = next(iter(exes[0].last.graph.inputs.items()))
        x = np.random.default_rng(1).standard_normal(spec.shape).astype(np.float32)
        outs = [np.asarray(next(iter(e(**{name: x}).values()))) for e in exes]
        err = float(np.abs(outs[1] - outs[0]).max() / max(np.abs(outs[0]).max(), 1e-30))
        times: list[list[float]] = [[] for _ in exes]
        for _ in range(rounds):
            for i, e in enumerate(exes):
                t = time.perf_counter()
                e(**{name: x})
                times[i].append(time.perf_counter() - t)
        med = [float(np.median(t)) * 1e3 for t in times]
        print(f"| {Path(path).name} | {med[0]:.2f} ms | {med[1]:.2f} ms | "
              f"{med[1] / med[0]:.3f} | {err:.1e} |", flush=True)


def cold(paths: list[str], field: str, texts: list[str], device: str | None,
         rounds: int) -> None:
    for path in paths:
        cells: list[list[str]] = [[] for _ in texts]
        for _ in range(rounds):
            for i, text in enumerate(texts):
                env = dict(os.environ, POCL_CACHE_DIR=tempfile.mkdtemp(prefix="pocl-ab-"),
                           CUDA_CACHE_PATH=tempfile.mkdtemp(prefix="nv-ab-"))
                out = subprocess.run(
                    [sys.executable, "-c", _COLD, path, device or "",
                     tempfile.mkdtemp(prefix="tilec-ab-"), field, repr(value(text))],
                    env=env, capture_output=True, text=True, cwd=HERE.parent)
                if out.returncode:
                    raise SystemExit(out.stderr[-2000:])
                load, first, total = out.stdout.split()
                cells[i].append(f"{total} s ({load} + {first})")
        print(f"| {Path(path).name} cold | " + " | ".join(", ".join(c) for c in cells) + " |",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--field", required=True, help="a Config field, e.g. halos")
    ap.add_argument("--values", required=True, help="two values, comma-separated")
    ap.add_argument("--device", help="OpenCL device substring (default: tilec's choice)")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved warm rounds")
    ap.add_argument("--cold", type=int, default=0, help="cold loads a setting (0: none)")
    args = ap.parse_args()
    texts = args.values.split(",")
    if len(texts) != 2:
        raise SystemExit("--values: two values, comma-separated")
    import platform

    print(f"{platform.node()} {time.strftime('%Y-%m-%d %H:%M')}: {' '.join(sys.argv)}")
    print(f"| model | {args.field}={texts[0]} | {args.field}={texts[1]} | ratio | max diff |")
    print("| --- | ---: | ---: | ---: | ---: |")
    warm(args.models, args.field, [value(t) for t in texts], args.device, args.rounds)
    if args.cold:
        cold(args.models, args.field, texts, args.device, args.cold)


if __name__ == "__main__":
    main()
