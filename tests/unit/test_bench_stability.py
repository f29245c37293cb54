"""The bench's stability report (sanarl/bench/stability.py): the best and end point of synthetic held-out curves, the
standard error of their difference by hand, the flags (end below best by more than 2 se; specks / background out of
the base's band, a colour below the base by more than 2 paired se), and the report's text in results.md and
results.json."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from rich.console import Console

from sanarl.bench.report import write_report
from sanarl.bench.stability import colour_accuracy, curve_stability, stability_markdown, stability_rows


def _summary(exact: float, se: float, specks: float, background: float) -> dict:
    scores = {
        "shapes/exact": {"mean": exact, "stderr": se},
        "shapes/strict": {"mean": exact + 0.04, "stderr": se},
        "shapes/partial": {"mean": 0.55, "stderr": 0.01},
        "shapes/extra": {"mean": 0.0, "stderr": 0.01},
        "stats/num_specks": {"mean": specks, "stderr": 0.01},
        "stats/background_fraction": {"mean": background, "stderr": 0.001},
        "stats/num_blobs": {"mean": 2.0, "stderr": 0.01},
        "stats/entropy": {"mean": 1.4, "stderr": 0.01},
    }
    return {"scores": scores, "geneval": {"shapes": {"overall": {"strict": exact + 0.04}, "per_tag": {}}}}


BASE = _summary(0.207, 0.018, 0.00, 0.815)
# the issue's 25-minute DiffusionNFT curve (minutes, exact, se, specks, background): it rises, then decays
ISSUE = [(10, 0.258, 0.019, 0.09, 0.806), (15, 0.240, 0.019, 0.35, 0.820), (20, 0.246, 0.019, 4.38, 0.798)]
ISSUE_END = (25, 0.242, 0.019, 7.94, 0.790)


def _record(method: str, curve, end, seed: int = 0) -> dict:
    points = [{"step": 13 * m, "train_minutes": float(m), "summary": _summary(*rest)} for m, *rest in curve]
    return {"method": method, "seed": seed, "steps": 13 * end[0], "train_minutes": float(end[0]),
            "summary": _summary(*end[1:]), "curve": points}  # fmt: skip


def _points(record: dict) -> list[dict]:
    return [{"step": 0, "train_minutes": 0.0, "summary": BASE}, *record["curve"],
            {"step": record["steps"], "train_minutes": record["train_minutes"], "summary": record["summary"]}]  # fmt: skip


def test_the_issue_curve_is_flagged_for_specks_and_background_not_for_its_drop():
    s = curve_stability(_points(_record("nft", ISSUE, ISSUE_END)), BASE)
    assert (s["best_step"], s["best"], s["end_step"], s["end"]) == (130, 0.258, 325, 0.242)
    se = math.sqrt(0.019**2 + 0.019**2)  # 0.0269: the drop 0.016 is 0.6 se, inside 2 se
    assert s["drop"] == pytest.approx(0.016) and s["drop_se"] == pytest.approx(se)
    assert s["drop_in_se"] == pytest.approx(0.016 / se)
    assert [f.split(":")[0] for f in s["flags"]] == ["specks", "background"]
    assert "7.94 per image > base 0.00 + 0.1" in s["flags"][0]
    assert "0.790 is -0.025 from the base's 0.815 (band ± 0.01)" in s["flags"][1]


def test_an_end_more_than_two_se_below_the_best_is_flagged():
    # best 0.300 ± 0.020 at minute 10, end 0.220 ± 0.015: drop 0.080 > 2 * sqrt(0.02^2 + 0.015^2) = 0.050
    record = _record("grpo", [(10, 0.300, 0.020, 0.0, 0.815)], (20, 0.220, 0.015, 0.05, 0.812))
    s = curve_stability(_points(record), BASE)
    assert s["drop_se"] == pytest.approx(0.025) and s["drop_in_se"] == pytest.approx(3.2)
    (flag,) = s["flags"]
    assert flag == (
        "end below best: shapes/exact 0.220 at step 260 < 0.300 at step 130 by 0.080 > 2 se (0.025 each)"
    )
    # the same drop with wider error bars (0.030 and 0.030: 2 se = 0.085) is not flagged
    wide = _record("grpo", [(10, 0.300, 0.030, 0.0, 0.815)], (20, 0.220, 0.030, 0.05, 0.812))
    assert curve_stability(_points(wide), BASE)["flags"] == []


def test_a_healthy_curve_has_no_flags_and_a_monotone_one_ends_at_its_best():
    # specks 0.09 <= 0 + 0.1; background 0.806 is 0.009 from 0.815, inside 0.01
    record = _record("nft", [(10, 0.250, 0.019, 0.02, 0.810)], (20, 0.281, 0.020, 0.09, 0.806))
    s = curve_stability(_points(record), BASE)
    assert s["flags"] == [] and (s["best_step"], s["end_step"]) == (260, 260) and s["drop"] == 0.0
    # a method never above the base: the best is the base (minute 0), and an end 3 se below it is flagged
    worse = _record("soar", [], (5, 0.130, 0.018, 0.0, 0.815))
    s = curve_stability(_points(worse), BASE)
    assert s["best_step"] == 0 and s["drop_in_se"] == pytest.approx(0.077 / math.hypot(0.018, 0.018))
    assert s["flags"][0].startswith("end below best")


def test_the_report_shows_best_and_end_points_and_flags(tmp_path):
    records = [
        {"method": "base", "seed": 0, "steps": 0, "train_minutes": 0.0, "summary": BASE},
        _record("nft", ISSUE, ISSUE_END),
        _record("grpo", [(10, 0.250, 0.019, 0.02, 0.810)], (20, 0.281, 0.020, 0.09, 0.806)),
    ]
    rows = stability_rows(records)
    assert [(r["method"], len(r["flags"])) for r in rows] == [("nft", 2), ("grpo", 0)]
    text = stability_markdown(rows)
    assert "| nft | 0 | 0.258 ± 0.019 (130, 10.0) | 0.242 ± 0.019 (325, 25.0) | -0.016 (-0.6 se) |" in text
    assert "| 7.94 (0.00) | 0.790 (0.815) | 2 |" in text
    assert "| grpo | 0 | 0.281 ± 0.020 (260, 20.0) | 0.281 ± 0.020 (260, 20.0) | +0.000 (+0.0 se) |" in text
    assert "- FLAGGED nft (seed 0): specks: 7.94 per image > base 0.00 + 0.1" in text
    assert "FLAGGED grpo" not in text

    opts = SimpleNamespace(output=tmp_path, budget_minutes=25.0, seeds=1, eval_num=512, eval_steps=20)
    console = Console(file=open(tmp_path / "console.txt", "w"), width=400)  # noqa: SIM115
    results = write_report(opts, records, rows=SimpleNamespace(prompts=[], metadata=[]), console=console)
    console.file.close()
    report = (tmp_path / "results.md").read_text()
    assert "## Best and end point of each curve (shapes/exact)" in report and text in report
    assert "FLAGGED nft (seed 0): background" in (tmp_path / "console.txt").read_text()
    saved = json.loads((tmp_path / "results.json").read_text())["stability"]
    assert saved == json.loads(json.dumps(results["stability"])) and saved[0]["end_specks"] == 7.94


def _meta(*colours: str) -> dict:
    return {"include": [{"class": "circle", "count": 1, "color": c} for c in colours]}


def test_a_colour_collapse_is_flagged_by_paired_per_colour_accuracy():
    """Eight prompts: four name red (one of them twice: it counts once), two blue (one shared with red), two green,
    one no colour. The end fails three of the four red prompts the base passed (red turned into another colour) and
    gains elsewhere; the paired per-colour differences and their standard errors are re-derived by hand below."""
    metadata = [_meta("red"), _meta("red", "red"), _meta("red", "blue"), _meta("red"), _meta("blue"),
                _meta("green"), _meta("green"), {"include": [{"class": "square", "count": 2}]}]  # fmt: skip
    base = [1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    end = [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    colours = {c["colour"]: c for c in colour_accuracy(end, base, metadata)}
    assert list(colours) == [
        "red",
        "blue",
        "green",
    ]  # first appearance; the colourless prompt counts for none
    red = [end[i] - base[i] for i in (0, 1, 2, 3)]  # -1, -1, -1, 0
    mean = sum(red) / 4
    se = math.sqrt(sum((d - mean) ** 2 for d in red) / 3 / 4)
    assert (colours["red"]["n"], colours["red"]["base"], colours["red"]["end"]) == (4, 1.0, 0.25)
    assert colours["red"]["diff"] == pytest.approx(mean) and colours["red"]["se"] == pytest.approx(se)
    assert colours["blue"]["diff"] == 0.0  # prompts 2 (-1) and 4 (+1)
    assert colours["green"]["diff"] == 0.5  # prompts 5 (0) and 6 (+1)
    records = [
        {"method": "base", "seed": 0, "steps": 0, "train_minutes": 0.0, "summary": BASE,
         "per_sample": {"shapes/strict": base}},
        {**_record("nft", [], (10, 0.25, 0.019, 0.0, 0.815)), "per_sample": {"shapes/strict": end}},
    ]  # fmt: skip
    (row,) = stability_rows(records, metadata)
    # red: -0.75 against 2 x se = 2 x 0.25 = 0.5 -> flagged; blue and green are not below the base
    assert row["flags"] == [
        f"colour: red shapes/strict 0.250 < base 1.000 by 0.750 > 2 paired se ({se:.3f}, 4 prompts)"
    ]
    assert "- nft (seed 0) strict per colour named, base -> end: red 1.000 -> 0.250" in stability_markdown(
        [row]
    )
    assert stability_rows(records)[0]["flags"] == []  # without the held-out rows' metadata: no colour check
