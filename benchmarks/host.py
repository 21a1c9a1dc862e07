"""The host CPU's name as benchmark tables record it (lscpu's "Model name")."""

from __future__ import annotations

import platform
import subprocess


def cpu_model() -> str:
    """lscpu's model name, else Python's `platform.processor()` (no lscpu: not Linux)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        out = ""
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor()
