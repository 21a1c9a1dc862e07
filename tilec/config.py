"""Settings that travel explicitly through the pipeline; no stage reads the environment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Config:
    device: str | None = None  # substring of "platform: device"; None = GPU if any, else PoCL
    hw: str | None = None  # hardware model name or .toml path; None = derived from the device
    top_k: int = 8
    # Forced choices, for tests and `--tile`: kernel name or output tensor -> {index: size}.
    tiles: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    vector_width: int | None = None  # None = the hardware model's; 1 disables vectors
    staging: str | None = None  # None = the hardware model's; "local" or "global"
    threads: int | None = None  # None = the hardware model's
    build_options: tuple[str, ...] = ("-cl-mad-enable",)
    cache_dir: Path | None = None  # on-disk program cache; None = the user cache directory
    use_disk_cache: bool = True
    use_tuning_records: bool = True
    rtol: float = 1e-3
    atol: float = 1e-4
