"""Whether a bench curve held its gains: the best and the end point of each run's held-out curve, and its flags.

A run's curve is the base (minute 0), its intermediate checkpoints (`--curve-minutes`) and its final model
(curves.py, `full_curve`). The *best* point is the one with the highest held-out `STABILITY_KEY` mean (the earliest
on ties, the base included); the *end* point is the final model, the one a user of the run gets. Flags:
- `end below best`: the end is below the best by more than `SE_FLAG` standard errors of their difference,
  sqrt(se_best^2 + se_end^2) (each point's standard error over its held-out samples; unpaired, so on the same
  prompts and seeds it is on the safe side);
- `specks`: the end's specks per image exceed the base's by more than `SPECKS_MARGIN`;
- `background`: the end's background fraction is more than `BACKGROUND_MARGIN` from the base's, either way (fewer
  background pixels: clutter, texture or specks; more: objects lost);
- `colour`: for some palette colour, the end's held-out strict accuracy on the prompts that name it is below the
  base's by more than `SE_FLAG` paired standard errors (same prompts and seeds; a collapse of the colours to one).
"""

from __future__ import annotations

import math
from typing import Any

from sanarl.bench.curves import full_curve, score
from sanarl.rewards.summary import paired_delta

STABILITY_KEY = "shapes/exact"
"""The held-out score whose best and end points are compared (exact: strict that also fails extra objects)."""
SE_FLAG = 2.0
"""A drop from the best to the end of more than this many standard errors is flagged."""
SPECKS_MARGIN = 0.1
"""Specks per image the end may show above the base's."""
BACKGROUND_MARGIN = 0.01
"""How far the end's background fraction may be from the base's, either way."""
SPECKS, BACKGROUND = "stats/num_specks", "stats/background_fraction"
STRICT = "shapes/strict"
"""The per-sample score the colour check compares, paired with the base's."""


def stderr_of(summary: dict[str, Any], key: str) -> float:
    """The standard error of one summary score key (NaN when absent)."""
    entry = summary["scores"].get(key)
    return float(entry["stderr"]) if entry is not None else math.nan


def best_point(points: list[dict[str, Any]], key: str = STABILITY_KEY) -> dict[str, Any]:
    """The point with the highest finite mean of `key` (the earliest on ties); the first point when none is
    finite."""
    finite = [(i, score(p["summary"], key)) for i, p in enumerate(points)]
    finite = [(i, v) for i, v in finite if math.isfinite(v)]
    if not finite:
        return points[0]
    return points[min(finite, key=lambda iv: (-iv[1], iv[0]))[0]]


def curve_stability(
    points: list[dict[str, Any]], base: dict[str, Any] | None, key: str = STABILITY_KEY
) -> dict[str, Any]:
    """The best and end point of one curve (`full_curve`) and its flags (module doc); `base` is the base model's
    summary (None: no band flags)."""
    best, end = best_point(points, key), points[-1]
    drop = score(best["summary"], key) - score(end["summary"], key)
    drop_se = math.hypot(stderr_of(best["summary"], key), stderr_of(end["summary"], key))
    out: dict[str, Any] = {
        "key": key,
        "best_step": best["step"],
        "best_minutes": best["train_minutes"],
        "best": score(best["summary"], key),
        "best_se": stderr_of(best["summary"], key),
        "end_step": end["step"],
        "end_minutes": end["train_minutes"],
        "end": score(end["summary"], key),
        "end_se": stderr_of(end["summary"], key),
        "drop": drop,
        "drop_se": drop_se,
        "drop_in_se": drop / drop_se if drop_se > 0 else math.nan,
        "end_specks": score(end["summary"], SPECKS),
        "end_background": score(end["summary"], BACKGROUND),
        "base_specks": score(base, SPECKS) if base is not None else math.nan,
        "base_background": score(base, BACKGROUND) if base is not None else math.nan,
    }
    out["flags"] = stability_flags(out)
    return out


def stability_flags(s: dict[str, Any]) -> list[str]:
    """The flags of a `curve_stability` result, each a phrase naming the numbers behind it."""
    flags = []
    if s["best_step"] != s["end_step"] and s["drop"] > SE_FLAG * s["drop_se"]:
        flags.append(
            f"end below best: {s['key']} {s['end']:.3f} at step {s['end_step']} < {s['best']:.3f} at step "
            f"{s['best_step']} by {s['drop']:.3f} > {SE_FLAG:g} se ({s['drop_se']:.3f} each)"
        )
    if s["end_specks"] > s["base_specks"] + SPECKS_MARGIN:
        flags.append(
            f"specks: {s['end_specks']:.2f} per image > base {s['base_specks']:.2f} + {SPECKS_MARGIN:g}"
        )
    if abs(s["end_background"] - s["base_background"]) > BACKGROUND_MARGIN:
        flags.append(
            f"background: {s['end_background']:.3f} is {s['end_background'] - s['base_background']:+.3f} from "
            f"the base's {s['base_background']:.3f} (band ± {BACKGROUND_MARGIN:g})"
        )
    return flags


