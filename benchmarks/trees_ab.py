"""Two trees of tilec side by side on one device: ONNX models and matrix products, in
alternating blocks of calls, one fresh process a block.

    git archive REV | tar -x -C /tmp/old
    python benchmarks/trees_ab.py /tmp/old TARGET... [--device Portable] [--rounds 6] [--calls 10]

A TARGET is an ONNX model (MODEL.npz beside it, as `benchmarks/zoo.py export` writes it, gives
the input and onnxruntime's output `out0`) or `matmul:N` (N x N x N, random inputs).  Each
round runs every target once in each tree, the trees in turn; a block is a process that
imports the tree's tilec (PYTHONPATH), loads the target with the tree's own cache folder (warm
after the first round), checks the output (against `out0`, or numpy's product) with the
outputs poisoned first, and times `--calls` calls.  Reported per target: the median over
rounds of each block's median wall time and of its kernels' summed event times, their ratio
(new / old), and each kernel whose tile, work-group count or code differs between the trees with
its minimum and median event time in each; the last column says whether the two trees'
kernel text is the same (a row whose code is the same shows the machine's noise).  Blocks in
separate processes keep the trees' modules apart; alternating them lets both see the
machine's slow and fast phases.  `--hw-old` / `--hw-new` give each tree a hardware model
(TOML) instead of its device's own calibration."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from child import last_json  # noqa: E402 - beside this script

HERE = Path(__file__).resolve().parent
NEW = HERE.parent

PROBE = r"""
import json, sys, time
import numpy as np
import tilec, tilec.onnx
from pathlib import Path
from tilec.config import Config
target, device, calls, cache = sys.argv[1], sys.argv[2] or None, int(sys.argv[3]), sys.argv[4]
config = Config(device=device, cache_dir=Path(cache), hw=sys.argv[5] or None)
if target.startswith("matmul:"):
    n = int(target.split(":")[1])
    rng = np.random.default_rng(0)
    feed = {"A": rng.uniform(-1, 1, (n, n)).astype(np.float32),
            "B": rng.uniform(-1, 1, (n, n)).astype(np.float32)}
    mm = "function (A[M, K], B[K, N]) -> (C) { C[m, n : M, N] = +(A[m, k] * B[k, n]); }"
    exe = tilec.compile(mm, {"A": (n, n), "B": (n, n)}, config=config)
    want = feed["A"] @ feed["B"]
    run, info = exe.run, exe
else:
    data = np.load(target[:-5] + ".npz")
    exe = tilec.onnx.load(target, config=config, quiet=True)
    feed = {exe.inputs[0]: data["input"]}
    want = data["out0"]
    run, info = exe.run, None
out = next(iter(run(feed, poison=True).values()))
err = float(np.abs(out - want).max() / max(1e-30, float(np.abs(want).max())))
info = info or exe.last
walls, sums, per = [], [], {}
for _ in range(calls):
    t = time.perf_counter()
    run(feed)
    walls.append(time.perf_counter() - t)
    times = info.last_timings
    sums.append(sum(times.values()))
    for k, v in times.items():
        per.setdefault(k, []).append(v)
import hashlib, re
source = (info.executable if hasattr(info, "executable") else info).source
source = re.sub(r"/\*.*?\*/", "", source, flags=re.S)  # the code, not its cost comments
texts = {}
for part in re.split(r"(?=__kernel)", source):
    m = re.search(r"void\s+(\w+)\s*\(", part)
    if m:
        texts[m.group(1)] = hashlib.sha256(part.encode()).hexdigest()[:12]
kernels = {k.name: [str(k.tile), int(k.global_size), texts.get(k.name, "")]
           for k in info.kernels}
print(json.dumps({"wall": float(np.median(walls)), "sum": float(np.median(sums)), "err": err,
                  "per": per, "kernels": kernels,
                  "code": hashlib.sha256(source.encode()).hexdigest()}))
"""


def block(tree: Path, target: str, device: str, calls: int, cache: str, hw: str = "") -> dict:
    rest = os.environ.get("PYTHONPATH")  # a tree's tilec first, then whatever else was set
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{rest}" if rest else str(tree))
    return last_json([sys.executable, "-c", PROBE, target, device, str(calls), cache, hw],
                     f"{tree} {target}: the block", env=env, cwd=tempfile.gettempdir())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path, help="the other tree (a folder holding tilec/)")
    ap.add_argument("targets", nargs="+")
    ap.add_argument("--device", default="")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--hw-old", default="", help="a hardware model (TOML) the old tree compiles "
                    "for instead of its own device model and calibration")
    ap.add_argument("--hw-new", default="", help="the same for this tree: with both, the "
                    "trees plan for one set of facts, so a time model change is compared "
                    "alone (each tree's own calibration can differ by the host's phases)")
    args = ap.parse_args()
    trees = {"old": args.old.resolve(), "new": NEW}
    hws = {"old": args.hw_old, "new": args.hw_new}
    caches = {name: tempfile.mkdtemp(prefix=f"tilec-ab-{name}-") for name in trees}
    runs: dict[tuple[str, str], list[dict]] = {}
    for target in args.targets:  # the first (cold) load of each, outside the timed rounds
        for name, tree in trees.items():
            block(tree, target, args.device, 1, caches[name], hws[name])
    for _ in range(args.rounds):
        for target in args.targets:
            for name, tree in trees.items():
                runs.setdefault((target, name), []).append(
                    block(tree, target, args.device, args.calls, caches[name], hws[name]))
    print("| target | old wall ms | new wall ms | new / old | old kernels ms | new kernels ms "
          "| new / old | max error | code |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    notes = []
    for target in args.targets:
        o, n = runs[(target, "old")], runs[(target, "new")]
        w = [statistics.median(r["wall"] for r in x) * 1e3 for x in (o, n)]
        s = [statistics.median(r["sum"] for r in x) * 1e3 for x in (o, n)]
        err = max(r["err"] for r in o + n)
        # "same": the two trees built identical kernel text (the row is the machine's noise).
        code = "same" if o[0].get("code") == n[0].get("code") else "differs"
        print(f"| {Path(target).name} | {w[0]:.3f} | {w[1]:.3f} | {w[1] / w[0]:.3f} | "
              f"{s[0]:.3f} | {s[1]:.3f} | {s[1] / s[0]:.3f} | {err:.1e} | {code} |")
        ko, kn = o[0]["kernels"], n[0]["kernels"]
        for k in ko:
            if k in kn and ko[k] != kn[k]:
                how = "" if ko[k][:2] != kn[k][:2] else " (the same tile, its code differs)"
                to = [t for r in o for t in r["per"].get(k, [])]
                tn = [t for r in n for t in r["per"].get(k, [])]
                if to and tn:
                    notes.append(f"- {Path(target).name} `{k}`: min {min(to) * 1e3:.3f} -> "
                                 f"{min(tn) * 1e3:.3f} ms, median "
                                 f"{statistics.median(to) * 1e3:.3f} -> "
                                 f"{statistics.median(tn) * 1e3:.3f}; {ko[k][0]} ({ko[k][1]} "
                                 f"work-groups) -> {kn[k][0]} ({kn[k][1]}){how}")
    print("\n".join(notes) or "(no kernel's tile, work-groups or code differ)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
