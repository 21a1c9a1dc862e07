"""`tilec explain`: why each kernel got its tile — the flat table, the search, the cost log,
the memory layout and the threading."""

from __future__ import annotations

import argparse

from ..lang.source import read_source
from .options import add_model_option, add_split_k_option


def explain(src, shapes, dtype, hw_name: str, device: str | None,
            tiles: dict[str, dict[str, int]], top: int, cost_log: str | None,
            model: str = "time", split: bool | int | None = None,
            constants: tuple[str, ...] = ()) -> str:
    """`constants`: the inputs a graph binds once (its weights), planned as `compile` plans
    them (relaid in panels at bind where a product's tile gains)."""
    from dataclasses import replace

    from ..codegen.generate import packed, split_k
    from ..config import Config
    from ..lang.api import check_program
    from ..plan.attention import AttentionKernel
    from ..plan.edges import edge_index
    from ..plan.flatten import describe
    from ..plan.fuse import ContractionKernel, fuse_attention, plan_kernels, use_halos
    from ..plan.hw import HwModel
    from ..plan.rows import RowKernel
    from ..plan.schedule import make_schedule
    from ..plan.search import search, tile_log, write_log

    program = check_program(src, shapes, dtype)
    records: dict = {}  # kernel name -> tuning record (on the device explained only)
    if hw_name in (None, "", "auto"):
        from ..compiler import corrected_model, load_records
        from ..runtime.device import Runtime
        from ..runtime.device_model import hw_model_for
        from ..tune.records import DeviceKey, lookup
        from .options import cache_settings

        rt = Runtime.get(device)
        # As compile derives it: the device's queries, its stored calibration and the time
        # model's correction from its tuning records.
        config = Config(device=device, **cache_settings())
        found = load_records(config)
        own = hw_model_for(None, config, rt)
        hw = corrected_model(own, found, rt)
        # As compile plans it by default (row fusion on; attention kernels where not a CPU;
        # CPU matrix products' operands packed in panels), with the model as measured: the
        # correction ranks tiles, not which kernels there are.
        config = replace(config, tiles=tiles, cost_model=model, split_k=split)
        program, splits = split_k(program, own, config)
        program = packed(program, own, config, constants)
        plan = plan_kernels(program, attention=fuse_attention(Config(), own),
                            halos=use_halos(config, own))
        records = lookup(plan, hw, config, DeviceKey.from_info(rt.info), found=found)
    else:
        hw = HwModel.load(hw_name)
        from .options import cache_settings

        config = Config(tiles=tiles, cost_model=model, split_k=split, **cache_settings())
        program, splits = split_k(program, hw, config)
        program = packed(program, hw, config, constants)
        plan = plan_kernels(program, attention=fuse_attention(Config(), hw),
                            halos=use_halos(config, hw))
    out = [f"hardware model: {hw.describe()}", ""]
    out += [s.describe() for s in splits] + ([""] if splits else [])
    logs = []
    for k in plan.kernels:
        if isinstance(k, RowKernel):
            out += _row_kernel(k, program, hw)
            continue
        if isinstance(k, AttentionKernel):
            out += _attention_kernel(k, program, hw)
            continue
        if not isinstance(k, ContractionKernel):
            out.append(f"== {k.name}: elementwise, {len(k.ops)} statement(s) over "
                       f"{list(k.shape)}; writes {', '.join(k.writes) or 'nothing'}")
            out += [f"   {op.text}" for op in k.ops]
            out.append("")
            continue
        dt = program.tensors[k.op.output].dtype
        out.append(f"== {k.name}: {k.op.text}")
        if k.post_ops:
            out.append("   post-ops: " + "; ".join(p.text for p in k.post_ops)
                       + f" ({k.post_op_count} operations)")
        out.append(f"   writes: {', '.join(k.writes)}; output map: {k.out_map}")
        out.append("")
        out += _rewrites(program, k.op)
        out.append(describe(k.flat))
        out.append("")
        forced = tiles.get(k.op.output) or tiles.get(k.name) or tiles.get("*")
        if forced is not None:
            cost, lines = tile_log(k.flat, hw, forced, k.post_op_count, dt, model)
            out.append("Scoring the given tile:")
            out.append("\n".join(lines))
            chosen = cost.tile
            logs.append([cost])
            if not cost.ok:
                out.append("(this tile is rejected by the model; shown anyway)")
        else:
            result = search(k.flat, hw, post_ops=k.post_op_count, dtype=dt,
                            top_k=max(top, 1), model=model)
            out.append("Search: " + result.describe())
            out.append(f"Top {min(top, len(result.top))} of the cost log:")
            out.append("\n".join("\n".join(result.log_lines(i))
                                 for i in range(min(top, len(result.top)))))
            chosen = result.tile
            logs.append(result)
        names = k.flat.names
        rec = records.get(k.name)
        if rec is not None:
            # What tuning measured, beside what the model predicts for the same tile.
            tile = {n: t for n, t in rec.tile}
            _, lines = tile_log(k.flat, hw, tile, k.post_op_count, dt, model)
            pred = [ln.strip() for ln in lines if "Predicted:" in ln]
            out.append("")
            out.append(f"Tuning record: [{', '.join(f'{n}: {t}' for n, t in rec.tile)}] "
                       f"measured {rec.seconds * 1e3:.4g} ms on {rec.device.device}"
                       + (f"; {pred[0].split(',')[0].lower()} for it" if pred else ""))
        out.append("")
        out.append("Chosen tile: [" + ", ".join(f"{n}: {t}" for n, t in
                                               zip(names, chosen, strict=True)) + "]")
        from ..plan.layout import layout

        out.append("")
        out.append("Memory layout and threading (PlaidML's plan):")
        out.append(layout(k.flat, chosen, hw, dt).describe())
        s = make_schedule(k.flat, tuple(chosen), hw)
        vec = (f"{s.vec} lanes along {names[s.vec_index]}"
               + (" (a reduction index: lanes are summed at the end)" if s.dot else "")
               if s.vec_index is not None else "scalar")
        thr = ", ".join(f"{names[i]} {s.threads[i]}" for i in k.flat.out_indices)
        out.append("")
        out.append(f"Generated kernel: {s.wg_threads} work-items per group ({thr}); "
                   f"{len(_points(s))} accumulators per work-item; vectors: {vec}; staging: "
                   + ("local memory" if any(x is not None for x in s.staged) else
                      "none (inputs read through the cache)")
                   + (f"; {k.flat.inputs[s.run.input].name} read in vectors of 4 points along "
                      f"{names[s.run.index]}" if s.run is not None else "")
                   + ("; reduction loop pipelined (next tile read during this one, local "
                      "tiles double-buffered)" if s.pipeline else "")
                   + (f"; {s.sweep.describe(k.flat, chosen[s.sweep.index])}" if s.sweep
                      else "")
                   + (f"; the last tile along {names[e]} with code of its own"
                      if hw.kind == "cpu" and (e := edge_index(s)) is not None else ""))
        out.append("")
    if cost_log:
        # Each kernel's part in one file: a searched kernel's with its predictions.
        import io

        fmt = "jsonl" if str(cost_log).endswith((".jsonl", ".json")) else "text"
        parts = []
        for entry in logs:
            buf = io.StringIO()
            write_log(entry, buf, fmt)
            parts.append(buf.getvalue())
        with open(cost_log, "w", encoding="utf-8") as f:
            f.write("".join(parts))
        out.append(f"cost log written to {cost_log}")
    return "\n".join(out).rstrip() + "\n"


