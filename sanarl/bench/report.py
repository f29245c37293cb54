"""The bench's outputs: results.json, results.md (markdown tables; the best and end point of each curve and its
flags: stability.py), accuracy_vs_time.png, curves.png (curves.py) and grids/<method>.png.

Held-out accuracy of one run = the mean over its eval samples of the `shapes` judge's strict (partial) score; the
shapes test items are tag-balanced by construction, so this matches GenEval's mean over tags up to sampling noise
(both are in results.json). Per method, over seeds: mean, std (ddof = 1, the seed spread), and the standard error
of that mean from the eval sample size, sqrt(sum_k se_k^2) / S.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console

from sanarl.bench.curves import curves_markdown, plot_curves
from sanarl.bench.methods import RATIOS
from sanarl.bench.plan import EVAL_SEED
from sanarl.bench.stability import STABILITY_KEY, stability_markdown, stability_rows
from sanarl.core.images import save_grid
from sanarl.rewards.summary import describe, paired_delta
from sanarl.training.tracking import read_metrics

STAT_KEYS: tuple[str, ...] = ("background_fraction", "num_blobs", "num_specks", "entropy")


ACCURACY_PARTS: tuple[str, ...] = ("strict", "partial", "exact")
"""Held-out accuracies per method: GenEval's strict and partial, and the exact variant (extra objects fail)."""

PAIRED_KEYS: tuple[str, ...] = tuple(f"shapes/{part}" for part in ACCURACY_PARTS)
"""Per-sample scores a record keeps, for gains over the base on paired samples (same prompts and seeds)."""


def paired_gain(group: list[dict[str, Any]], base: dict[str, Any], key: str) -> dict[str, float]:
    """A method's gain over the base on paired samples: per sample, the mean over the method's seeds minus the
    base's score; `{delta, stderr, n}` (NaN when a record has no per-sample scores, e.g. an older bench)."""
    runs = [r.get("per_sample", {}).get(key) for r in group]
    ref = base.get("per_sample", {}).get(key)
    if ref is None or any(v is None or len(v) != len(ref) for v in runs):
        return {"delta": math.nan, "stderr": math.nan, "n": 0}
    mean = [math.fsum(v[i] for v in runs) / len(runs) for i in range(len(ref))]
    return paired_delta(ref, mean)


def load_preview(run_dir: Path):
    """The preview images `[k, 3, H, W]` a finished run saved, or None."""
    import torch

    path = run_dir / "preview.pt"
    return torch.load(path, weights_only=True) if path.is_file() else None


def _score(record: dict[str, Any], key: str, field: str = "mean") -> float:
    """A summary score of a record; NaN when the record lacks it (a bench from before the key existed)."""
    entry = record["summary"]["scores"].get(key)
    return float(entry[field]) if entry is not None else math.nan


