"""Cold against warm: tilec from Tile text to a first checked result, each run a fresh process.

    python benchmarks/cold_warm.py [FILE.tile ...] [--rounds 5] [--device TEXT]

Cold: every cache empty (tilec's programs, searches, parser tables and templates, the device
probe, PoCL's and NVIDIA's build caches, each moved into a new folder).  Warm: a new process
over the folders a cold process filled.  Each round is one cold process then one warm one;
medians over the rounds.  Figures from benchmarks/compile_probe.py: opening the device, then
`tilec.compile` (parse through the driver's build), then the first run (where PoCL generates
the machine code; counted as its time beyond the fastest of three later runs, so that a big
kernel's own run time does not hide the build).  Prints a Markdown table, with the ratios."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from harness import run_json  # noqa: E402

FIELDS = ("open_s", "compile_s", "extra_s")


def one(file: Path, folder: str, device: str | None) -> dict:
    env = dict(os.environ, POCL_CACHE_DIR=f"{folder}/pocl", CUDA_CACHE_PATH=f"{folder}/nv",
               XDG_CACHE_HOME=f"{folder}/xdg", TILEC_CACHE_DIR=folder)
    cmd = [sys.executable, str(HERE / "compile_probe.py"), str(file), "--cache-dir", folder]
    if device:
        cmd += ["--device", device]
    t = time.perf_counter()
    r = run_json(cmd, env, 900)
    r["process_s"] = time.perf_counter() - t
    if "error" in r or not r.get("valid"):
        raise SystemExit(f"{file}: {r.get('error') or 'the first result did not validate'}")
    r["extra_s"] = max(0.0, r["first_run_s"] - r["second_run_s"])
    return r


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}x" if b > 1e-3 else "—"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path,
                    default=[ROOT / "examples" / "conv_relu.tile",
                             ROOT / "examples" / "seed_conv.tile"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device")
    args = ap.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M')} on {platform.node()} ({os.cpu_count()} CPUs), "
          f"`python benchmarks/cold_warm.py {' '.join(sys.argv[1:])}`")
    rows = []
    for file in args.files:
        cold, warm = [], []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="tilec-coldwarm-") as d:
                cold.append(one(file, d, args.device))
                warm.append(one(file, d, args.device))
        rows.append((file.name, cold, warm))
    print("\n| program | state | open device s | compile s | first run beyond a run s "
          "| text to runnable s | with opening s | whole process s |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, cold, warm in rows:
        med = {}
        for state, runs in (("cold", cold), ("warm", warm)):
            m = {k: statistics.median(r[k] for r in runs) for k in (*FIELDS, "process_s")}
            m["result"] = statistics.median(r["compile_s"] + r["extra_s"] for r in runs)
            m["opened"] = statistics.median(r["open_s"] + r["compile_s"] + r["extra_s"]
                                            for r in runs)
            med[state] = m
            print(f"| {name} | {state} | {m['open_s']:.3f} | {m['compile_s']:.3f} | "
                  f"{m['extra_s']:.3f} | {m['result']:.3f} | {m['opened']:.3f} | "
                  f"{m['process_s']:.2f} |")
        c, w = med["cold"], med["warm"]
        print(f"| {name} | cold / warm | {c['open_s'] / w['open_s']:.1f}x | "
              f"{c['compile_s'] / w['compile_s']:.1f}x | {_ratio(c['extra_s'], w['extra_s'])} "
              f"| **{c['result'] / w['result']:.1f}x** | **{c['opened'] / w['opened']:.1f}x** | "
              f"{c['process_s'] / w['process_s']:.1f}x |")
    dev = subprocess.run([sys.executable, "-m", "tilec.cli", "devices"], capture_output=True,
                         text=True, cwd=ROOT).stdout.strip().splitlines()
    print("\ndevices:", "; ".join(dev[:4]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
