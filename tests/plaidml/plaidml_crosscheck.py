"""Cross-check the corpus against PlaidML 0.7.0 itself (not part of the test suite).

Runs every case's Tile text through the real PlaidML library on its LLVM CPU device and checks
the result with the case's oracle, so that both the reproduced text and the oracle are
confirmed by the implementation the programs were written for.  Needs a separate environment:

    python3 -m venv /tmp/pmlvenv && /tmp/pmlvenv/bin/pip install plaidml==0.7.0
    /tmp/pmlvenv/bin/python -m tests.plaidml.plaidml_crosscheck [-k SUBSTRING]

(run from the repository root; tilec is not needed).  Prints one line per case, the dtype
PlaidML gives each output, and a tally.
"""

from __future__ import annotations

import argparse
import os
import sys
import zlib

import numpy as np

os.environ.setdefault("PLAIDML_EXPERIMENTAL", "1")
os.environ.setdefault("PLAIDML_DEVICE_IDS", "llvm_cpu.0")


def _runner():
    import plaidml

    plaidml.quiet()
    ctx = plaidml.Context()
    dev = plaidml.Device(ctx, plaidml.devices(ctx, limit=10)[0])
    to_pml = {"float32": plaidml.DType.FLOAT32, "int32": plaidml.DType.INT32,
              "uint32": plaidml.DType.UINT32, "bool": plaidml.DType.BOOLEAN,
              "int16": plaidml.DType.INT16, "uint8": plaidml.DType.UINT8,
              "int64": plaidml.DType.INT64, "float64": plaidml.DType.FLOAT64}

    from_pml = {v: k for k, v in to_pml.items()}

    def run(case, arrays):
        # As tile.compose does: the op's function goes into an Applier whose Python-scalar
        # inputs (a clip bound, One, a size) are constants (plaidml.Real / plaidml.Integer)
        # and whose tensor inputs are placeholders of the composed function.
        applier = plaidml.Applier(ctx, plaidml.Function(case.program))
        composer = plaidml.Composer()
        tensors, keep = {}, []
        for name, arr in arrays.items():
            arr = np.asarray(arr)  # (np.ascontiguousarray would make a 0-d array 1-d)
            if arr.ndim == 0:
                value = float(arr) if arr.dtype.kind == "f" else int(arr)
                var = plaidml.Real(value) if isinstance(value, float) else plaidml.Integer(value)
                keep.append(var)  # PlaidML needs the Var alive until the function is built
                applier.add_input(name, var)
                continue
            ph = plaidml.Placeholder(arr.ndim)
            applier.add_input(name, ph)
            composer.add_input(name, ph)
            t = plaidml.Tensor(dev, plaidml.Shape(ctx, to_pml[str(arr.dtype)], *arr.shape))
            with t.mmap_discard(ctx) as view:
                view.copy_from_ndarray(np.ascontiguousarray(arr))
                view.writeback()
            tensors[name] = t
        names = case.program.split("->", 1)[1].split(")", 1)[0].strip(" (")
        names = [n.strip() for n in names.split(",") if n.strip()]
        scalar_out = case.params.get("plaidml_scalar_output")
        for name in names:
            out = applier.add_output(name)
            if scalar_out:
                # a size-valued output cannot be a function's result on its own (PlaidML
                # aborts); route it through a second op, as the op library always does
                wrap = plaidml.Applier(ctx, plaidml.Function(
                    "function (S, Z[N]) -> (O) { O = Z * S; }"))
                wrap.add_input("S", out)
                zph = plaidml.Placeholder(1)
                wrap.add_input("Z", zph)
                composer.add_input("Z__", zph)
                z = plaidml.Tensor(dev, plaidml.Shape(ctx, plaidml.DType.FLOAT32, 1))
                with z.mmap_discard(ctx) as view:
                    view.copy_from_ndarray(np.ones(1, np.float32))
                    view.writeback()
                tensors["Z__"] = z
                out = wrap.add_output("O")
            composer.add_output(name, out)
        inv = plaidml.Invoker(ctx, composer.build())
        for name, t in tensors.items():
            inv.set_input(name, t)
        outs = {}
        for name in names:
            t = plaidml.Tensor(dev, inv.get_output_shape(name))
            inv.set_output(name, t)
            outs[name] = t
        inv.invoke()
        got = {}
        for k, t in outs.items():
            arr = np.empty(tuple(d.size for d in t.shape.dimensions), from_pml[t.shape.dtype])
            with t.mmap_current() as view:
                view.copy_to_ndarray(arr)
            got[k] = arr.reshape(()) if scalar_out else arr
        return got

    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", default="")
    args = ap.parse_args(argv)
    from .case import compare, make_inputs
    from .corpus import CASES

    run = _runner()
    ok = n_known = 0
    cases = [c for c in CASES if args.k in c.name]
    for case in cases:
        arrays = make_inputs(case, np.random.default_rng(zlib.crc32(case.name.encode())))
        dtypes = ""
        if case.params.get("plaidml_skip"):
            print(f"{case.name:<45} skipped: {case.params['plaidml_skip']}")
            continue
        known = case.params.get("plaidml_fails")
        try:
            if case.expect == "error":
                try:
                    run(case, arrays)
                except Exception as exc:  # noqa: BLE001
                    status = f"ok (PlaidML rejects it: {str(exc).splitlines()[0][:90]})"
                else:
                    raise AssertionError("PlaidML accepted a program the case says it rejects")
            elif case.expect == "properties":
                case.oracle(lambda a, case=case: run(case, a), **arrays)
                status = "ok"
            else:
                got = run(case, arrays)
                dtypes = " ".join(f"{k}:{np.asarray(v).dtype}" for k, v in got.items())
                compare(case, got, case.oracle(**arrays))
                status = "ok"
            ok += 1
        except Exception as exc:  # noqa: BLE001
            text = (str(exc).strip() or type(exc).__name__).splitlines()
            status = "FAIL " + " | ".join(t.strip() for t in text[:4])[:300]
            if known:
                status = f"known PlaidML failure ({known}): {text[0][:120]}"
                n_known += 1
        print(f"{case.name:<45} {status}  [{dtypes}]")
        sys.stdout.flush()
    print(f"\nPlaidML 0.7.0 agrees with the oracle on {ok}/{len(cases)} cases; "
          f"{n_known} fail in PlaidML itself as their notes say; "
          f"{sum(bool(c.params.get('plaidml_skip')) for c in cases)} not run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
