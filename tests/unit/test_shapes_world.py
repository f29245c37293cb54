"""The shapes world: prompts, split, renderer and judge (numerical checks against hand-computed values)."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFilter

from sanarl.errors import DataError
from sanarl.worlds import shapes as W
from sanarl.worlds.shapes import judging as W_judge


def _row(split: str, prompt: str) -> dict:
    rows = [m for rows in W.list_prompts(split).values() for m in rows if m["prompt"] == prompt]
    assert len(rows) == 1, prompt
    return rows[0]


def _sample(n: int, size: int, seed: int = 11):
    """n items per split: (metadata, render seed)."""
    return [W.sample_item(split, seed, i) for split in W.SPLITS for i in range(n)]


# ---------------------------------------------------------------------------------------------------------------
# World spec, captions, split
# ---------------------------------------------------------------------------------------------------------------


def test_palette_is_well_separated_from_itself_and_the_background():
    colors = np.array(list(W.PALETTE.values()), dtype=float)
    pairwise = [np.linalg.norm(a - b) for a, b in itertools.combinations(colors, 2)]
    assert min(pairwise) == pytest.approx(
        np.linalg.norm([10, 175, 0])
    )  # red (230,40,40) vs yellow (240,215,40)
    assert min(np.linalg.norm(colors - W.BACKGROUND, axis=1)) > 180  # green (40,190,60): 181


def test_caption_templates_and_geneval_metadata():
    assert _row("train", "a circle") == {
        "tag": "single_object",
        "include": [{"class": "circle", "count": 1}],
        "prompt": "a circle",
    }
    assert _row("test", "three squares") == {
        "tag": "counting",
        "include": [{"class": "square", "count": 3}],
        "exclude": [{"class": "square", "count": 4}],
        "prompt": "three squares",
    }
    assert _row("test", "a red circle to the left of a blue square") == {
        "tag": "position",
        "include": [
            {"class": "square", "count": 1, "color": "blue"},
            {"class": "circle", "count": 1, "color": "red", "position": ["left of", 0]},
        ],
        "prompt": "a red circle to the left of a blue square",
    }
    assert _row("train", "a red square and a yellow circle")["include"] == [
        {"class": "square", "count": 1, "color": "red"},
        {"class": "circle", "count": 1, "color": "yellow"},
    ]
    assert W.split_of(_row("test", "a triangle and a square")) == "test"
    assert W.split_of(_row("train", "a square and a triangle")) == "train"


def test_split_sizes_are_the_hand_counted_ones():
    sizes = {s: {t: len(r) for t, r in cats.items()} for s, cats in W.all_splits().items()}
    assert sizes["train"] == {
        "single_object": 3,
        "two_object": 3,
        "counting": 6,
        "colors": 9,
        "position": 162,
        "color_attr": 54,
    }
    assert sizes["test"] == {"two_object": 3, "counting": 3, "colors": 3, "position": 222, "color_attr": 42}
    # Totals per tag: 3 shapes; 6 ordered pairs; 3 x 3 counts; 4 x 3; 6 x 4 relations x 16 colours; 6 x 16.
    totals = {t: sizes["train"].get(t, 0) + sizes["test"].get(t, 0) for t in W.TAGS}
    assert totals == {
        "single_object": 3,
        "two_object": 6,
        "counting": 9,
        "colors": 12,
        "position": 384,
        "color_attr": 96,
    }


def test_splits_are_disjoint_and_train_never_states_a_held_out_combination():
    splits = W.all_splits()
    prompts = {s: [m["prompt"] for rows in cats.values() for m in rows] for s, cats in splits.items()}
    assert len(set(prompts["train"])) == len(prompts["train"])
    assert not set(prompts["train"]) & set(prompts["test"])
    for prompt in prompts["train"]:
        assert not any(f"{c} {s}" in prompt for c, s in W.HELDOUT_COLOR_SHAPES), prompt
    for a, rel, b in W.HELDOUT_LAYOUTS:
        phrase = W.RELATIONS[rel]
        assert not any(f"{a} {phrase} a " in p and p.endswith(b) for p in prompts["train"])
        assert any(f"{a} {phrase} a " in p and p.endswith(b) for p in prompts["test"])
    assert "four circles" in prompts["test"] and "four circles" not in prompts["train"]
    for rows in splits["test"].values():
        assert all(W.split_of(m) == "test" for m in rows)


def test_held_out_layouts_are_closed_under_mirroring():
    mirror = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
    assert {(b, mirror[rel], a) for a, rel, b in W.HELDOUT_LAYOUTS} == set(W.HELDOUT_LAYOUTS)


def test_caption_vocabulary_is_the_22_template_words():
    assert W.caption_vocabulary() == sorted(
        "a above and below blue circle circles four green left of red right square squares the three to triangle "
        "triangles two yellow".split()
    )
    assert max(len(m["prompt"].split()) for rows in W.list_prompts("train").values() for m in rows) == 10


def test_shipped_sft_examples_are_reproducible_from_the_renderer(tmp_path):
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("make_sft_examples", root / "scripts/make_sft_examples.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    written = script.write_examples(tmp_path, 64, seed=0, per_tag=2)
    shipped = root / "sanarl/data/datasets/examples/sft"
    assert (
        sorted(p.name for p in shipped.glob("*.png")) == sorted(p.name for p in written)
        and len(written) == 12
    )
    for path in written:
        assert np.array_equal(np.asarray(Image.open(path)), np.asarray(Image.open(shipped / path.name)))
        prompt = json.loads((shipped / path.with_suffix(".json").name).read_text())
        assert prompt == json.loads(path.with_suffix(".json").read_text())
        assert W.split_of(_row("train", prompt["prompt"])) == "train"


def test_sample_item_is_a_pure_function_of_split_seed_index():
    first = [W.sample_item("train", 3, i) for i in range(50)]
    assert first == [W.sample_item("train", 3, i) for i in range(50)]
    assert W.sample_item("heldout", 3, 7) == W.sample_item("test", 3, 7)
    assert first != [W.sample_item("train", 4, i) for i in range(50)]
    assert all(W.split_of(m) == "train" for m, _ in first)
    tags = [W.sample_item("train", 0, i)[0]["tag"] for i in range(3000)]
    freq = {t: tags.count(t) / 3000 for t in W.TAGS}
    assert all(abs(f - 1 / 6) < 0.03 for f in freq.values()), freq  # tags uniform over the split's categories


def test_unknown_split_is_a_data_error_naming_the_key():
    with pytest.raises(DataError, match="validation.dataset.split"):
        W.canonical_split("val", "validation.dataset.split")


# ---------------------------------------------------------------------------------------------------------------
# Renderer
# ---------------------------------------------------------------------------------------------------------------


def test_render_is_deterministic_and_seed_dependent():
    meta = _row("train", "three triangles")
    a, b, c = W.render(meta, 32, 5), W.render(meta, 32, 5), W.render(meta, 32, 6)
    assert a.dtype == np.uint8 and a.shape == (32, 32, 3)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert W.render(meta, 64, 5).shape == (64, 64, 3)


def test_pixel_aligned_square_is_painted_exactly():
    img = W.draw_scene([W.SceneObject("square", "blue", cx=10.0, cy=12.0, size=8.0)], 32)
    expected = np.empty((32, 32, 3), dtype=np.uint8)
    expected[:] = W.BACKGROUND
    expected[8:16, 6:14] = W.PALETTE["blue"]  # box [6, 14) x [8, 16)
    assert np.array_equal(img, expected)


@pytest.mark.parametrize(
    ("shape", "area"), [("circle", math.pi * 10**2), ("square", 400.0), ("triangle", 200.0)]
)
def test_antialiased_coverage_integrates_to_the_shape_area(shape, area):
    obj = W.SceneObject(shape, "red", cx=31.3, cy=30.7, size=20.0)
    assert W.coverage(obj, 64, supersample=16)[2].sum() == pytest.approx(area, rel=0.005)
    _, _, cov = W.coverage(obj, 64)  # the renderer's 4 x 4 grid
    assert cov.sum() == pytest.approx(area, rel=0.015)
    assert cov.min() >= 0 and cov.max() == 1.0


def test_layouts_keep_sizes_margins_gaps_and_relations():
    for size in (32, 64):
        for meta, seed in _sample(150, size, seed=2):
            objs = W.plan_scene(meta, size, seed)
            assert len(objs) == sum(e["count"] for e in meta["include"])
            lo, hi = W.SIZE_RANGES[len(objs)]
            for o in objs:
                assert lo * size <= o.size <= hi * size
                assert min(o.cx, o.cy) - o.size / 2 >= W.MARGIN_FRAC * size - 1e-9
                assert max(o.cx, o.cy) + o.size / 2 <= size - W.MARGIN_FRAC * size + 1e-9
            for p, q in itertools.combinations(objs, 2):
                gaps = abs(p.cx - q.cx) - (p.size + q.size) / 2, abs(p.cy - q.cy) - (p.size + q.size) / 2
                assert max(gaps) >= W.GAP_FRAC * size - 1e-9
            for entry in meta["include"]:
                if "position" in entry:
                    _check_relation(objs, entry, meta["include"], size)
            stated = [e.get("color") for e in meta["include"] for _ in range(e["count"])]
            assert all(c is None or c == o.color for c, o in zip(stated, objs, strict=True))


def _check_relation(objs, entry, include, size):
    rel, ref = entry["position"]
    a, b = objs[include.index(entry)], objs[ref]
    dx, dy = b.cx - a.cx, b.cy - a.cy
    along, across = {"left of": (dx, dy), "right of": (-dx, dy), "above": (dy, dx), "below": (-dy, dx)}[rel]
    assert along >= (a.size + b.size) / 2 + W.GAP_FRAC * size - 1e-9
    assert abs(across) <= W.ORTHO_FRAC * along + 1e-9


def test_bad_metadata_and_sizes_raise_data_errors_naming_the_field():
    with pytest.raises(DataError, match=r"include\[0\].class is 'hexagon'"):
        W.render({"include": [{"class": "hexagon", "count": 1}], "prompt": "a hexagon"})
    with pytest.raises(DataError, match=r"include\[0\].color is 'purple'"):
        W.judge(
            np.zeros((32, 32, 3), np.uint8), {"include": [{"class": "circle", "count": 1, "color": "purple"}]}
        )
    with pytest.raises(DataError, match=r"include\[1\].position"):
        W.validate_metadata({"include": [{"class": "circle"}, {"class": "square", "position": ["near", 0]}]})
    with pytest.raises(DataError, match="5 objects"):
        W.render({"include": [{"class": "circle", "count": 5}]})
    cycle = {
        "include": [
            {"class": "circle", "position": ["left of", 1]},
            {"class": "square", "position": ["left of", 0]},
        ]
    }
    with pytest.raises(DataError, match="contradictory"):
        W.render(cycle)
    with pytest.raises(DataError, match="multiple of 16"):
        W.render(_row("train", "a circle"), 40)


# ---------------------------------------------------------------------------------------------------------------
# Judge
# ---------------------------------------------------------------------------------------------------------------


def test_numpy_labelling_matches_scipy_and_uses_8_connectivity(monkeypatch):
    mask = np.zeros((5, 6), dtype=bool)
    mask[0, 0] = mask[1, 1] = True  # diagonal neighbours: one blob
    mask[0, 4:6] = mask[3:5, 2] = True
    raw = W_judge._label_numpy(mask)
    assert raw[0, 0] == raw[1, 1] == 1 and raw[0, 4] == raw[0, 5] == 5 and raw[3, 2] == raw[4, 2] == 21
    labels, n = W.label_components(mask)
    assert n == 3 and labels[1, 1] == 1 and labels[0, 5] == 2 and labels[4, 2] == 3
    rng = np.random.default_rng(0)
    for _ in range(20):
        m = rng.random((32, 32)) < 0.45
        expected, n = W.label_components(m)
        uniq = np.unique(W_judge._label_numpy(m)[m])
        assert uniq.size == n
        got = np.zeros_like(expected)
        got[m] = np.searchsorted(uniq, W_judge._label_numpy(m)[m]) + 1
        assert np.array_equal(got, expected)
    monkeypatch.setitem(sys.modules, "scipy", None)  # `import scipy` now fails: the numpy fallback runs
    fallback, n_fallback = W.label_components(m)
    assert n_fallback == n and np.array_equal(fallback, expected)


@pytest.mark.parametrize(
    ("shape", "fill", "drop"), [("square", 1.0, 0.0), ("circle", math.pi / 4, 0.0), ("triangle", 0.5, 1 / 6)]
)
def test_shape_features_match_the_continuum_values(shape, fill, drop):
    img = W.draw_scene([W.SceneObject(shape, "green", cx=32.4, cy=31.8, size=40.0)], 64)
    (det,) = W.detect_objects(img)
    assert det.shape == shape and det.color == "green"
    assert det.fill == pytest.approx(fill, abs=0.02)
    assert det.drop == pytest.approx(drop, abs=0.01)


def test_classification_rule_on_hand_picked_features():
    assert W.classify_shape(fill=0.99, drop=0.0, aspect=1.0) == "square"
    assert W.classify_shape(fill=0.79, drop=0.01, aspect=1.1) == "circle"
    assert W.classify_shape(fill=0.80, drop=0.10, aspect=1.0) == "triangle"  # blurred triangle: drop decides
    assert W.classify_shape(fill=0.55, drop=-0.16, aspect=1.0) == "triangle"  # apex down: low fill
    assert W.classify_shape(fill=0.99, drop=0.0, aspect=2.0) == "other"  # a bar
    assert W.classify_shape(fill=0.99, drop=0.0, aspect=1.0, side_frac=0.9) == "other"  # fills the frame


def test_frame_filling_images_hold_no_world_object():
    rng = np.random.default_rng(3)
    noise = rng.random((32, 32, 3))  # one foreground blob covering the frame
    assert [d.shape for d in W.detect_objects(noise)] == ["other"]
    assert W.judge(noise, _row("train", "a square")).strict == 0.0
    flat = np.broadcast_to(np.array(W.PALETTE["red"], dtype=np.uint8), (32, 32, 3))
    assert W.judge(flat, _row("train", "a square")).clauses == {"0:square:count": False}
    stats = W.image_stats(noise)
    assert stats["num_blobs"] == 1.0 and stats["background_fraction"] < 0.05 and stats["entropy"] > 8.5


def test_relations_follow_genevals_rule():
    def box(x0, y0, x1, y1):
        return W.Detection("circle", "red", x0, y0, x1, y1, 1, 1.0, 0.0)

    a, b = box(0, 0, 10, 10), box(20, 2, 30, 12)  # offset (-20, -2), dims (20, 20): revised (-18, 0)
    assert W.relations_between(a, b) == {"left of"}
    assert W.relations_between(b, a) == {"right of"}
    # offset (-3, -3) shrinks to (-1, -1): normalised -1/sqrt(18) ~ -0.24 -> no relation
    assert W.relations_between(box(0, 0, 10, 10), box(3, 3, 13, 13)) == set()
    # offset (-20, -20), revised (-18, -18) / 28.3 = -0.64 on both axes -> left of and above
    assert W.relations_between(box(0, 0, 10, 10), box(20, 20, 30, 30)) == {"left of", "above"}


def _blur_noise(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A 1-pixel Gaussian blur (PIL radius 1) then Gaussian noise of std 0.03: float [H, W, 3] in [0, 1]."""
    blurred = np.asarray(Image.fromarray(img).filter(ImageFilter.GaussianBlur(radius=1)), dtype=np.float64)
    return np.clip(blurred / 255 + rng.normal(0.0, 0.03, img.shape), 0.0, 1.0)