def aggregate(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per method (in first-seen order; `base` first): accuracy over seeds, costs, off-target statistics."""
    methods = list(dict.fromkeys(r["method"] for r in records))
    rows = []
    for method in methods:
        group = [r for r in records if r["method"] == method]
        row: dict[str, Any] = {"method": method, "seeds": len(group)}
        for part in ACCURACY_PARTS:
            stats = describe([_score(r, f"shapes/{part}") for r in group])
            row[part] = stats["mean"]
            row[f"{part}_std"] = stats["std"]
            row[f"{part}_se"] = math.sqrt(
                sum(_score(r, f"shapes/{part}", "stderr") ** 2 for r in group)
            ) / len(group)
        for key in ("steps", "train_minutes", "rollout_images", "reward_calls"):
            row[key] = sum(float(r.get(key) or 0.0) for r in group) / len(group)
        for key in STAT_KEYS:
            row[key] = sum(_score(r, f"stats/{key}") for r in group) / len(group)
        row["extra_objects"] = sum(_score(r, "shapes/extra") for r in group) / len(group)
        row["geneval_strict"] = describe(
            [r["summary"]["geneval"]["shapes"]["overall"]["strict"] for r in group]
        )["mean"]
        rows.append(row)
    base = next((r for r in rows if r["method"] == "base"), None)
    for row in rows:
        if base is not None and row is not base:
            row["gain"] = row["strict"] - base["strict"]
            row["gain_in_std"] = row["gain"] / row["strict_std"] if row["strict_std"] > 0 else math.nan
            group = [r for r in records if r["method"] == row["method"]]
            base_record = next(r for r in records if r["method"] == "base")
            for part in ("strict", "exact"):
                se = math.hypot(row[f"{part}_se"], base[f"{part}_se"])
                row[f"{part}_gain"] = row[part] - base[part]
                row[f"{part}_gain_se"] = se
                row[f"{part}_gain_in_se"] = row[f"{part}_gain"] / se if se > 0 else math.nan
                paired = paired_gain(group, base_record, f"shapes/{part}")["stderr"]
                row[f"{part}_gain_paired_se"] = paired
                row[f"{part}_gain_in_paired_se"] = row[f"{part}_gain"] / paired if paired > 0 else math.nan
    return rows


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Held-out strict accuracy ratios of methods.RATIOS pairs that both ran."""

    by = {r["method"]: r for r in rows}
    out = []
    for a, b, what in RATIOS:
        if a in by and b in by:
            ratio = by[a]["strict"] / by[b]["strict"] if by[b]["strict"] > 0 else math.nan
            out.append({"what": what, "numerator": a, "denominator": b, "strict_ratio": ratio})
    return out


def markdown(rows: list[dict[str, Any]], ratio_rows: list[dict[str, Any]], header: str) -> str:
    """results.md: the table, the ratios and the gains over the base in units of the seed spread."""
    cols = ["method", "seeds", "held-out strict (mean ± std)", "± se", "held-out exact (mean ± std)", "± se",
            "held-out partial (mean ± std)", "± se", "steps", "train min", "rollout images", "reward calls",
            "background", "blobs", "objects - prompt's", "specks", "entropy"]  # fmt: skip
    lines = [header, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [r["method"], str(r["seeds"]), f"{r['strict']:.4f} ± {r['strict_std']:.4f}", f"{r['strict_se']:.4f}",
                 f"{r['exact']:.4f} ± {r['exact_std']:.4f}", f"{r['exact_se']:.4f}",
                 f"{r['partial']:.4f} ± {r['partial_std']:.4f}", f"{r['partial_se']:.4f}", f"{r['steps']:.0f}",
                 f"{r['train_minutes']:.2f}", f"{r['rollout_images']:.0f}", f"{r['reward_calls']:.0f}",
                 f"{r['background_fraction']:.3f}", f"{r['num_blobs']:.2f}", f"{r['extra_objects']:+.2f}",
                 f"{r['num_specks']:.2f}", f"{r['entropy']:.2f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for r in rows:
        if "gain" in r:
            lines.append(
                f"- {r['method']}: strict gain over base {r['strict_gain']:+.4f} ± {r['strict_gain_se']:.4f} "
                f"({r['strict_gain_in_se']:.1f} eval se; paired se {r['strict_gain_paired_se']:.4f}: "
                f"{r['strict_gain_in_paired_se']:.1f}; {r['gain_in_std']:.2f} seed std), exact "
                f"{r['exact_gain']:+.4f} ± {r['exact_gain_se']:.4f} ({r['exact_gain_in_se']:.1f} eval se; paired se "
                f"{r['exact_gain_paired_se']:.4f}: {r['exact_gain_in_paired_se']:.1f})"
            )
    for q in ratio_rows:
        lines.append(f"- {q['what']}: strict {q['numerator']} / {q['denominator']} = {q['strict_ratio']:.3f}")
    return "\n".join(lines) + "\n"


def plot_accuracy_vs_time(path: Path, output: Path, records: list[dict[str, Any]]) -> Path:
    """Left: training reward (`reward/mean`) vs training minutes per run; right: held-out strict vs minutes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    colors: dict[str, Any] = {}
    for r in records:
        color = colors.setdefault(r["method"], f"C{len(colors)}")
        metrics_file = output / r["method"] / f"seed{r['seed']}" / "metrics.jsonl"
        if r["method"] != "base" and metrics_file.is_file():
            minutes, reward, clock = [], [], 0.0
            for m in read_metrics(metrics_file):
                clock += (m.get("time_data") or 0.0) + (m.get("time_train") or 0.0)
                if m.get("reward/mean") is not None:
                    minutes.append(clock / 60)
                    reward.append(m["reward/mean"])
            if reward:
                left.plot(
                    minutes,
                    reward,
                    color=color,
                    lw=1,
                    marker=".",
                    alpha=0.8,
                    label=r["method"] if r["seed"] == 0 else None,
                )
        right.scatter([r["train_minutes"]], [_score(r, "shapes/strict")], color=color,
                      label=r["method"] if r["seed"] in (0, None) else None)  # fmt: skip
    left.set(title="training reward (rollouts)", xlabel="training minutes", ylabel="reward/mean")
    right.set(title="held-out strict accuracy", xlabel="training minutes", ylabel="strict")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_grids(
    output: Path, records: list[dict[str, Any]], prompts: list[str], count: int = 8
) -> list[Path]:
    """grids/<method>.png: top row the base, bottom row the method (its first seed), same prompts and seeds."""
    import torch

    base = load_preview(output / "base")
    written = []
    for method in dict.fromkeys(r["method"] for r in records if r["method"] != "base"):
        seed = min(r["seed"] for r in records if r["method"] == method)
        mine = load_preview(output / method / f"seed{seed}")
        if base is None or mine is None:
            continue
        k = min(count, base.shape[0], mine.shape[0])
        captions = [f"base: {p}" for p in prompts[:k]] + [f"{method}: {p}" for p in prompts[:k]]
        path = save_grid(
            torch.cat([base[:k], mine[:k]]), captions, output / "grids" / f"{method}.png", columns=k
        )
        written.append(path)
    return written


def write_report(opts, records: list[dict[str, Any]], rows, console: Console) -> dict[str, Any]:
    """Write results.json, results.md, accuracy_vs_time.png, grids/; print the table; return results.json."""

    out = opts.output
    table = aggregate(records)
    ratio_rows = ratios(table)
    header = (f"# sanarl bench shapes\n\n{opts.budget_minutes:g} min per method and seed, {opts.seeds} seed(s), "
              f"{opts.eval_num} held-out samples (seed {EVAL_SEED}), CFG-free Euler "
              f"{opts.eval_steps} steps.")  # fmt: skip
    text = markdown(table, ratio_rows, header)
    curve_table = curves_markdown(records)
    if curve_table:
        text += "\n## Held-out curves (strict per category)\n\n" + curve_table
    stability = stability_rows(records, rows.metadata)
    if stability:
        text += f"\n## Best and end point of each curve ({STABILITY_KEY})\n\n" + stability_markdown(stability)
    (out / "results.md").write_text(text)
    results = {"methods": table, "ratios": ratio_rows, "runs": records, "stability": stability,
               "options": {k: str(v) for k, v in vars(opts).items()}}  # fmt: skip
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    plot_accuracy_vs_time(out / "accuracy_vs_time.png", out, records)
    plot_curves(out / "curves.png", records)
    write_grids(out, records, rows.prompts)
    console.print(text)
    return results
