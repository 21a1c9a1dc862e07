"""Chosen tiles of one contraction, each validated small and timed at full size: how a code
change moves given tiles (run it from each tree in turn, on the same device).

    python benchmarks/forced_tiles.py FILE.tile --shape D=32x224x224x64 --shape K=3x3x64x64 \
        --small D=2x20x28x64 --small K=3x3x64x64 --tile O:ci=4,co=64,i=3,j=1,n=8,x=8,y=4 \
        [--tile ...] [--choice] [--device NVIDIA] [--rounds 3] [--repeat 10] [--registers] \
        [--compare edge_tiles=false,true]

Each `--tile` (and, with `--choice` or without any `--tile`, the model's own choice) is
compiled at the `--small` shapes, run on random inputs with its outputs poisoned and checked
against the numpy reference, then compiled at the full shapes and timed: the median over
`--rounds` of the kernel's OpenCL event time (each round the median of `--repeat` calls; a
round times every tile in turn).
`--registers` adds the registers the driver's compiler gave the kernel, where it says
(NVIDIA).  One Markdown row a tile: the tile, whether it matched numpy, the time, the
registers and the time model's prediction."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _shape(spec: str) -> tuple[str, tuple[int, ...]]:
    name, _, dims = spec.partition("=")
    return name.strip(), tuple(int(d) for d in dims.lower().split("x"))


def _value(text: str):
    """A Config value from the command line: true / false / none, a number, else the text."""
    low = text.strip().lower()
    if low in ("true", "false", "none"):
        return {"true": True, "false": False, "none": None}[low]
    try:
        return int(low)
    except ValueError:
        return text.strip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--shape", action="append", default=[], help="full-size input shapes")
    ap.add_argument("--small", action="append", default=[], help="shapes for the check")
    ap.add_argument("--tile", action="append", default=[], metavar="OUT:IDX=N,...")
    ap.add_argument("--choice", action="store_true", help="the model's choice too")
    ap.add_argument("--device")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--registers", action="store_true")
    ap.add_argument("--compare", metavar="FIELD=A,B", help="build every tile under each value "
                    "of a Config field (edge_tiles=false,true), timed in the same rounds")
    args = ap.parse_args()

    import tilec
    from tilec.cli.options import parse_tiles
    from tilec.config import Config
    from tilec.runtime.device import Runtime
    from tilec.runtime.registers import register_counter

    src = Path(args.file).read_text()
    big = dict(_shape(s) for s in args.shape)
    small = dict(_shape(s) for s in args.small) or big
    runs = [parse_tiles([t]) for t in args.tile]
    if args.choice or not runs:
        runs.append({})
    rng = np.random.default_rng(0)
    settings: list[dict] = [{}]
    if args.compare:
        field, _, values = args.compare.partition("=")
        settings = [{field: _value(v)} for v in values.split(",")]
    built = []
    for tiles, extra in [(t, e) for t in runs for e in settings]:
        cfg = Config(device=args.device, tiles=tiles, use_tuning_records=False,
                     cache_dir=Path(tempfile.mkdtemp(prefix="tilec-forced-")), **extra)
        check = tilec.compile(src, small, config=cfg)
        ins = {n: rng.standard_normal(s).astype(np.float32) for n, s in small.items()}
        ok = check.check(ins, check.run(ins, poison=True)).ok
        exe = tilec.compile(src, big, config=cfg)
        kernel = max((s for s in exe.sources if s.kind == "contraction"),
                     key=lambda s: s.flops)
        built.append((tiles, cfg, ok, exe, kernel, extra))
    ins = {n: rng.standard_normal(s).astype(np.float32) for n, s in big.items()}
    for _, _, _, exe, _, _ in built:
        exe.run(ins, repeat=3)  # warm-up
    # Rounds go over every tile in turn, so that the machine's slow and fast phases fall on
    # all of them alike.
    times: list[list[float]] = [[] for _ in built]
    for _ in range(args.rounds):
        for i, (_, _, _, exe, kernel, _) in enumerate(built):
            exe.run(ins, repeat=args.repeat)
            times[i].append(exe.last_timings[kernel.name])
    print("| tile | matches numpy | ms (median) | ms (fastest round) | registers | predicted |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for (tiles, cfg, ok, _, kernel, extra), t in zip(built, times, strict=True):
        regs = ""
        if args.registers:
            counter = register_counter(Runtime.get(args.device), cfg)
            regs = str((counter(kernel.name, [kernel.text]) if counter else [None])[0] or "")
        tile = " ".join(f"{k}={v}" for k, v in kernel.tile.items())
        label = tile if tiles else f"{tile} (the model's choice)"
        label += "".join(f", {k}={v}" for k, v in extra.items())
        predicted = kernel.cost.splitlines()[-1].strip() if kernel.cost else ""
        predicted = predicted.split(",", 1)[0].replace("Predicted: ", "")
        print(f"| {label} | {'yes' if ok else 'NO'} | {np.median(t) * 1e3:.3f} | "
              f"{min(t) * 1e3:.3f} | {regs} | {predicted} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
