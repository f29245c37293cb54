"""`sanarl eval` end to end on the shipped tiny shapes base with the shapes reward, and its bad-input exits."""

from __future__ import annotations

import json
import math

import pytest
from PIL import Image

pytestmark = pytest.mark.slow

COMMON = (
    "--dataset",
    "shapes:test",
    "--rewards",
    "shapes",
    "--num",
    "6",
    "--steps",
    "3",
    "--batch-size",
    "4",
)


def test_eval_writes_samples_summary_grid_and_compares(run_cli, tmp_path):
    out = tmp_path / "eval"
    code, stdout, stderr = run_cli(
        "eval", "--model", "sanarl-tiny:shapes-base", "--model", "sanarl-tiny:shapes-base", *COMMON,
        "--seed", "3", "--output", out, "--image-stats",
    )  # fmt: skip
    assert code == 0, stderr
    assert "sanarl eval: 6 samples" in stdout and "GenEval" in stdout
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 12  # 2 models x 6 samples
    first = [r for r in records if r["source"] == "sanarl-tiny:shapes-base"]
    assert [r["seed"] for r in first] == [3, 4, 5, 6, 7, 8]
    assert all(r["metadata"]["prompt"] == r["prompt"] for r in first)
    assert Image.open(out / first[0]["image"]).size == (32, 32)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sampler"]["num_steps"] == 3 and summary["sampler"]["guidance_scale"] == 1.0
    models = summary["models"]
    assert list(models) == ["sanarl-tiny:shapes-base", "sanarl-tiny:shapes-base#2"]
    strict = [r["shapes/strict"] for r in first]
    assert models["sanarl-tiny:shapes-base"]["scores"]["shapes/strict"]["mean"] == pytest.approx(
        sum(strict) / 6
    )
    assert models["sanarl-tiny:shapes-base"]["scores"]["stats/entropy"]["n"] == 6
    tags = {r["metadata"]["tag"] for r in first}
    geneval = models["sanarl-tiny:shapes-base"]["geneval"]["shapes"]
    assert set(geneval["per_tag"]) == tags
    mean_of_tags = sum(t["strict"] for t in geneval["per_tag"].values()) / len(tags)
    assert geneval["overall"]["strict"] == pytest.approx(mean_of_tags)
    # the same model twice on the same prompts and seeds: deltas exactly 0
    delta = summary["comparison"]["sanarl-tiny:shapes-base#2"]["shapes/partial"]
    assert delta["delta"] == 0.0 and delta["stderr"] == 0.0 and delta["n"] == 6
    grid = Image.open(out / "grid.png")
    assert grid.size[0] == 8 * 128  # 2 models x 4 prompts per row
    assert not math.isnan(models["sanarl-tiny:shapes-base"]["seconds_per_image"])


def test_eval_bad_inputs_exit_2(run_cli, tmp_path):
    model = ("--model", "sanarl-tiny:shapes-base")
    out = ("--output", tmp_path / "o")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    plain = tmp_path / "plain.txt"
    plain.write_text("a red circle\na cat on a sofa\n")  # the second is outside the grammar
    cases = [
        ((*model, "--dataset", "shapes", "--rewards", "shapez", *out), "Known rewards"),
        ((*model, "--prompts", tmp_path / "none.txt", "--rewards", "shapes", *out), "does not exist"),
        ((*model, "--prompts", empty, "--rewards", "shapes", *out), "empty"),
        (
            ("--checkpoint", tmp_path, "--dataset", "shapes", "--rewards", "shapes", *out),
            "holds no checkpoint",
        ),
        (("--dataset", "shapes", "--rewards", "shapes", *out), "nothing to evaluate"),
        (
            (*model, "--prompts", plain, "--rewards", "shapes", "--steps", "1", *out),
            "prompt 'a cat on a sofa' has no shapes-world metadata and its caption is not in the shapes grammar",
        ),
    ]
    for args, message in cases:
        code, _, stderr = run_cli("eval", *args)
        assert code == 2, (args, stderr)
        assert message in " ".join(stderr.split()), (message, stderr)


def test_eval_scores_a_file_of_shapes_grammar_captions_no_preset_contains(run_cli, tmp_path):
    captions = ["two red squares", "three blue circles", "a green triangle above a yellow square"]
    prompts = tmp_path / "mine.txt"
    prompts.write_text("\n".join(captions) + "\n")
    out = tmp_path / "eval"
    code, _, stderr = run_cli(
        "eval", "--model", "sanarl-tiny:shapes-base", "--prompts", prompts, "--rewards", "shapes",
        "--steps", "2", "--output", out,
    )  # fmt: skip
    assert code == 0, stderr
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in records] == captions
    assert all(0.0 <= r["shapes/partial"] <= 1.0 and r["shapes/strict"] in (0.0, 1.0) for r in records)
