"""`tilec graph` (a graph, the passes, its Tile) and `tilec onnx` (import, run, validate)."""

from __future__ import annotations

import argparse
import runpy
from pathlib import Path

import numpy as np

from ..errors import TileError
from ..graph.builder import Graph


def load_graph(path: str, shapes: dict[str, tuple[int, ...]],
               arrays: dict[str, np.ndarray]) -> Graph:
    """A graph from an .onnx model, or from a Python file that defines `graph()` (returning a
    `tilec.Graph`) or a `Graph` named `graph`."""
    if path.endswith(".py"):
        try:
            space = runpy.run_path(path)
        except OSError as e:
            raise TileError(f"cannot read {path}: {e}") from None
        found = space.get("graph")
        g = found() if callable(found) and not isinstance(found, Graph) else found
        if not isinstance(g, Graph):
            raise TileError(f"{path} defines no `graph` (a tilec.Graph, or a function "
                            "returning one)")
        return g
    from ..onnx.importer import to_graph

    return to_graph(path, arrays, shapes)


def lowered(path: str, shapes: dict[str, tuple[int, ...]], channels_last: bool):
    """A graph's (.onnx model, .py graph script) program lowered to Tile as `compile` lowers
    it (its weights bound: `program.bound`); None where it has no kernels."""
    program = load_graph(path, shapes, {}).optimized(channels_last=channels_last).lower()
    return program if program.has_kernels else None


def _inputs(args: argparse.Namespace) -> tuple[dict[str, tuple[int, ...]],
                                               dict[str, np.ndarray]]:
    from ..lang.source import parse_shape
    from .options import load_inputs

    shapes = dict(parse_shape(s) for s in (args.shape or []))
    return shapes, load_inputs(args.input or [])


