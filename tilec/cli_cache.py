"""`tilec cache info` and `tilec cache clear`: the on-disk program cache."""

from __future__ import annotations

import argparse
import time

from .cache import ProgramCache
from .config import Config


def _cache() -> ProgramCache:
    from .cli import cache_settings

    return ProgramCache.for_config(Config(**cache_settings()))


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def cmd_info(args: argparse.Namespace) -> int:
    cache = _cache()
    entries = sorted(cache.entries(with_fields=args.list), key=lambda e: -e.last_used)
    total = sum(e.size for e in entries)
    print(f"directory: {cache.directory}")
    print(f"entries:   {len(entries)}")
    print(f"size:      {_size(total)} ({total} bytes)")
    print(f"cap:       {_size(cache.max_bytes)} ({cache.max_bytes} bytes; least recently used "
          "entries are removed past it)")
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
    return 0


def register(sub, common) -> None:
    sp = sub.add_parser("cache", help="the on-disk program cache (directory: TILEC_CACHE_DIR, "
                        "default the user cache directory)")
    csub = sp.add_subparsers(dest="cache_command", required=True)
    info = csub.add_parser("info", help="the directory, number of entries, size and cap")
    info.add_argument("--list", action="store_true", help="also list every entry")
    info.set_defaults(fn=cmd_info)
    clear = csub.add_parser("clear", help="remove every cached program binary")
    clear.set_defaults(fn=cmd_clear)
