"""`tilec` command line: check, eval, explain, compile, run, devices, tune, cache."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import TileError
from ..lang import ir
from ..lang.reference import random_array
from ..lang.source import read_source
from .options import dtypes_from, load_inputs, shapes_from, values_from, with_values


def cmd_check(args: argparse.Namespace) -> int:
    from ..lang.api import check_program

    src = read_source(args.file)
    values = values_from(args)
    program = check_program(src, shapes_from(args, src), dtypes_from(args, src, values), values)
    for name, t in program.tensors.items():
        role = ("input" if name in program.inputs else
                "output" if name in program.outputs else "temporary")
        dims = "x".join(str(d) for d in t.shape) or "scalar"
        print(f"{name:>12}  {dims:<24} {t.dtype:<8} {role}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from ..lang.api import check_program, parse
    from ..lang.check import normalize_dtype
    from ..lang.reference import evaluate_program

    src = read_source(args.file)
    values = values_from(args)
    arrays = with_values(load_inputs(args.input or []), values)
    # Inputs given as arrays keep their shapes and element types (as `tilec.evaluate` does);
    # the others take --shape (or the `// shapes:` comment) and --dtype.
    shapes = {**shapes_from(args, src), **{k: a.shape for k, a in arrays.items()}}
    fn = parse(src)
    dtypes = {i.name: normalize_dtype(arrays[i.name].dtype, f"--input {i.name}")
              if i.name in arrays else args.dtype for i in fn.inputs}
    values = {k: int(a) for k, a in arrays.items()
              if a.shape == () and dtypes.get(k) in ir.INT_DTYPES}
    program = check_program(fn, shapes, dtypes, values)
    rng = np.random.default_rng(args.seed)
    for name in program.inputs:
        if name not in arrays:
            t = program.tensors[name]
            arrays[name] = random_array(rng, t.shape, t.dtype)
    outs = evaluate_program(program, arrays)
    save = Path(args.save) if args.save else None
    if save:
        save.mkdir(parents=True, exist_ok=True)
    for name, arr in outs.items():
        print(f"{name}: shape {list(arr.shape)} {arr.dtype} mean {float(np.mean(arr)):.6g} "
              f"min {float(np.min(arr)):.6g} max {float(np.max(arr)):.6g}")
        if save:
            np.save(save / f"{name}.npy", arr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tilec", description="Compile Tile programs to OpenCL.")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("file", help="a .tile program")
        sp.add_argument("--shape", action="append", metavar="NAME=AxBxC",
                        help="an input's shape (the file's `// shapes:` comment gives the others)")
        sp.add_argument("--dtype", default="float32", help="element type of the inputs")
        sp.add_argument("--value", action="append", metavar="NAME=INT",
                        help="a 0-d integer input the program uses as a size (PlaidML's "
                        "integer parameters): fixed when compiling")

    sp = sub.add_parser("check", help="check a program and print every tensor's shape")
    common(sp)
    sp.set_defaults(fn=cmd_check)

    sp = sub.add_parser("eval", help="evaluate a program with the numpy reference")
    common(sp)
    sp.add_argument("--input", action="append", metavar="NAME=FILE.npy")
    sp.add_argument("--save", metavar="DIR", help="write each output as DIR/NAME.npy")
    sp.add_argument("--seed", type=int, default=0, help="seed for inputs not given")
    sp.set_defaults(fn=cmd_eval)

    for register in _extra_commands():
        register(sub, common)
    return p


def _extra_commands() -> list:
    from . import bench as cli_bench
    from . import cache as cli_cache
    from . import explain as cli_explain
    from . import graph as cli_graph
    from . import run as cli_run
    from . import tune as cli_tune

    return [cli_run.register, cli_explain.register, cli_cache.register, cli_tune.register,
            cli_graph.register, cli_bench.register]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except TileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
