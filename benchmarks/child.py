"""A child process whose last line of output is a JSON object: the tree-comparison scripts
run each measurement in one, so that the tree it imports (PYTHONPATH) and its caches stay
its own.  Nothing here imports tilec."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping


def last_json(cmd: list[str], what: str, *, env: Mapping[str, str] | None = None,
              cwd: str | None = None, timeout: float = 1800) -> dict:
    """Run `cmd` and return its last stdout line as JSON; where it printed none (it failed),
    stop the script with `what` and the end of its stderr."""
    p = subprocess.run(cmd, capture_output=True, text=True, env=None if env is None
                       else dict(env), cwd=cwd, timeout=timeout, check=False)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise SystemExit(f"{what} failed (exit {p.returncode}):\n{p.stderr[-3000:]}") from None
