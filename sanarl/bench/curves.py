"""Held-out curves of `sanarl bench shapes`: accuracy and off-target statistics against training time.

With `--curve-minutes M` every method run also checkpoints each M wall minutes of its loop
(`train.ckpt.save_every_minutes`, all checkpoints kept); after training, each intermediate checkpoint is evaluated
like the final one (same held-out prompts, seeds and sampler), so a curve point is one model. Its x value is the
training time up to that step (the sum of the steps' `time_data + time_train` in metrics.jsonl: checkpoint
writes and evaluations are not counted, the same clock as the final record's `train_minutes`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sanarl.training.run_folder.checkpoint_store import list_checkpoints
from sanarl.training.tracking import read_metrics

CURVE_KEYS: tuple[tuple[str, str], ...] = (
    ("shapes/strict", "held-out strict"),
    ("shapes/exact", "held-out exact"),
    ("shapes/partial", "held-out partial"),
    ("shapes/extra", "objects beyond the prompt's count"),
    ("stats/background_fraction", "background fraction"),
    ("stats/num_specks", "specks per image"),
)
"""(summary score key, panel title) of each curve."""

CATEGORIES: tuple[str, ...] = ("colors", "two_object", "counting", "position", "color_attr", "single_object")


def curve_overrides(minutes: float) -> list[str]:
    """The `--set`s that make a run keep a checkpoint every `minutes` (none when minutes <= 0)."""
    if minutes <= 0:
        return []
    return [
        f"train.ckpt.save_every_minutes={minutes}",
        "train.ckpt.save_freq=1000000000",  # only the timed checkpoints (and the final one): one curve point each
        "train.ckpt.max_keep=0",
        "train.ckpt.enable_checkpoint=true",
    ]


def minutes_at_steps(metrics_file: Path) -> dict[int, float]:
    """Optimizer step -> training minutes up to and including it (cumulative `time_data + time_train`)."""
    clock, out = 0.0, {}
    for record in read_metrics(metrics_file):
        if "time_train" in record:
            clock += (record.get("time_data") or 0.0) + record["time_train"]
            out[int(record["step"])] = clock / 60
    return out


def point(step: int, minutes: float, summary: dict[str, Any]) -> dict[str, Any]:
    """One curve point: the step, its training minutes and the model's evaluation summary."""
    return {"step": step, "train_minutes": minutes, "summary": summary}


def evaluate_intermediate(
    run_dir: Path, final_step: int, evaluate: Callable[[Path], dict[str, Any]]
) -> list[dict[str, Any]]:
    """Curve points of every checkpoint before `final_step` (the final one is the run's own record), oldest first.
    `evaluate(checkpoint_dir)` returns the evaluation summary of that checkpoint."""
    minutes = minutes_at_steps(run_dir / "metrics.jsonl")
    points = []
    for ckpt in list_checkpoints(run_dir / "checkpoints"):
        step = int(ckpt.name.rsplit("_", 1)[1])
        if 0 < step < final_step:
            points.append(point(step, minutes.get(step, math.nan), evaluate(ckpt)))
    return points


def score(summary: dict[str, Any], key: str) -> float:
    """The mean of one summary score key (NaN when absent)."""
    entry = summary["scores"].get(key)
    return float(entry["mean"]) if entry is not None else math.nan


def category(summary: dict[str, Any], tag: str, part: str = "strict") -> float:
    """Held-out accuracy of one GenEval category (NaN when the evaluation had none of it)."""
    per_tag = summary.get("geneval", {}).get("shapes", {}).get("per_tag", {})
    return float(per_tag.get(tag, {}).get(part, math.nan))


def full_curve(record: dict[str, Any], base: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A run's points from the base (minute 0) through its intermediate checkpoints to its final model."""
    start = [point(0, 0.0, base["summary"])] if base is not None else []
    final = point(int(record["steps"]), float(record["train_minutes"]), record["summary"])
    return start + list(record.get("curve", [])) + [final]


def plot_curves(path: Path, records: list[dict[str, Any]]) -> Path:
    """curves.png: one panel per CURVE_KEYS entry, one line per run (first seed labelled), base at minute 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = next((r for r in records if r["method"] == "base"), None)
    fig, axes = plt.subplots(2, 3, figsize=(14, 7))
    colors: dict[str, str] = {}
    for r in records:
        if r["method"] == "base":
            continue
        color = colors.setdefault(r["method"], f"C{len(colors)}")
        pts = full_curve(r, base)
        xs = [p["train_minutes"] for p in pts]
        for ax, (key, _) in zip(axes.flat, CURVE_KEYS, strict=True):
            ax.plot(xs, [score(p["summary"], key) for p in pts], color=color, marker=".",
                    label=r["method"] if r["seed"] == 0 else None)  # fmt: skip
    for ax, (_, title) in zip(axes.flat, CURVE_KEYS, strict=True):
        ax.set(title=title, xlabel="training minutes")
        ax.grid(alpha=0.3)
    if axes.flat[0].get_legend_handles_labels()[0]:
        axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def curves_markdown(records: list[dict[str, Any]]) -> str:
    """A table row per curve point: minutes, step, strict / exact / partial (± se), per-category strict, clutter."""
    base = next((r for r in records if r["method"] == "base"), None)
    cols = ["method", "seed", "step", "train min", "strict ± se", "exact ± se", "partial",
            *CATEGORIES, "objects / image", "objects - prompt's", "background", "specks"]  # fmt: skip
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in records:
        if r["method"] == "base" or not r.get("curve"):
            continue
        for p in full_curve(r, base):
            s = p["summary"]
            se = {k: s["scores"].get(f"shapes/{k}", {}).get("stderr", math.nan) for k in ("strict", "exact")}
            cells = [r["method"], str(r["seed"]), str(p["step"]), f"{p['train_minutes']:.1f}",
                     f"{score(s, 'shapes/strict'):.3f} ± {se['strict']:.3f}",
                     f"{score(s, 'shapes/exact'):.3f} ± {se['exact']:.3f}", f"{score(s, 'shapes/partial'):.3f}",
                     *(f"{category(s, tag):.3f}" for tag in CATEGORIES), f"{score(s, 'stats/num_blobs'):.2f}",
                     f"{score(s, 'shapes/extra'):+.2f}", f"{score(s, 'stats/background_fraction'):.3f}",
                     f"{score(s, 'stats/num_specks'):.2f}"]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""