def test_judge_accepts_ground_truth_renders_clean_and_perturbed():
    rng = np.random.default_rng(0)
    clean, perturbed, n = 0.0, 0.0, 0
    for size in (32, 64):
        for meta, seed in _sample(130, size):  # 130 per split and size: 520 prompts
            img = W.render(meta, size, seed)
            clean += W.judge(img, meta).strict
            perturbed += W.judge(_blur_noise(img, rng), meta).strict
            n += 1
    assert n == 520
    assert clean / n >= 0.98 and perturbed / n >= 0.95, (clean / n, perturbed / n)


def _failed(img, meta):
    return sorted(k for k, ok in W.judge(img, meta).clauses.items() if not ok)


def test_judge_fails_exactly_the_clause_a_wrong_render_breaks():
    meta = _row("train", "a red square to the left of a yellow circle")
    objs = W.plan_scene(meta, 32, seed=1)  # [yellow circle (reference), red square]
    assert _failed(W.draw_scene(objs, 32), meta) == []
    recolored = [objs[0], dataclasses.replace(objs[1], color="blue")]
    assert _failed(W.draw_scene(recolored, 32), meta) == ["1:square:color", "1:square:position"]
    swapped = [
        dataclasses.replace(objs[0], cx=objs[1].cx, cy=objs[1].cy),
        dataclasses.replace(objs[1], cx=objs[0].cx, cy=objs[0].cy),
    ]
    assert _failed(W.draw_scene(swapped, 32), meta) == ["1:square:position"]
    reshaped = [objs[0], dataclasses.replace(objs[1], shape="triangle")]
    assert _failed(W.draw_scene(reshaped, 32), meta) == [
        "1:square:color",
        "1:square:count",
        "1:square:position",
    ]