def random_inputs(g: Graph, given: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    from ..lang.reference import random_array

    rng = np.random.default_rng(seed)
    return {k: given[k] if k in given else random_array(rng, t.shape, t.dtype)
            for k, t in g.inputs.items()}


def _passes(args: argparse.Namespace) -> list[str] | None:
    if args.no_passes:
        return []
    return [p.strip() for p in args.passes.split(",") if p.strip()] if args.passes else None


def cmd_graph(args: argparse.Namespace) -> int:
    from ..graph.builder import GraphExecutable
    from ..graph.passes import trace
    from ..runtime.validate import compare
    from .options import make_config

    shapes, given = _inputs(args)
    g = load_graph(args.file, shapes, given)
    print(g)
    steps = trace(g, _passes(args))
    for name, after in steps:
        if args.dump_passes:
            print(f"\n== after {name}: {len(after.nodes)} nodes, "
                  f"{len(after.constants)} constants")
            print(after)
    final = steps[-1][1] if steps else g
    if not args.dump_passes and steps:
        print(f"\n== after {len(steps)} passes")
        print(final)
    if args.print_tile:
        print()
        print(final.to_tile(), end="")
    if not args.run:
        return 0
    from ..graph.builder import GRAPH_STEPS
    from .options import progress_for

    with progress_for(args, GRAPH_STEPS, f"compiling {args.file}") as bar:
        exe = GraphExecutable.build(final, config=make_config(args), progress=bar)
    arrays = random_inputs(g, given, args.seed)
    outs = exe.run(arrays, poison=True)
    for k in exe.kernels:
        if k.name in exe.hoisted and k.name not in exe.bind_timings:
            print(f"  {k.name:<28}  on the host, at load (a copy of constants)")
            continue
        once = " once, at load (constants alone)" if k.name in exe.hoisted else ""
        t = exe.bind_timings.get(k.name) or exe.last_timings.get(k.name, 0.0)
        print(f"  {k.name:<28} {t * 1e3:9.3f} ms{once}")
    ref = g.evaluate(**arrays)  # the graph before the passes: checks them too
    lowered = exe.program
    # Outputs with no elements (tilec.empty) come from the host: their shapes are compared.
    empty_ok = all(ref[k].shape == outs[k].shape for k in lowered.empty_outputs)
    if exe.executable is None:
        print(f"no kernels: every output is empty; shapes {'ok' if empty_ok else 'MISMATCH'}")
        return 0 if empty_ok else 2
    v = compare({t: ref[k] for k, t in lowered.outputs.items()},
                {t: outs[k] for k, t in lowered.outputs.items()},
                exe.executable.program, exe.executable.config)
    if not empty_ok:
        print("validation against the unoptimised graph: MISMATCH: empty output shapes")
        return 2
    print(f"validation against the unoptimised graph: {'ok' if v.ok else 'MISMATCH'}: max abs "
          f"error {v.max_abs_error:.3g}" + (f"; {v.worst}" if not v.ok else ""))
    return 0 if v.ok else 2


def cmd_onnx(args: argparse.Namespace) -> int:
    from ..onnx.importer import load, read_model
    from .options import make_config

    shapes, given = _inputs(args)
    model = read_model(args.file)
    passes = _passes(args)
    exe = load(model, config=make_config(args), passes=True if passes is None else passes,
               shapes=shapes, quiet=args.quiet)
    if exe.last is None:  # static operands or symbolic shapes: known from the arrays
        g = _graph_with(exe, given, shapes)
        arrays = {**given, **random_inputs(g, given, args.seed)}
        exe.executable_for(arrays)
    else:
        arrays = {**given, **random_inputs(exe.last.graph, given, args.seed)}
    ge = exe.last
    assert ge is not None
    print(f"model {args.file}: {len(model.graph.node)} ONNX nodes -> {len(ge.graph.nodes)} "
          f"graph nodes -> {len(ge.kernels)} kernels")
    if args.print_tile:
        print(ge.tile, end="")
    if not args.run:
        return 0
    outs = exe.run(arrays, repeat=args.repeat, poison=True)
    total = 0.0
    for k in ge.kernels:
        if k.name in ge.hoisted:
            t = ge.bind_timings.get(k.name)
            print(f"  {k.name:<28}  on the host, at load (a copy of weights)" if t is None
                  else f"  {k.name:<28} {t * 1e3:9.3f} ms once, at load (weights alone)")
            continue
        t = ge.last_timings.get(k.name, 0.0)
        total += t
        print(f"  {k.name:<28} {t * 1e3:9.3f} ms")
    print(f"  {'total':<28} {total * 1e3:9.3f} ms (median of {args.repeat})")
    for name, arr in outs.items():
        print(f"{name}: shape {list(arr.shape)} {arr.dtype}")
    if args.save:
        d = Path(args.save)
        d.mkdir(parents=True, exist_ok=True)
        for name, arr in outs.items():
            np.save(d / f"{_file_name(name)}.npy", arr)
    if args.validate:
        ok = _validate(model, exe, arrays, outs)
        return 0 if ok else 2
    return 0


def _graph_with(exe, given: dict[str, np.ndarray], shapes: dict) -> Graph:
    from ..onnx.importer import to_graph

    missing = [s for s in exe.info.static if s not in given]
    if missing:
        raise TileError(f"input {missing[0]} decides a shape: give it with --input "
                        f"{missing[0]}=FILE.npy")
    return to_graph(exe.model, given, shapes)


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _validate(model, exe, arrays: dict[str, np.ndarray], outs: dict[str, np.ndarray]) -> bool:
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    if ort is not None:
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        feed = {i.name: np.asarray(arrays[i.name]).astype(exe.info.in_dtypes[i.name])
                for i in exe.info.inputs}
        ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed), strict=True))
        against = "onnxruntime"
    else:
        ref = exe.last.graph.evaluate(**{k: v for k, v in arrays.items()
                                         if k in exe.last.graph.inputs})
        against = "the numpy reference (onnxruntime is not installed)"
    ok = True
    for name, got in outs.items():
        r = np.asarray(ref[name], np.float64)
        g = np.asarray(got, np.float64)
        err = float(np.max(np.abs(r - g), initial=0.0))
        scale = float(np.max(np.abs(r), initial=1.0))
        good = r.shape == g.shape and bool(np.allclose(g, r, rtol=1e-3, atol=1e-4 * max(1, scale)))
        ok &= good
        print(f"validation of {name} against {against}: {'ok' if good else 'MISMATCH'}: "
              f"max abs error {err:.3g}")
    return ok


def register(sub, common) -> None:
    from .options import add_device_options, add_quiet_option

    def shared(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--shape", action="append", metavar="NAME=AxBxC",
                        help="an input's shape where the model leaves it symbolic")
        sp.add_argument("--input", action="append", metavar="NAME=FILE.npy")
        sp.add_argument("--passes", help="comma-separated passes (default: the inference set)")
        sp.add_argument("--no-passes", action="store_true", help="compile the graph as it is")
        sp.add_argument("--print-tile", action="store_true", help="print the Tile program")
        sp.add_argument("--run", action="store_true", help="compile and run on a device")
        sp.add_argument("--seed", type=int, default=0, help="seed for inputs not given")
        add_device_options(sp)
        add_quiet_option(sp)

    sp = sub.add_parser("graph", help="show a graph (.onnx, or .py defining graph()) and "
                        "the inference passes")
    sp.add_argument("file")
    shared(sp)
    sp.add_argument("--dump-passes", action="store_true", help="print the graph after each pass")
    sp.set_defaults(fn=cmd_graph)

    sp = sub.add_parser("onnx", help="import an ONNX model, compile, run and validate it")
    sp.add_argument("file", help="a .onnx model")
    shared(sp)
    sp.add_argument("--validate", action="store_true",
                    help="compare with onnxruntime (or the numpy reference without it)")
    sp.add_argument("--repeat", type=int, default=1, help="runs to time (median reported)")
    sp.add_argument("--save", metavar="DIR", help="write each output as DIR/NAME.npy")
    sp.set_defaults(fn=cmd_onnx)