def colour_accuracy(
    end: list[float], base: list[float], metadata: list[dict[str, Any]], key: str = STRICT
) -> list[dict[str, Any]]:
    """Per palette colour named by the held-out prompts (`metadata[i]["include"][j]["color"]`): the samples whose
    prompt names it, the base's and the end's mean per-sample `key` on them, their paired difference and its
    standard error (sample std of the differences / sqrt(n)), in the order the colours first appear."""
    by_colour: dict[str, list[int]] = {}
    for i, meta in enumerate(metadata):
        for colour in dict.fromkeys(e["color"] for e in meta.get("include", []) if "color" in e):
            by_colour.setdefault(colour, []).append(i)
    out = []
    for colour, idx in by_colour.items():
        before, after = [base[i] for i in idx], [end[i] for i in idx]
        paired = paired_delta(before, after)
        out.append({"colour": colour, "n": len(idx), "base": sum(before) / len(idx), "end": sum(after) / len(idx),
                    "diff": paired["delta"], "se": paired["stderr"]})  # fmt: skip
    return out


def colour_flags(colours: list[dict[str, Any]], key: str = STRICT) -> list[str]:
    """A `colour` flag per colour whose end is below the base by more than SE_FLAG paired standard errors."""
    return [
        f"colour: {c['colour']} {key} {c['end']:.3f} < base {c['base']:.3f} by {-c['diff']:.3f} > {SE_FLAG:g} "
        f"paired se ({c['se']:.3f}, {c['n']} prompts)"
        for c in colours
        if c["se"] > 0 and -c["diff"] > SE_FLAG * c["se"]
    ]


def stability_rows(
    records: list[dict[str, Any]], metadata: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """One `curve_stability` per trained run (method, seed), in record order; with the held-out rows' `metadata`
    (and per-sample scores in the records) also each run's `colour_accuracy` and `colour` flags."""
    base = next((r for r in records if r["method"] == "base"), None)
    rows = []
    for r in records:
        if r["method"] == "base":
            continue
        found = curve_stability(full_curve(r, base), base["summary"] if base is not None else None)
        paired = (
            base is not None
            and metadata
            and STRICT in r.get("per_sample", {})
            and STRICT in base.get("per_sample", {})
        )
        if paired:
            found["colours"] = colour_accuracy(r["per_sample"][STRICT], base["per_sample"][STRICT], metadata)
            found["flags"] += colour_flags(found["colours"])
        rows.append({"method": r["method"], "seed": r["seed"], **found})
    return rows


def stability_markdown(rows: list[dict[str, Any]]) -> str:
    """The best and end point of each run's curve, and a line per flagged run ("" without runs)."""
    if not rows:
        return ""
    cols = ["method", "seed", f"best {STABILITY_KEY} ± se (step, min)", "end ± se (step, min)", "end - best",
            "specks at end (base)", "background at end (base)", "flags"]  # fmt: skip
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for s in rows:
        change = s["end"] - s["best"]
        in_se = change / s["drop_se"] if s["drop_se"] > 0 else math.nan
        cells = [s["method"], str(s["seed"]),
                 f"{s['best']:.3f} ± {s['best_se']:.3f} ({s['best_step']}, {s['best_minutes']:.1f})",
                 f"{s['end']:.3f} ± {s['end_se']:.3f} ({s['end_step']}, {s['end_minutes']:.1f})",
                 f"{change:+.3f} ({in_se:+.1f} se)",
                 f"{s['end_specks']:.2f} ({s['base_specks']:.2f})",
                 f"{s['end_background']:.3f} ({s['base_background']:.3f})",
                 str(len(s["flags"])) if s["flags"] else "none"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for s in rows:
        if s.get("colours"):
            cells = [f"{c['colour']} {c['base']:.3f} -> {c['end']:.3f} ({c['diff']:+.3f} ± {c['se']:.3f}, n {c['n']})"
                     for c in s["colours"]]  # fmt: skip
            lines.append(
                f"- {s['method']} (seed {s['seed']}) strict per colour named, base -> end: {', '.join(cells)}"
            )
    for s in rows:
        for flag in s["flags"]:
            lines.append(f"- FLAGGED {s['method']} (seed {s['seed']}): {flag}")
    return "\n".join(lines) + "\n"