def _row_kernel(k, program, hw) -> list[str]:
    """A row-fused kernel: its statements, rows, and how a row is walked on this model."""
    from ..codegen.rows import row_source

    src = row_source(k, program, hw)
    return ([f"== {k.name}: row-fused, {len(k.ops)} statement(s); {k.rows} rows of {k.length} "
             f"elements (axes {', '.join(map(str, k.axes))} of {list(k.full)}); writes "
             f"{', '.join(k.writes) or 'nothing'}"]
            + [f"   {op.text}" for op in k.ops] + [f"   {src.cost}", ""])


def _attention_kernel(k, program, hw) -> list[str]:
    """An attention kernel: its statements, the roles found, and the form chosen."""
    from ..codegen.attention_tiled import attention_kernel

    src = attention_kernel(k, program, hw)
    causal = f"; keys up to {k.causal[0]} * {k.query[0]} + {k.causal[1]}" if k.causal else ""
    return ([f"== {k.name}: attention, {len(k.statements)} statements in one kernel; writes "
             f"{', '.join(k.writes) or 'nothing'}"]
            + [f"   {op.text}" for op in k.statements]
            + [f"   key {k.key}, depth {', '.join(k.depth)}, queries {', '.join(k.query)}, "
               f"batch {', '.join(k.batch) or '-'}, values {', '.join(k.values)}{causal}",
               f"   {src.cost}", ""])


