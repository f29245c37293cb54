"""Run metrics: `metrics.jsonl` (one JSON object per optimizer step), console, and optional wandb / tensorboard.

Each metrics.jsonl line starts with the step, the wall-clock `time` it was written (ISO 8601, UTC) and `elapsed_s`,
the seconds of training so far (from the run's start; a resumed run goes on from its last kept line's value).

Only the main process writes. wandb and tensorboard are imported lazily; asking for one that is not installed
fails at start with the pip command to fix it.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sanarl.training.faults import pause_point
from sanarl.training.run_folder.run_files import append_line, saved_via_temp


class MetricsLogger:
    """Fan-out of scalar metrics to the configured sinks."""

    def __init__(
        self,
        run_dir: Path,
        loggers: list[str],
        *,
        project: str,
        experiment: str,
        config: dict[str, Any],
        enabled: bool = True,
        resume: bool = False,
        resume_step: int | None = None,
        notice: Callable[[str], None] = print,
    ) -> None:
        """`resume`: append to an existing metrics.jsonl, first dropping records after `resume_step` (steps a killed
        run logged after its last checkpoint, which the resumed run repeats) and unreadable lines (a kill mid-write;
        `notice` names them). The trimmed file replaces the old one atomically."""
        self.enabled = enabled
        self.path = run_dir / "metrics.jsonl"
        self._wandb = None
        self._tb = None
        self._began = time.monotonic()
        if not enabled:
            return
        if not resume and self.path.exists():
            self.path.unlink()
        if resume and resume_step is not None and self.path.exists():
            self._trim(resume_step, notice)
        if resume and self.path.exists():
            self._began -= _last_elapsed(read_metrics(self.path))
        if "wandb" in loggers:
            self._wandb = _start_wandb(project, experiment or run_dir.name, config, run_dir)
        if "tensorboard" in loggers:
            self._tb = _start_tensorboard(run_dir / "tensorboard")

    def _trim(self, resume_step: int, notice: Callable[[str], None]) -> None:
        bad: list[int] = []
        records = read_metrics(self.path, bad_lines=bad)
        if bad:
            notice(
                f"{self.path}: dropped unreadable line(s) {', '.join(map(str, bad[:20]))} (a write cut short?)"
            )
        kept = [r for r in records if _step_of(r) <= resume_step]
        for stale in self.path.parent.glob(f".{self.path.name}.*.tmp"):  # left by a kill mid-rewrite
            stale.unlink(missing_ok=True)
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with temp.open("w") as fh:
            fh.write("".join(json.dumps(r) + "\n" for r in kept))
            fh.flush()
            os.fsync(fh.fileno())
        pause_point("metrics_rewrite")
        os.replace(temp, self.path)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Append one step's metrics (non-finite values are written as null in the JSON)."""
        if not self.enabled:
            return
        clean = {k: (float(v) if math.isfinite(float(v)) else None) for k, v in metrics.items()}
        stamp = {
            "time": datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "elapsed_s": round(time.monotonic() - self._began, 3),
        }
        append_line(self.path, json.dumps({"step": step, **stamp, **clean}))  # never through a link
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in clean.items() if v is not None}, step=step)
        if self._tb is not None:
            for k, v in clean.items():
                if v is not None:
                    self._tb.add_scalar(k, v, step)

    def log_image(self, step: int, key: str, path: Path) -> None:
        """Send a saved image (sample grid) to wandb / tensorboard."""
        if not self.enabled:
            return
        if self._wandb is not None:
            import wandb

            self._wandb.log({key: wandb.Image(str(path))}, step=step)
        if self._tb is not None:
            import numpy as np
            from PIL import Image

            self._tb.add_image(key, np.asarray(Image.open(path).convert("RGB")), step, dataformats="HWC")

    def log_video(self, step: int, key: str, path: Path, fps: int = 8) -> None:
        """Send a saved mp4 (video sample grid) to wandb as a video; tensorboard gets its frames as a video too."""
        if not self.enabled:
            return
        if self._wandb is not None:
            import wandb

            self._wandb.log({key: wandb.Video(str(path), fps=fps, format="mp4")}, step=step)
        if self._tb is not None:
            import torch

            from sanarl.core.media import read_video

            frames = (
                torch.from_numpy(read_video(path)).permute(0, 3, 1, 2).unsqueeze(0)
            )  # [1, T, 3, H, W] uint8
            self._tb.add_video(key, frames, step, fps=fps)

    def log_media(self, step: int, key: str, path: Path) -> None:
        """`log_video` for an .mp4 file, `log_image` otherwise."""
        if Path(path).suffix.lower() == ".mp4":
            self.log_video(step, key, path)
        else:
            self.log_image(step, key, path)

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
        if self._tb is not None:
            self._tb.close()


def _start_wandb(project: str, name: str, config: dict[str, Any], run_dir: Path):
    try:
        import wandb
    except ImportError:
        raise ImportError(
            "`logging.logger` includes wandb but it is not installed: pip install wandb"
        ) from None
    return wandb.init(project=project, name=name, config=config, dir=str(run_dir))


def _start_tensorboard(log_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ImportError(
            "`logging.logger` includes tensorboard but it is not installed: pip install tensorboard"
        ) from None
    return SummaryWriter(str(log_dir))


def read_metrics(path: Path, bad_lines: list[int] | None = None) -> list[dict[str, Any]]:
    """All records (JSON objects) of a metrics.jsonl file; lines that are not one (cut short by a kill, garbage,
    not UTF-8) are skipped, their 1-based numbers appended to `bad_lines` when given."""
    records = []
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            record = None
        if isinstance(record, dict):
            records.append(record)
        elif bad_lines is not None:
            bad_lines.append(number)
    return records


def _last_elapsed(records: list[dict[str, Any]]) -> float:
    """The `elapsed_s` of the last record that has one (0 without)."""
    for record in reversed(records):
        value = record.get("elapsed_s")
        if isinstance(value, int | float) and math.isfinite(value):
            return float(value)
    return 0.0


def _step_of(record: dict[str, Any]) -> float:
    step = record.get("step", 0)
    return step if isinstance(step, int | float) else math.inf


PLOTTED_METRICS = ["reward/mean", "loss", "policy_loss", "grad_norm", "lr"]
"""A run's metrics.png panels (those the run logs)."""


def plot_run_metrics(run_dir: Path) -> Path | None:
    """`<run_dir>/metrics.png` from its metrics.jsonl so far (main process; at each checkpoint and at the end)."""
    return plot_metrics(run_dir / "metrics.jsonl", run_dir / "metrics.png", PLOTTED_METRICS)


def plot_metrics(metrics_path: Path, out_png: Path, keys: list[str]) -> Path | None:
    """Line plots of `keys` against step (one panel each); None when no key has data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path) if metrics_path.exists() else []
    present = [k for k in keys if any(r.get(k) is not None for r in records)]
    if not present:
        return None
    fig, axes = plt.subplots(1, len(present), figsize=(4.5 * len(present), 3.2), squeeze=False)
    for ax, key in zip(axes[0], present, strict=True):
        pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1.2)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    saved_via_temp(out_png, lambda temp: fig.savefig(temp, dpi=110, format=out_png.suffix[1:] or "png"))
    plt.close(fig)
    return out_png
