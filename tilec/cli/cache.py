"""`tilec cache info` and `tilec cache clear`: the on-disk program cache."""

from __future__ import annotations

import argparse
import time

from ..config import Config
from ..runtime.cache import ProgramCache


def _cache() -> ProgramCache:
    from .options import cache_settings

    return ProgramCache.for_config(Config(**cache_settings()))


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


# Beside the program binaries: the tile search's choices, whole graph compiles
# (`runtime.compiled`), the notes of programs build workers left in PoCL's cache
# (`runtime.prebuild`), and (in the user cache directory) the parser's tables, compiled
# templates and the devices that passed the build probe.
_SMALL = ("search", "compiled", "prebuilt", "parser", "templates", "devices")


def _small_files(cache: ProgramCache) -> dict[str, list]:
    root = cache.directory.parent
    found = {}
    for name in _SMALL:
        try:
            found[name] = [p for p in (root / name).rglob("*") if p.is_file()]
        except OSError:
            found[name] = []
    return found


def cmd_info(args: argparse.Namespace) -> int:
    cache = _cache()
    entries = sorted(cache.entries(with_fields=args.list), key=lambda e: -e.last_used)
    total = sum(e.size for e in entries)
    print(f"directory: {cache.directory}")
    print(f"entries:   {len(entries)}")
    print(f"size:      {_size(total)} ({total} bytes)")
    print(f"cap:       {_size(cache.max_bytes)} ({cache.max_bytes} bytes; least recently used "
          "entries are removed past it)")
    for name, files in _small_files(cache).items():
        if files:
            size = sum(p.stat().st_size for p in files if p.exists())
            print(f"{name + ':':10} {len(files)} file{'s' if len(files) != 1 else ''}, "
                  f"{_size(size)}")
    if args.list:
        for e in entries:
            used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
            f = e.fields
            what = ("unreadable header" if f is None else
                    f"tilec {f.get('tilec')}, {f.get('device')} (driver {f.get('driver')})")
            print(f"  {e.path.stem[:16]}  {_size(e.size):>10}  {used}  {what}")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    cache = _cache()
    n = cache.clear()
    print(f"removed {n} entr{'y' if n == 1 else 'ies'} from {cache.directory}")
    for name, files in _small_files(cache).items():
        gone = 0
        for p in files:
            try:
                p.unlink()
                gone += 1
            except OSError:
                pass
        if gone:
            print(f"removed {gone} file{'s' if gone != 1 else ''} from "
                  f"{cache.directory.parent / name}")
    from ..plan.search import forget

    forget()  # this process's searches too (a caller of `main` goes on with it)
    return 0


def register(sub, common) -> None:
    sp = sub.add_parser("cache", help="the on-disk program cache (directory: TILEC_CACHE_DIR, "
                        "default the user cache directory)")
    csub = sp.add_subparsers(dest="cache_command", required=True)
    info = csub.add_parser("info", help="the directory, number of entries, size and cap")
    info.add_argument("--list", action="store_true", help="also list every entry")
    info.set_defaults(fn=cmd_info)
    clear = csub.add_parser("clear", help="remove every cached program binary and search result")
    clear.set_defaults(fn=cmd_clear)
