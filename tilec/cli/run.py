"""`tilec compile`, `tilec run` and `tilec devices`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ..errors import TileError
from ..lang.source import read_source
from .options import (
    add_device_options,
    add_quiet_option,
    dtypes_from,
    make_config,
    progress_for,
    shapes_from,
    values_from,
    with_values,
)


def _compile(args: argparse.Namespace, src):
    from ..compiler import COMPILE_STEPS
    from ..compiler import compile as tile_compile
    values = values_from(args)
    with progress_for(args, COMPILE_STEPS, f"compiling {args.file}") as bar:
        return tile_compile(src, shapes_from(args, src), dtype=dtypes_from(args, src, values),
                            config=make_config(args), values=values, progress=bar)


def cmd_compile(args: argparse.Namespace) -> int:
    src = read_source(args.file)
    exe = _compile(args, src)
    out = Path(args.output) if args.output else Path(args.file).with_suffix(".cl")
    out.write_text(exe.source)
    print(f"wrote {out} ({len(exe.sources)} kernel{'s' if len(exe.sources) != 1 else ''})")
    for split in getattr(exe, "splits", ()):
        print(f"  {split.describe()}")
    if args.manifest:
        from ..bundle import manifest

        Path(args.manifest).write_text(json.dumps(manifest(exe), indent=2) + "\n")
        print(f"wrote {args.manifest}")
    if args.bundle:
        from ..bundle import write_bundle

        info = write_bundle(exe, args.bundle)
        print(f"wrote {args.bundle} ({info})")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from ..lang.reference import random_array
    from .options import load_inputs

    arrays = load_inputs(args.input or [])
    if str(args.file).endswith(".tlc"):
        exe = _open_bundle(args)
        model = f"bundle {args.file} (" + ("its device binary" if exe.from_binary else
                                          f"built from source: {exe.fallback_reason}") + ")"
    else:
        src = read_source(args.file)
        if arrays and not args.shape:
            args.shape = [f"{k}={'x'.join(map(str, a.shape))}" for k, a in arrays.items()]
        exe = _compile(args, src)
        arrays = with_values(arrays, values_from(args))
        model = f"hardware model: {exe.hw.name}"
    rng = np.random.default_rng(args.seed)
    for name in exe.program.inputs:
        if name not in arrays:
            t = exe.program.tensors[name]
            arrays[name] = random_array(rng, t.shape, t.dtype)
    outs = exe.run(arrays, repeat=args.repeat, poison=args.validate)
    info = exe.runtime.info
    print(f"device: {info.label} ({info.platform_version}); {model}")
    for split in getattr(exe, "splits", ()):
        print(f"  {split.describe()}")
    total = 0.0
    for k in exe.kernels:
        t = exe.last_timings.get(k.name, 0.0)
        total += t
        rate = f"{k.flops / t * 1e-9:10.2f} GFLOP/s" if t > 0 and k.flops else ""
        tile = " ".join(f"{n}={v}" for n, v in k.tile.items())
        tuned = "  (tuned)" if k.name in exe.tuned else ""
        print(f"  {k.name:<24} {t * 1e3:10.3f} ms {rate}  {tile}{tuned}")
    print(f"  {'total':<24} {total * 1e3:10.3f} ms (median of {args.repeat})")
    if args.validate:
        v = exe.check(exe._inputs(arrays), outs)
        status = "ok" if v.ok else "MISMATCH"
        print(f"validation: {status}: max abs error {v.max_abs_error:.3g}, max rel error "
              f"{v.max_rel_error:.3g}" + (f"; {v.worst}" if not v.ok else ""))
        if not v.ok:
            return 2
    if args.save:
        d = Path(args.save)
        d.mkdir(parents=True, exist_ok=True)
        for name, arr in outs.items():
            np.save(d / f"{name}.npy", arr)
    return 0


def _open_bundle(args: argparse.Namespace):
    """A bundle (`tilec compile --bundle`) runs as it was compiled: its shapes, tiles and
    tuning are in it, so the options that would change them are refused, not ignored."""
    import warnings

    from ..bundle import BundleWarning, load

    given = [f"--{o.replace('_', '-')}" for o in ("shape", "hw", "tile", "records")
             if getattr(args, o, None)]
    given += ["--no-records"] if getattr(args, "no_records", False) else []
    given += ["--dtype"] if getattr(args, "dtype", "float32") != "float32" else []
    if given:
        raise TileError(f"{args.file}: {', '.join(given)} cannot change a bundle: it runs "
                        "with the shapes, types, tiles and tuning it was compiled with "
                        "(compile the .tile program again to change them)")
    with warnings.catch_warnings():
        # The fallback to source is reported on the device line instead.
        warnings.simplefilter("ignore", BundleWarning)
        return load(args.file, device=args.device)


def cmd_devices(args: argparse.Namespace) -> int:
    from ..plan.hw_device import from_device
    from ..runtime import calibrate
    from ..runtime.device import PROBE_WIDTHS, Runtime, all_devices, describe, probe_result

    want = (args.device or "").lower()
    devices = [d for d in all_devices() if want in describe(d).label.lower()]
    if not devices:
        names = "; ".join(describe(d).label for d in all_devices())
        raise TileError(f"no OpenCL device matches {args.device!r} (devices: {names})")
    for d in devices:
        info = describe(d)
        probed = probe_result(d)
        limit = probed.vector_limit if probed.problem is None else None
        print(f"{info.label}  [{info.kind}, {info.version}, driver {info.driver}]"
              + (f"  UNUSABLE: {probed.problem}" if probed.problem else "")
              + (f"  (float vectors wider than {limit} compute wrongly: capped)"
                 if limit and limit < PROBE_WIDTHS[0] else ""))
        print(f"  platform: {info.platform_version}")
        cal = calibrate.stored(info)
        if args.calibrate and probed.problem is None:
            rt = Runtime(d)
            cal = calibrate.calibrate(rt.context, d, rt.vector_limit, info.label)
            if not calibrate.remember(info, cal):
                print(f"  (could not write {calibrate.calibrated_path()})")
        if cal is not None:
            print("  " + cal.describe().replace("\n", "\n  "))
        elif probed.problem is None:
            print("  not calibrated yet: `tilec devices --calibrate` measures it (about 2 s; "
                  "a CPU's first compile does)")
        try:
            model = calibrate.apply(from_device(d, max_vec=limit), cal)
            print("  " + model.describe().replace("\n", "\n  "))
        except TileError as e:
            print(f"  no hardware model: {e}")
    return 0


def register(sub, common) -> None:
    sp = sub.add_parser("compile", help="compile a program to OpenCL C")
    common(sp)
    add_device_options(sp)
    sp.add_argument("-o", "--output", help="the .cl file to write (default: FILE.cl)")
    sp.add_argument("--manifest", help="also write a JSON manifest of kernels and buffers")
    sp.add_argument("--bundle", metavar="OUT.tlc", help="also write one file with the "
                    "kernels, the device binary and the tuning records (tilec.load runs it)")
    add_quiet_option(sp)
    sp.set_defaults(fn=cmd_compile)

    sp = sub.add_parser("run", help="compile, run and time a program (or run a .tlc bundle) "
                        "on a device")
    common(sp)
    add_device_options(sp)
    sp.add_argument("--input", action="append", metavar="NAME=FILE.npy")
    sp.add_argument("--validate", action="store_true", help="compare with the numpy reference")
    sp.add_argument("--repeat", type=int, default=5, help="runs to time (median reported)")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--save", metavar="DIR", help="write each output as DIR/NAME.npy")
    add_quiet_option(sp)
    sp.set_defaults(fn=cmd_run)

    sp = sub.add_parser("devices", help="list OpenCL devices and their derived models")
    sp.add_argument("--calibrate", action="store_true",
                    help="measure each device (mul-add forms, vector widths, bandwidths, "
                    "launch cost; about 2 s each) and keep the result for later compiles")
    sp.add_argument("--device", metavar="SUBSTRING",
                    help="only the devices whose 'platform: device' text contains this")
    sp.set_defaults(fn=cmd_devices)