def test_judge_fails_the_count_clauses_of_wrong_counts():
    meta = _row("train", "three circles")
    fewer = W.render({**meta, "include": [{"class": "circle", "count": 2}]}, 32, 4)
    more = W.render({**meta, "include": [{"class": "circle", "count": 4}]}, 32, 4)
    assert _failed(W.render(meta, 32, 4), meta) == []
    assert _failed(fewer, meta) == ["0:circle:count"]
    assert _failed(more, meta) == ["exclude:0:circle"]
    result = W.judge(fewer, meta)
    assert result.strict == 0.0 and result.partial == 0.5


def test_judge_accepts_uint8_float_numpy_and_torch_batches():
    torch = pytest.importorskip("torch")
    metas = [W.sample_item("test", 9, i)[0] for i in range(6)]
    imgs = np.stack([W.render(m, 32, i) for i, m in enumerate(metas)])  # [B, H, W, 3] uint8
    singles = [W.judge(img, m) for img, m in zip(imgs, metas, strict=True)]
    chw = imgs.transpose(0, 3, 1, 2) / 255.0
    assert [r.clauses for r in W.judge_batch(chw, metas)] == [r.clauses for r in singles]
    as_torch = W.judge_batch(torch.from_numpy(chw).to(torch.bfloat16), metas)
    assert [r.strict for r in as_torch] == [1.0] * 6
    as_uint8 = W.judge_batch(torch.from_numpy(imgs).permute(0, 3, 1, 2), metas)
    assert [r.clauses for r in as_uint8] == [r.clauses for r in singles]
    wrong = W.judge_batch(chw[:, ::-1], metas)  # channels reversed: colours change
    assert sum(r.strict for r in wrong) < 6
    with pytest.raises(DataError, match="6 images but 5 metadata"):
        W.judge_batch(chw, metas[:5])
    with pytest.raises(DataError, match=r"\[H, W, 3\]"):
        W.judge(chw[0], metas[0])


