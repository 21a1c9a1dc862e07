"""A failed build's message: the driver's log (its errors first where it is long) and the
generated line it points at, so that a user sees which kernel text the compiler rejected."""

from __future__ import annotations

import re


def build_log(prg, device) -> str:
    """The driver's build log of `prg` for `device` ("" where it cannot be read)."""
    try:
        import pyopencl as cl

        return prg.get_build_info(device, cl.program_build_info.LOG) or ""
    except Exception:  # noqa: BLE001 - a log we cannot read is simply absent
        return ""


def explain_build(log: str, source: str) -> str:
    """The build log, and the generated line it complains about."""
    lines = source.splitlines()
    m = re.search(r":(\d+):(\d+):\s*error", log) or re.search(r"line (\d+)", log)
    where = ""
    if m:
        n = int(m.group(1))
        if 1 <= n <= len(lines):
            where = f"\ngenerated line {n}:\n    {lines[n - 1].strip()}"
    log = log.strip()
    # NVIDIA's log can open with a warning a kernel; the errors are what the user needs.
    errors = [ln for ln in log.splitlines() if re.search(r"error", ln, re.IGNORECASE)]
    if errors and len(log) > 4000:
        log = "\n".join(errors) + f"\n({len(log.splitlines()) - len(errors)} other lines " \
            "of the log left out)"
    if len(log) > 4000:
        log = log[:4000] + "\n..."
    return f"the OpenCL compiler rejected a generated kernel:\n{log}{where}"


__all__ = ["build_log", "explain_build"]
