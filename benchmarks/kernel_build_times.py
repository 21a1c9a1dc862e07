"""What the driver spends turning each kernel of a model into machine code, with each form of
vector access the CPU code can take (`plan.calibration.choose_access`), side by side.

    python benchmarks/kernel_build_times.py MODEL.onnx [--device Portable] [--top 12]

For each form ("vload": vloadN/vstoreN, "plain": pointers to vector types) the model is
compiled with the device's own hardware model but that form (tilec's caches in a new folder,
no build workers), and its distinct kernels are handed to a new process with an empty PoCL
cache, which builds each as a program of its own and launches it once (one work-group of its
size, zero-filled buffers): PoCL generates a kernel's machine code at its first launch.  The
kernels of the two compiles are matched by name.  Printed: the kernels that take longest in
either form, and the totals of the kernels that compute and of the copies a model's weights
go through at load (computed on the host where they are bound, so never launched there)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FORMS = ("vload", "plain")


def _time_kernels(path: str) -> None:
    """In a fresh process (PoCL's cache empty): build and first-launch each kernel."""
    import pyopencl as cl

    given = json.loads(Path(path).read_text())
    device = next(d for p in cl.get_platforms() for d in p.get_devices()
                  if given["device"] in f"{p.name} {d.name}")
    ctx = cl.Context([device])
    queue = cl.CommandQueue(ctx)
    cl.Program(ctx, "__kernel void warm(__global float* a) { a[0] = 1.0f; }").build()
    out = {}
    for k in given["kernels"]:
        t0 = time.perf_counter()
        prg = cl.Program(ctx, k["text"]).build(options=given["options"])
        t1 = time.perf_counter()
        kernel = cl.Kernel(prg, k["name"])
        bufs = [cl.Buffer(ctx, cl.mem_flags.READ_WRITE, max(4, n)) for n in k["args"]]
        for b, n in zip(bufs, k["args"], strict=True):
            cl.enqueue_fill_buffer(queue, b, b"\0", 0, max(4, n))
        kernel.set_args(*bufs)
        size = (k["local"] or 1,)
        queue.finish()
        t2 = time.perf_counter()
        cl.enqueue_nd_range_kernel(queue, kernel, size, size if k["local"] else None)
        queue.finish()
        out[k["name"]] = (t1 - t0, time.perf_counter() - t2)
    print(json.dumps(out))


def _kernels(model: str, device: str, form: str) -> tuple[list[dict], list[str], str]:
    import tilec.onnx
    from tilec.config import Config
    from tilec.plan.fuse import ContractionKernel, is_plain_copy
    from tilec.runtime.device import Runtime, hw_model_for

    with tempfile.TemporaryDirectory(prefix="tilec-buildtimes-") as d:
        config = Config(device=device, cache_dir=Path(d), build_workers=0,
                        use_tuning_records=False)
        runtime = Runtime.get(device)
        hw = replace(hw_model_for(None, config, runtime), vector_access=form)
        exe = tilec.onnx.load(model, hw=hw, config=config, quiet=True).last.executable
    copies = {k.name for k in exe.plan.kernels
              if isinstance(k, ContractionKernel) and is_plain_copy(k)}
    by_name = {s.name: s for s in exe.sources}
    kernels = []
    for entry in dict.fromkeys(exe.entries.values()):
        s = by_name[entry]
        kernels.append({"name": entry, "text": s.text, "local": s.local_size,
                        "args": [exe._buffer_bytes(a.tensor) for a in s.args]})
    return kernels, sorted(copies), runtime.info.label + ", " + runtime.info.platform_version


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--device", default="Portable")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--time-kernels", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.time_kernels:
        _time_kernels(args.time_kernels)
        return 0
    from tilec.config import Config

    times, copies, label = {}, set(), ""
    for form in FORMS:
        kernels, copied, label = _kernels(args.model, args.device, form)
        copies |= set(copied)
        with tempfile.TemporaryDirectory(prefix="tilec-buildtimes-") as d:
            spec = Path(d) / "kernels.json"
            spec.write_text(json.dumps({"device": args.device, "kernels": kernels,
                                        "options": list(Config().build_options)}))
            env = dict(os.environ, POCL_CACHE_DIR=f"{d}/pocl")
            p = subprocess.run([sys.executable, __file__, "--time-kernels", str(spec)],
                               env=env, capture_output=True, text=True, check=False)
            if p.returncode:
                raise SystemExit(f"timing the {form} kernels failed:\n{p.stderr[-2000:]}")
            times[form] = json.loads(p.stdout.strip().splitlines()[-1])
    names = [n for n in times[FORMS[0]] if n in times[FORMS[1]]]
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {label}, "
          f"`python benchmarks/kernel_build_times.py {' '.join(sys.argv[1:])}`\n")
    print("| kernel | build s (vload) | first launch s (vload) | build s (plain) "
          "| first launch s (plain) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    worst = sorted(names, key=lambda n: -max(times[f][n][1] for f in FORMS))[:args.top]
    for n in worst:
        row = " | ".join(f"{times[f][n][0]:.3f} | {times[f][n][1]:.3f}" for f in FORMS)
        print(f"| `{n}` | {row} |")
    for label, group in (("kernels that compute", [n for n in names if n not in copies]),
                         ("weight copies (at load)", [n for n in names if n in copies])):
        if not group:
            continue
        row = " | ".join(f"{sum(times[f][n][0] for n in group):.2f} | "
                         f"{sum(times[f][n][1] for n in group):.2f}" for f in FORMS)
        print(f"| **{len(group)} {label}** | {row} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