def test_specks_are_ignored():
    img = np.zeros((32, 32, 3), dtype=np.uint8)
    img[:] = W.BACKGROUND
    img[3:5, 3:5] = W.PALETTE["red"]  # 4 px < min_blob_area(32, 32) = 6
    assert W.min_blob_area(32, 32) == 6 and W.min_blob_area(64, 64) == 21
    assert W.detect_objects(img) == []
    stats = W.image_stats(img)
    assert stats["num_blobs"] == 0 and stats["num_specks"] == 1


def test_image_stats_hand_computed():
    img = np.zeros((32, 32, 3), dtype=np.uint8)
    img[:] = W.BACKGROUND
    assert W.image_stats(img) == {
        "background_fraction": 1.0,
        "num_blobs": 0.0,
        "num_specks": 0.0,
        "entropy": 0.0,
    }
    img[:, 16:] = W.PALETTE["blue"]  # two colour bins, half each: 1 bit
    assert W.image_stats(img) == {
        "background_fraction": 0.5,
        "num_blobs": 1.0,
        "num_specks": 0.0,
        "entropy": 1.0,
    }
    scene = W.render(_row("train", "a red square and a yellow circle"), 32, 0)
    assert W.image_stats(scene)["num_blobs"] == 2.0


# ---------------------------------------------------------------- the exact judge variant


