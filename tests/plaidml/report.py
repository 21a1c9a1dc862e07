"""Per-case status of the PlaidML corpus against tilec.

    python -m tests.plaidml.report [--no-compile] [-k SUBSTRING] [--verbose]

Prints, for each case, evaluate / compile pass or FAIL with the first line of the error, then
the counts (programs, instantiations, passed) and the failures grouped by kind of error.
"""

from __future__ import annotations

import argparse
import re
import sys
import traceback
import zlib
from pathlib import Path

import numpy as np


def case_rng(case) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(case.name.encode()))


def run_evaluate(case, arrays):
    import tilec

    return tilec.evaluate(case.program, **arrays)


def make_compiled_runner(case, arrays):
    """Compile once; the runner runs with poisoned outputs where the executable supports it.
    PlaidML binds integer parameters (a reshape's symbolic size, conv_transpose's output sizes)
    as constants of the program: the 0-d integer inputs' values are given when compiling."""
    import tilec

    values = {k: int(a) for k, a in arrays.items()
              if np.ndim(a) == 0 and np.asarray(a).dtype.kind in "iu"}
    exe = tilec.compile(case.program, case.shapes, dtype=case.dtypes, values=values)

    def run(arrays):
        if hasattr(exe, "run"):
            return exe.run(arrays, poison=True)
        return exe(**arrays)

    return run


def check_evaluate(case):
    from .case import check_case, make_inputs

    arrays = make_inputs(case, case_rng(case))
    check_case(case, lambda a: run_evaluate(case, a), arrays)


def check_compiled(case):
    from .case import check_case, make_inputs

    arrays = make_inputs(case, case_rng(case))
    if case.expect == "error":
        check_case(case, lambda a: make_compiled_runner(case, a)(a), arrays)
        return
    run = make_compiled_runner(case, arrays)
    check_case(case, run, arrays)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    line = text.splitlines()[0]
    return f"{type(exc).__name__}: {line}"


def error_kind(line: str) -> str:
    """A coarse key for grouping: location, quoted names and numbers stripped."""
    line = re.sub(r"<string>:\d+:\d+:\s*", "", line)
    keep = re.match(r".*unknown function ('[^']*')", line)  # which builtin is missing matters
    line = re.sub(r"'[^']*'", "'…'", line)
    if keep:
        line = line.replace("'…'", keep.group(1), 1)
    line = re.sub(r"\(expected one of [^)]*\)", "", line)
    line = re.sub(r"\d+", "N", line)
    line = re.sub(r"\[[^\]]*\]", "[…]", line)
    return line.strip()[:150]


_CALL = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_HEADER = re.compile(r"function\s*\(([^)]*)\)")


def features(program: str) -> set[str]:
    """The Tile constructs a program uses that matter for support: builtins called, inputs
    declared without a dim list, size statements, default/no_defract, several outputs."""
    out = {f"call {name}" for name in _CALL.findall(program) if name != "function"}
    header = _HEADER.search(program).group(1)
    for inp in re.sub(r"\[[^\]]*\]", "[]", header).split(","):
        if inp.strip() and "[" not in inp:
            out.add("input without a dim list")
    body = program.split("{", 1)[1]
    if re.search(r"\bdefault\b", body):
        out.add("default")
    if "no_defract" in body:
        out.add("no_defract")
    outs = program.split("->", 1)[1].split(")", 1)[0]
    if "," in outs:
        out.add("several outputs")
    return out


def print_features(results) -> None:
    use: dict[str, list] = {}
    for case, ev, co in results:
        for feat in features(case.program):
            use.setdefault(feat, []).append(ev is None and co is None)
    print("\nconstructs used (cases using it: passing / total):")
    for feat, oks in sorted(use.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        print(f"  {feat:<34} {sum(oks):>3} / {len(oks)}")


def _attempt(fn, case):
    try:
        fn(case)
        return None
    except Exception as exc:  # noqa: BLE001 - the report records every failure
        return exc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled runs")
    ap.add_argument("-k", default="", help="only cases whose name contains this")
    ap.add_argument("--verbose", action="store_true", help="print tracebacks of non-TileErrors")
    ap.add_argument("--write-known", action="store_true",
                    help="rewrite known_failures.txt from this run (the suite's strict xfails)")
    args = ap.parse_args(argv)

    from .corpus import CASES, programs

    cases = [c for c in CASES if args.k in c.name]
    results = []
    width = max(len(c.name) for c in cases)
    for case in cases:
        ev = _attempt(check_evaluate, case)
        co = None if args.no_compile else _attempt(check_compiled, case)
        results.append((case, ev, co))
        cols = ["ok  " if ev is None else "FAIL"]
        if not args.no_compile:
            cols.append("ok  " if co is None else "FAIL")
        msg = ""
        if ev is not None:
            msg = "evaluate: " + first_line(ev)
        elif co is not None:
            msg = "compile: " + first_line(co)
        print(f"{case.name:<{width}}  eval {cols[0]}" + (f"  compiled {cols[1]}" if len(cols) > 1
                                                           else "") + (f"  {msg}" if msg else ""))
        if args.verbose:
            for exc in (ev, co):
                if exc is not None and type(exc).__name__ != "TileError" \
                        and not type(exc).__name__.startswith("Tile"):
                    traceback.print_exception(type(exc), exc, exc.__traceback__)
        sys.stdout.flush()

    if args.write_known:
        write_known(results)

    n_prog = len(programs(cases))
    n_ev = sum(ev is None for _, ev, _ in results)
    print()
    print(f"programs (distinct PlaidML generators): {n_prog}")
    print(f"instantiations: {len(results)}")
    print(f"passed evaluate: {n_ev}/{len(results)}")
    if not args.no_compile:
        n_co = sum(co is None for _, _, co in results)
        both = sum(ev is None and co is None for _, ev, co in results)
        print(f"passed compiled: {n_co}/{len(results)}  (both: {both})")
    progs_ok = sum(all(ev is None and (args.no_compile or co is None)
                       for c, ev, co in results if c.origin == origin)
                   for origin in programs(cases))
    print(f"programs with every instantiation passing: {progs_ok}/{n_prog}")

    print_features(results)

    for label, idx in (("evaluate", 1), ("compiled", 2)):
        if label == "compiled" and args.no_compile:
            continue
        groups: dict[str, list[str]] = {}
        for res in results:
            exc = res[idx]
            if exc is not None:
                groups.setdefault(error_kind(first_line(exc)), []).append(res[0].name)
        if not groups:
            continue
        print(f"\n{label} failures by kind:")
        for kind, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            print(f"  [{len(names)}] {kind}")
            print(f"      {', '.join(names)}")
    return 0




KNOWN = Path(__file__).with_name("known_failures.txt")


def read_known() -> dict[tuple[str, str], str]:
    """(case name, "evaluate" or "compiled") -> why it fails today."""
    out = {}
    if KNOWN.exists():
        for line in KNOWN.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                name, stage, why = line.split("\t", 2)
                out[(name, stage)] = why
    return out


def write_known(results) -> None:
    lines = ["# PlaidML corpus cases that fail today, one per line: case, stage, first error line.",
             "# The tests mark these as strict xfails: a case that starts passing fails until it",
             "# is taken off this list (python -m tests.plaidml.report --write-known)."]
    for case, ev, co in results:
        for stage, exc in (("evaluate", ev), ("compiled", co)):
            if exc is not None:
                lines.append(f"{case.name}\t{stage}\t{first_line(exc)}")
    KNOWN.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
