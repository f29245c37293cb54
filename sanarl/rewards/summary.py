"""Aggregates of an evaluation: per-key mean / std / standard error, GenEval accuracy and side-by-side deltas.

Conventions (docs/eval.md):
- `std` is the sample standard deviation (ddof = 1; 0 for n = 1) and `stderr = std / sqrt(n)`, the standard error of
  the mean. NaN scores (samples a reward could not score) are left out and counted in `nan`.
- GenEval accuracy (Ghosh et al. 2023, "GenEval", section 3): each prompt's correctness (strict: every clause holds,
  1/0; partial: fraction of clauses that hold) is averaged over the prompts of a tag (its *per-tag accuracy*), and the
  *overall* score is the unweighted mean of the per-tag accuracies (not the mean over all prompts).
- A comparison of B against A on the same prompts and seeds is paired: delta = mean(b_i - a_i) with standard error
  std(b_i - a_i) / sqrt(n), which is smaller than the unpaired sqrt(se_a^2 + se_b^2) when the two correlate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

ACCURACY_KEYS: tuple[str, ...] = ("strict", "partial", "exact")
"""Score keys a GenEval-style reward (`shapes`, `geneval`) returns and `geneval_accuracy` reads (`exact`: the shapes
judge's variant that also fails extra objects; rewards without it just leave it out)."""


def describe(values: Sequence[float]) -> dict[str, float]:
    """`{mean, std, stderr, n, nan}` of `values` (NaN left out; all-NaN or empty -> mean NaN, n 0)."""
    finite = [float(v) for v in values if not math.isnan(float(v))]
    n = len(finite)
    if n == 0:
        return {"mean": math.nan, "std": math.nan, "stderr": math.nan, "n": 0, "nan": len(values)}
    mean = math.fsum(finite) / n
    var = math.fsum((v - mean) ** 2 for v in finite) / (n - 1) if n > 1 else 0.0
    std = math.sqrt(var)
    return {"mean": mean, "std": std, "stderr": std / math.sqrt(n), "n": n, "nan": len(values) - n}


def summarize_scores(scores: Mapping[str, Sequence[float]]) -> dict[str, dict[str, float]]:
    """`describe` of every score key: `{key: {mean, std, stderr, n, nan}}`, keys sorted."""
    return {key: describe(scores[key]) for key in sorted(scores)}


def geneval_accuracy(tags: Sequence[str], per_prompt: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """GenEval per-tag and overall accuracy.

    Args:
        tags: the GenEval tag of each sample (`metadata["tag"]`), length N.
        per_prompt: `{"strict": [N], "partial": [N]}` per-sample correctness in [0, 1] (either key may be absent).

    Returns:
        `{"per_tag": {tag: {"strict": acc, "partial": acc, "n": count}}, "overall": {"strict": mean over tags,
        "partial": mean over tags}, "tags": number of tags}`; NaN samples are left out of their tag.
    """
    keys = [k for k in ACCURACY_KEYS if k in per_prompt]
    per_tag: dict[str, dict[str, float]] = {}
    for tag in sorted(set(tags)):
        rows = [i for i, t in enumerate(tags) if t == tag]
        entry: dict[str, float] = {}
        for key in keys:
            stats = describe([per_prompt[key][i] for i in rows])
            entry[key] = stats["mean"]
            entry["n"] = stats["n"]
        per_tag[tag] = entry
    overall = {}
    for key in keys:
        accs = [e[key] for e in per_tag.values() if not math.isnan(e[key])]
        overall[key] = math.fsum(accs) / len(accs) if accs else math.nan
    return {"per_tag": per_tag, "overall": overall, "tags": len(per_tag)}


def accuracy_rewards(scores: Mapping[str, Sequence[float]]) -> list[str]:
    """Reward names whose keys include `<name>/strict` (GenEval-style rewards: shapes, geneval)."""
    return sorted({key.split("/")[0] for key in scores if key.endswith("/strict")})


def summarize(scores: Mapping[str, Sequence[float]], tags: Sequence[str] | None) -> dict[str, Any]:
    """The summary of one model: `{"scores": summarize_scores, "geneval": {reward: geneval_accuracy}}`.

    `scores` keys are `<reward>/<key>`; `tags` (one per sample, or None) enables the GenEval block for every reward
    that returns `strict`.
    """
    out: dict[str, Any] = {"scores": summarize_scores(scores), "geneval": {}}
    if tags is not None:
        for name in accuracy_rewards(scores):
            per_prompt = {k: scores[f"{name}/{k}"] for k in ACCURACY_KEYS if f"{name}/{k}" in scores}
            out["geneval"][name] = geneval_accuracy(tags, per_prompt)
    return out


def paired_delta(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """B minus A on paired samples: `{delta, stderr, n}` over the pairs where both are finite."""
    if len(a) != len(b):
        raise ValueError(f"paired_delta needs equal lengths, got {len(a)} and {len(b)}")
    diffs = [float(y) - float(x) for x, y in zip(a, b, strict=True)]
    stats = describe(diffs)
    return {"delta": stats["mean"], "stderr": stats["stderr"], "n": stats["n"]}


def compare(
    reference: Mapping[str, Sequence[float]], other: Mapping[str, Sequence[float]]
) -> dict[str, dict[str, float]]:
    """Paired deltas `other - reference` for every score key the two share: `{key: {delta, stderr, n}}`."""
    return {key: paired_delta(reference[key], other[key]) for key in sorted(set(reference) & set(other))}