def _rewrites(program, op) -> list[str]:
    """The index tables before and after reduce and defract, when the statement needed them."""
    from ..plan.defract import describe_steps, rewrite

    original = program.producer(op.output)
    if original.no_defract:
        return ["no_defract: the reduce and defract rewrites are off", ""]
    steps = rewrite(original, program.tensors, source=program.source)
    if not steps:
        from ..plan.reduce import needs_reduce, writes_apart

        if needs_reduce(original) and writes_apart(original, program.tensors):
            return ["Rewrites before flattening: none; each index point writes an output "
                    "element of its own as written (mixed-radix output sums), so the flat "
                    "strides address the output directly", ""]
        return []
    return ["Rewrites before flattening:", describe_steps(original, steps, program.tensors), ""]


def _points(s) -> list:
    n = 1
    for k in s.flat.out_indices:
        n *= s.acc_counts()[k]
    return [0] * n


def cmd_explain(args: argparse.Namespace) -> int:
    from .options import parse_split_k, parse_tiles, shapes_from

    constants: tuple[str, ...] = ()
    if args.file.endswith((".onnx", ".py")):
        program = _graph_program(args)
        if program is None:
            print(f"{args.file}: no kernels (every output is empty or an input)")
            return 0
        src, shapes, dtype = program.source, dict(program.shapes), dict(program.dtypes)
        constants = tuple(program.bound)
    else:
        src = read_source(args.file)
        shapes, dtype = shapes_from(args, src), args.dtype
    text = explain(src, shapes, dtype, args.hw, args.device, parse_tiles(args.tile), args.top,
                   args.cost_log, args.model, parse_split_k(args.split_k), constants)
    print(text, end="")
    return 0


def _graph_program(args: argparse.Namespace):
    """The graph's program lowered for the device or hardware model explained (None: it has
    no kernels)."""
    from ..graph.builder import wants_channels_last
    from ..lang.source import parse_shape
    from .graph import lowered

    shapes = dict(parse_shape(s) for s in (args.shape or []))
    hw = None if args.hw in (None, "", "auto") else args.hw
    return lowered(args.file, shapes, wants_channels_last(None, args.device, hw))


def register(sub, common) -> None:
    sp = sub.add_parser("explain", help="show the flat table, the tile search and the layout "
                        "(of a .tile program, or of an .onnx model's or .py graph's kernels)")
    common(sp)
    sp.add_argument("--hw", default="auto", help="hardware model name or .toml, or 'auto'")
    sp.add_argument("--device", help="device for --hw auto")
    sp.add_argument("--tile", action="append", metavar="[OUT:]IDX=N,...",
                    help="score exactly this tile instead of searching")
    sp.add_argument("--top", type=int, default=5, help="cost-log entries to show")
    sp.add_argument("--cost-log", help="write the cost log (text, or JSON lines for .jsonl)")
    add_split_k_option(sp)
    add_model_option(sp)
    sp.set_defaults(fn=cmd_explain)


__all__ = ["explain", "register"]
