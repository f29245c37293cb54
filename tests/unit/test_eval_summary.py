"""Aggregates of `sanarl eval` and the bench against hand-computed values."""

from __future__ import annotations

import json
import math

import pytest

from sanarl.bench.report import aggregate, markdown, ratios
from sanarl.rewards.summary import compare, describe, geneval_accuracy, paired_delta, summarize


def test_describe_matches_hand_computation():
    # values 1, 2, 3, 6: mean 3, sample variance ((4 + 1 + 0 + 9) / 3) = 14/3
    stats = describe([1.0, 2.0, 3.0, 6.0, math.nan])
    assert stats["mean"] == pytest.approx(3.0)
    assert stats["std"] == pytest.approx(math.sqrt(14 / 3))
    assert stats["stderr"] == pytest.approx(math.sqrt(14 / 3) / 2)
    assert (stats["n"], stats["nan"]) == (4, 1)
    assert describe([0.5]) == {"mean": 0.5, "std": 0.0, "stderr": 0.0, "n": 1, "nan": 0}
    assert math.isnan(describe([])["mean"])


def _samples_file(tmp_path):
    """A hand-made samples.jsonl: 3 tags with 3, 1 and 2 prompts."""
    rows = [
        ("counting", 1.0, 1.0), ("counting", 0.0, 0.5), ("counting", 0.0, 0.0),
        ("colors", 1.0, 1.0),
        ("position", 0.0, 0.5), ("position", 1.0, 1.0),
    ]  # fmt: skip
    path = tmp_path / "samples.jsonl"
    path.write_text(
        "".join(
            json.dumps({"metadata": {"tag": t}, "shapes/strict": s, "shapes/partial": p}) + "\n"
            for t, s, p in rows
        )
    )
    return path


def test_geneval_accuracy_is_the_mean_of_per_tag_accuracies(tmp_path):
    records = [json.loads(line) for line in _samples_file(tmp_path).read_text().splitlines()]
    tags = [r["metadata"]["tag"] for r in records]
    acc = geneval_accuracy(
        tags,
        {"strict": [r["shapes/strict"] for r in records], "partial": [r["shapes/partial"] for r in records]},
    )
    per_tag = acc["per_tag"]
    assert per_tag["counting"] == pytest.approx({"strict": 1 / 3, "partial": 0.5, "n": 3})
    assert per_tag["colors"] == pytest.approx({"strict": 1.0, "partial": 1.0, "n": 1})
    assert per_tag["position"] == pytest.approx({"strict": 0.5, "partial": 0.75, "n": 2})
    # overall = mean over tags (1/3 + 1 + 1/2) / 3, not the mean over prompts (3/6)
    assert acc["overall"]["strict"] == pytest.approx((1 / 3 + 1 + 0.5) / 3)
    assert acc["overall"]["partial"] == pytest.approx((0.5 + 1 + 0.75) / 3)
    assert acc["tags"] == 3


def test_summarize_adds_geneval_block_only_for_strict_rewards():
    scores = {"shapes/strict": [1.0, 0.0], "shapes/partial": [1.0, 0.5], "jpeg/jpeg": [3.0, 5.0]}
    out = summarize(scores, ["colors", "colors"])
    assert list(out["geneval"]) == ["shapes"]
    assert out["geneval"]["shapes"]["overall"] == pytest.approx({"strict": 0.5, "partial": 0.75})
    assert out["scores"]["jpeg/jpeg"]["mean"] == pytest.approx(4.0)
    assert summarize(scores, None)["geneval"] == {}


def test_paired_comparison_delta_and_stderr():
    a = [0.0, 1.0, 0.0, 1.0]
    b = [1.0, 1.0, 0.0, 1.0]  # differences 1, 0, 0, 0: mean 0.25, sample var (0.5625 + 3 * 0.0625) / 3 = 0.25
    d = paired_delta(a, b)
    assert d["delta"] == pytest.approx(0.25)
    assert d["stderr"] == pytest.approx(math.sqrt(0.25) / 2)
    out = compare({"k": a, "only_a": a}, {"k": b})
    assert list(out) == ["k"]
    with pytest.raises(ValueError):
        paired_delta([1.0], [1.0, 2.0])


def _record(method, seed, strict, se, partial=0.5, steps=10, minutes=1.0, exact=None, extra=0.0):
    scores = {
        "shapes/strict": {"mean": strict, "stderr": se},
        "shapes/partial": {"mean": partial, "stderr": 0.01},
        "shapes/exact": {"mean": strict if exact is None else exact, "stderr": se},
        "shapes/extra": {"mean": extra, "stderr": 0.0},
    }
    for key in ("background_fraction", "num_blobs", "num_specks", "entropy"):
        scores[f"stats/{key}"] = {"mean": 1.0 if method == "base" else 2.0, "stderr": 0.0}
    summary = {"scores": scores, "geneval": {"shapes": {"overall": {"strict": strict}}}}
    return {"method": method, "seed": seed, "summary": summary, "steps": steps, "train_minutes": minutes,
            "rollout_images": 64 * steps, "reward_calls": 64 * steps}  # fmt: skip


def test_bench_aggregate_over_seeds_ratios_and_table():
    records = [
        _record("base", None, 0.10, 0.02, steps=0, minutes=0.0),
        _record("nft", 0, 0.20, 0.03, exact=0.10, extra=1.0), _record("nft", 1, 0.30, 0.04, exact=0.12, extra=2.0),
        _record("grpo", 0, 0.125, 0.02), _record("grpo", 1, 0.125, 0.02),
    ]  # fmt: skip
    rows = {r["method"]: r for r in aggregate(records)}
    nft = rows["nft"]
    assert nft["strict"] == pytest.approx(0.25)
    assert nft["strict_std"] == pytest.approx(math.sqrt(0.005))  # (0.05^2 + 0.05^2) / 1
    assert nft["strict_se"] == pytest.approx(math.sqrt(0.03**2 + 0.04**2) / 2)  # = 0.025
    assert nft["gain"] == pytest.approx(0.15)
    assert nft["gain_in_std"] == pytest.approx(0.15 / math.sqrt(0.005))
    assert nft["rollout_images"] == 640 and nft["num_blobs"] == 2.0
    assert math.isnan(rows["grpo"]["gain_in_std"])  # zero seed spread
    # gains in units of the evaluation's standard error: sqrt(se_nft^2 + se_base^2) = sqrt(0.025^2 + 0.02^2)
    se = math.sqrt(0.025**2 + 0.02**2)
    assert nft["strict_gain_se"] == pytest.approx(se) and nft["strict_gain_in_se"] == pytest.approx(0.15 / se)
    assert nft["exact"] == pytest.approx(0.11) and nft["exact_gain"] == pytest.approx(0.01)
    assert nft["extra_objects"] == pytest.approx(1.5)
    (ratio,) = ratios(list(rows.values()))
    assert ratio["strict_ratio"] == pytest.approx(0.25 / 0.125)
    text = markdown(list(rows.values()), [ratio], "# bench")
    assert "| nft | 2 | 0.2500 ± 0.0707 | 0.0250 | 0.1100 ± 0.0141 | 0.0250 |" in text
    assert f"nft: strict gain over base +0.1500 ± {se:.4f} ({0.15 / se:.1f} eval se" in text
    assert "| +1.50 |" in text  # objects beyond the prompt's count
    assert "DiffusionNFT vs Flow-GRPO at equal wall time: strict nft / grpo = 2.000" in text
