"""sanarl's own cache directory (tiny pipelines and tiny reward models are built into it once)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Root of sanarl's own cache (`$SANARL_CACHE`, default `~/.cache/sanarl`)."""
    return Path(os.environ.get("SANARL_CACHE", Path.home() / ".cache" / "sanarl"))