def _two_object_row() -> dict:
    """ "a blue triangle and a green circle" (held-out colour pair), GenEval's color_attr row by hand."""
    return {
        "tag": "color_attr",
        "include": [
            {"class": "triangle", "count": 1, "color": "blue"},
            {"class": "circle", "count": 1, "color": "green"},
        ],
        "prompt": "a blue triangle and a green circle",
    }


def test_exact_fails_an_extra_object_that_strict_lets_pass():
    # 64 px, boxes of 14 px with >= 8 px gaps: the prompt's two objects, then the same scene plus two blue squares
    row = _two_object_row()
    named = [
        W.SceneObject("triangle", "blue", 12.0, 12.0, 14.0),
        W.SceneObject("circle", "green", 40.0, 12.0, 14.0),
    ]
    extra = [
        W.SceneObject("square", "blue", 12.0, 44.0, 14.0),
        W.SceneObject("triangle", "blue", 40.0, 44.0, 14.0),
    ]
    right, cluttered = W.judge(W.draw_scene(named, 64), row), W.judge(W.draw_scene(named + extra, 64), row)
    assert (right.strict, right.exact, right.extra_objects) == (1.0, 1.0, 0)
    # GenEval's clauses are all "at least": four objects still satisfy both colour / count clauses
    assert cluttered.strict == 1.0 and all(cluttered.clauses.values())
    assert (cluttered.exact, cluttered.extra_objects) == (0.0, 2)
    # exact's partial credit: 4 clauses (2 count, 2 colour) + "no extra object"; cluttered: 4 of 5 hold
    assert W.exact_partial_score(right.clauses, right.extra_objects) == 1.0
    assert W.exact_partial_score(cluttered.clauses, cluttered.extra_objects) == pytest.approx(4 / 5)


