"""What the driver spends turning each kernel of a model into machine code, with each form of
vector access the CPU code can take (`plan.calibration.choose_access`), side by side.

    python benchmarks/kernel_build_times.py MODEL.onnx [--device Portable] [--top 12]
    python benchmarks/kernel_build_times.py MODEL.onnx --against OLD_TREE [--rounds 2]

For each form ("vload": vloadN/vstoreN, "plain": pointers to vector types) the model is
compiled with the device's own hardware model but that form (tilec's caches in a new folder,
no build workers), and its distinct kernels are handed to a new process with an empty PoCL
cache, which builds each as a program of its own and launches it once (one work-group of its
size, zero-filled buffers): PoCL generates a kernel's machine code at its first launch.  The
kernels of the two compiles are matched by name.  Printed: the kernels that take longest in
either form, and the totals of the kernels that compute and of the copies a model's weights
go through at load (computed on the host where they are bound, so never launched there).

`--against`: instead of the two forms, the device's own code from another tree of tilec (`git
archive REV | tar -x -C OLD_TREE`) and from this one, each timed as above, the trees in turn
for `--rounds` rounds (medians of each kernel's times)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from child import last_json  # noqa: E402 - beside this script

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


def _kernels(model: str, device: str, form: str | None) -> tuple[list[dict], list[str], str]:
    import tilec.onnx
    from tilec.config import Config
    from tilec.plan.fuse import ContractionKernel, is_plain_copy
    from tilec.runtime.device import Runtime
    from tilec.runtime.device_model import hw_model_for

    with tempfile.TemporaryDirectory(prefix="tilec-buildtimes-") as d:
        config = Config(device=device, cache_dir=Path(d), build_workers=0,
                        use_tuning_records=False)
        runtime = Runtime.get(device)
        hw = hw_model_for(None, config, runtime)
        if form is not None:
            hw = replace(hw, vector_access=form)
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


def _dump(tree: str, model: str, device: str, out: str) -> None:
    """In a fresh process: the device's own kernels of `model` as tree `tree` writes them."""
    sys.path[:] = [tree] + [x for x in sys.path if x != str(ROOT)]
    kernels, copies, label = _kernels(model, device, None)
    Path(out).write_text(json.dumps({"kernels": kernels, "copies": copies, "label": label}))


def _timed(kernels: list[dict], device: str) -> dict:
    from tilec.config import Config

    with tempfile.TemporaryDirectory(prefix="tilec-buildtimes-") as d:
        spec = Path(d) / "kernels.json"
        spec.write_text(json.dumps({"device": device, "kernels": kernels,
                                    "options": list(Config().build_options)}))
        env = dict(os.environ, POCL_CACHE_DIR=f"{d}/pocl")
        return last_json([sys.executable, __file__, "--time-kernels", str(spec)],
                         "timing the kernels", env=env)


def _against(args) -> tuple[dict, set, str, tuple[str, str]]:
    """The two trees' kernels, timed in turn; per tree, each kernel's median times."""
    given, copies, label = {}, set(), ""
    trees = {"old": str(Path(args.against).resolve()), "new": str(ROOT)}
    with tempfile.TemporaryDirectory(prefix="tilec-buildtimes-") as d:
        for tag, tree in trees.items():
            out = f"{d}/{tag}.json"
            p = subprocess.run([sys.executable, __file__, args.model, "--device", args.device,
                                "--dump", tree, out], capture_output=True, text=True,
                               check=False)
            if p.returncode:
                raise SystemExit(f"the {tag} tree's kernels:\n{p.stderr[-2000:]}")
            got = json.loads(Path(out).read_text())
            given[tag], label = got["kernels"], got["label"]
            copies |= set(got["copies"])
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for r in range(args.rounds):
        for tag in (("old", "new") if r % 2 == 0 else ("new", "old")):
            runs[tag].append(_timed(given[tag], args.device))
    times = {tag: {n: tuple(statistics.median(run[n][i] for run in rs) for i in (0, 1))
                   for n in rs[0]} for tag, rs in runs.items()}
    return times, copies, label, ("old", "new")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--device", default="Portable")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--against", metavar="OLD_TREE",
                    help="compare the device's own code of another tree of tilec with this one")
    ap.add_argument("--rounds", type=int, default=2, help="with --against: rounds of each tree")
    ap.add_argument("--time-kernels", help=argparse.SUPPRESS)
    ap.add_argument("--dump", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.time_kernels:
        _time_kernels(args.time_kernels)
        return 0
    if args.dump:
        _dump(args.dump[0], args.model, args.device, args.dump[1])
        return 0
    if args.against:
        times, copies, label, forms = _against(args)
    else:
        times, copies, label, forms = {}, set(), "", FORMS
        for form in FORMS:
            kernels, copied, label = _kernels(args.model, args.device, form)
            copies |= set(copied)
            times[form] = _timed(kernels, args.device)
    names = [n for n in times[forms[0]] if n in times[forms[1]]]
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {label}, "
          f"`python benchmarks/kernel_build_times.py {' '.join(sys.argv[1:])}`\n")
    print(f"| kernel | build s ({forms[0]}) | first launch s ({forms[0]}) | build s ({forms[1]}) "
          f"| first launch s ({forms[1]}) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    worst = sorted(names, key=lambda n: -max(times[f][n][1] for f in forms))[:args.top]
    for n in worst:
        row = " | ".join(f"{times[f][n][0]:.3f} | {times[f][n][1]:.3f}" for f in forms)
        print(f"| `{n}` | {row} |")
    for label, group in (("kernels that compute", [n for n in names if n not in copies]),
                         ("weight copies (at load)", [n for n in names if n in copies])):
        if not group:
            continue
        row = " | ".join(f"{sum(times[f][n][0] for n in group):.2f} | "
                         f"{sum(times[f][n][1] for n in group):.2f}" for f in forms)
        print(f"| **{len(group)} {label}** | {row} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
