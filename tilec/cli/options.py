"""Option helpers shared by the commands: shapes, input files, the config a command line asks
for, and the device options every compiling command takes."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..config import Config
from ..errors import Source, TileError
from ..lang.source import default_shapes, parse_shape


def cache_settings() -> dict[str, Path]:
    """Config fields from the environment.  The one place tilec reads TILEC_CACHE_DIR: library
    stages get it through `Config.cache_dir`."""
    root = os.environ.get("TILEC_CACHE_DIR")
    return {"cache_dir": Path(root).expanduser()} if root else {}


def shapes_from(args: argparse.Namespace, source: Source) -> dict[str, tuple[int, ...]]:
    """--shape for the inputs it names, the file's `// shapes:` comment for the others (a
    batch changed on the command line keeps the filter's shape from the comment)."""
    given = dict(parse_shape(s) for s in (args.shape or []))
    return {**default_shapes(source), **given}


def values_from(args: argparse.Namespace) -> dict[str, int]:
    """`--value D=4`: a 0-d integer input the program uses as a size, fixed when compiling."""
    out = {}
    for spec in getattr(args, "value", None) or []:
        name, sep, val = spec.partition("=")
        try:
            out[name.strip()] = int(val)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise TileError(f"--value: expected NAME=INTEGER, got {spec!r}")
    return out


def dtypes_from(args: argparse.Namespace, source: Source,
                values: dict[str, int]) -> str | dict[str, str]:
    """--dtype for every input, but int32 for those fixed with --value."""
    if not values:
        return args.dtype
    from ..lang.api import parse

    return {i.name: "int32" if i.name in values else args.dtype for i in parse(source).inputs}


def with_values(arrays: dict[str, np.ndarray], values: dict[str, int]) -> dict[str, np.ndarray]:
    """Inputs fixed with --value take that value (unless given as arrays)."""
    return {**{k: np.int32(v) for k, v in values.items()}, **arrays}


def load_inputs(specs: Sequence[str]) -> dict[str, np.ndarray]:
    out = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name:
            raise TileError(f"--input: expected NAME=FILE.npy, got {spec!r}")
        try:
            out[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise TileError(f"--input {name}: cannot load {path!r} as a .npy array ({e})") \
                from None
    return out


def parse_tiles(specs: list[str] | None) -> dict[str, dict[str, int]]:
    """`--tile ci=8,co=32` (every contraction) or `--tile O:ci=8,co=32` (the one writing O)."""
    out: dict[str, dict[str, int]] = {}
    for spec in specs or []:
        target, sep, body = spec.rpartition(":")
        target = target if sep else "*"
        sizes = {}
        for item in body.split(","):
            name, eq, val = item.partition("=")
            if not eq or not val.strip().isdigit() or int(val) <= 0:
                raise TileError(f"--tile: expected INDEX=SIZE[,INDEX=SIZE...], got {item!r}")
            sizes[name.strip()] = int(val)
        out[target] = sizes
    return out


def make_config(args: argparse.Namespace) -> Config:
    tiles = parse_tiles(getattr(args, "tile", None))
    records = getattr(args, "records", None)
    return Config(device=getattr(args, "device", None), hw=getattr(args, "hw", None),
                  tiles=tiles, **cache_settings(),
                  records_path=Path(records) if records else None,
                  use_tuning_records=not getattr(args, "no_records", False),
                  cost_model=getattr(args, "model", None) or "time",
                  pack_panels=not getattr(args, "no_pack", False),
                  halos=getattr(args, "halos", None),
                  chains=not getattr(args, "no_chains", False),
                  split_k=parse_split_k(getattr(args, "split_k", None)))


def parse_split_k(value: str | None) -> bool | int | None:
    """`--split-k`: "auto" (None), "off" (False) or a number of parts."""
    if value in (None, "auto"):
        return None
    if value == "off":
        return False
    if not value.isdigit() or int(value) < 2:
        raise TileError(f"--split-k: expected auto, off or a number of parts >= 2, got {value!r}")
    return int(value)


def add_device_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--device", help="substring of 'platform: device', '#N' after it for the "
                    "N-th match (default: a GPU if there is one, else the CPU)")
    sp.add_argument("--hw", help="hardware model: a shipped name, a .toml path, or 'auto' "
                    "(derived from the device; the default)")
    sp.add_argument("--tile", action="append", metavar="[OUT:]IDX=N,...",
                    help="force a tile instead of searching")
    sp.add_argument("--records", metavar="FILE.jsonl", help="tuning records to use (default: "
                    "tuning.jsonl in the cache directory)")
    sp.add_argument("--no-records", action="store_true",
                    help="ignore tuning records: use the cost model's choices")
    sp.add_argument("--no-pack", action="store_true",
                    help="CPU matrix products read their operands as written (by default the "
                    "operand each work-item reads a panel of is copied into contiguous "
                    "panels first)")
    sp.add_argument("--halos", action="store_true", default=None,
                    help="computed tensors that a convolution reads with zero padding are "
                    "written inside a buffer with a zero border, and read there without "
                    "bounds tests (smaller kernels, faster to build; the default on CPUs)")
    sp.add_argument("--no-halos", dest="halos", action="store_false",
                    help="padded reads of computed tensors test their bounds (the default "
                    "on GPUs)")
    sp.add_argument("--no-chains", action="store_true",
                    help="one launch a kernel (by default runs of small kernels, such as an "
                    "unrolled recurrent layer's steps, run as one kernel of one work-group)")
    add_split_k_option(sp)
    add_model_option(sp)


def add_split_k_option(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--split-k", metavar="auto|off|N",
                    help="sums with few outputs and a long reduction as partial sums and their "
                    "sum: where the time model predicts it faster on a GPU (auto, the "
                    "default), never (off), or in N parts wherever possible")


def add_model_option(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--model", choices=("time", "plaidml"), default="time",
                    help="rank tiles by predicted time (GPU models; the default) or by "
                    "PlaidML's score (seed 001's cost log)")


def add_quiet_option(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--quiet", action="store_true",
                    help="no progress bar (one shows on a terminal when compiling or tuning "
                    "takes more than a couple of seconds)")


def progress_for(args: argparse.Namespace, total: int, desc: str):
    """The command's progress bar (`runtime.progress`): quiet with --quiet or off a terminal."""
    from ..runtime.progress import Progress

    return Progress(total, desc, quiet=getattr(args, "quiet", False))