def test_exact_on_counting_and_missing_objects():
    three = {"tag": "counting", "include": [{"class": "square", "count": 3}],
             "exclude": [{"class": "square", "count": 4}], "prompt": "three squares"}  # fmt: skip
    squares = [W.SceneObject("square", "red", x, 12.0, 12.0) for x in (10.0, 32.0, 54.0)]
    assert W.prompt_object_count(three) == 3
    ok = W.judge(W.draw_scene(squares, 64), three)
    assert (ok.strict, ok.exact, ok.extra_objects) == (1.0, 1.0, 0)
    # a fourth object of ANOTHER class: no exclude clause covers it, so strict passes and exact fails
    plus_circle = W.judge(
        W.draw_scene(squares + [W.SceneObject("circle", "red", 32.0, 48.0, 14.0)], 64), three
    )
    assert (plus_circle.strict, plus_circle.exact, plus_circle.extra_objects) == (1.0, 0.0, 1)
    # two squares: strict fails (count), exact with it; extra_objects is negative
    short = W.judge(W.draw_scene(squares[:2], 64), three)
    assert (short.strict, short.exact, short.extra_objects) == (0.0, 0.0, -1)


def test_exact_equals_strict_on_ground_truth_renders():
    for meta, seed in (W.sample_item("test", 5, i) for i in range(60)):
        result = W.judge(W.render(meta, 32, seed), meta)
        assert result.exact == result.strict == 1.0 and result.extra_objects == 0
