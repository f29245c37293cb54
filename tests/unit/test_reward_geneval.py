"""The `geneval` reward: GenEval's rules on hand-built detections (every tag, passing and failing), the colour crops,
and a tiny random torchvision detector + tiny CLIP saved to disk and loaded through the real loader."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sanarl.errors import ConfigError, WeightsError
from sanarl.rewards import build_reward, known_rewards
from sanarl.rewards.base import RewardInputError
from sanarl.rewards.scorers import geneval_rules as rules
from sanarl.rewards.scorers.geneval import COCO_IDS, LABELS, ColorClassifier, GenEvalReward
from sanarl.rewards.scorers.geneval_rules import Detection, Thresholds, box_iou, judge, relative_position

pytestmark = pytest.mark.usefixtures("network")  # tests/conftest.py: the network is cut

TH = Thresholds()


def det(label: str, box, score: float = 0.95, mask=None) -> Detection:
    return Detection(tuple(float(v) for v in box), score, label, mask)


def colors_by_box(table: dict):
    """A fake colour classifier: the colour is looked up by the object's box (default "white")."""
    return lambda cls, objs: [table.get(o.box, "white") for o in objs]


NO_COLOR = colors_by_box({})


# ---------------------------------------------------------------- geometry by hand


def test_iou_and_relative_position_by_hand() -> None:
    assert box_iou((0, 0, 9, 9), (5, 5, 14, 14)) == pytest.approx(25 / 175)  # inclusive pixels: 10x10 boxes
    assert box_iou((0, 0, 9, 9), (20, 20, 29, 29)) == 0.0
    # centres 30 apart on x, threshold shrinks by 0.1 * (10 + 10) = 2: dx = 28 / 30
    assert relative_position((30, 0, 40, 10), (0, 0, 10, 10)) == {"right of"}
    assert relative_position((0, 0, 10, 10), (30, 0, 40, 10)) == {"left of"}
    assert relative_position((0, 0, 10, 10), (0, 30, 10, 40)) == {"above"}  # y grows downwards
    # diagonal: offset (10, 10), shrunk by 0.4 each -> 9.6 / 14.14 = 0.68 on both axes
    assert relative_position((10, 10, 12, 12), (0, 0, 2, 2)) == {"right of", "below"}
    # offset 1 < 0.1 * 20: within the threshold -> no relation at all
    assert relative_position((0, 0, 10, 10), (1, 0, 11, 10)) == set()
    # offset (6, 1) of 10-px boxes: shrunk (4, 0) -> dx = 4 / 6.08 = 0.66 > 0.5, dy = 0
    assert relative_position((6, 1, 16, 11), (0, 0, 10, 10)) == {"right of"}


def test_selection_thresholds_cap_and_optional_nms() -> None:
    dets = [det("dog", (i, 0, i + 10, 10), score=0.5 + i / 100) for i in range(20)]
    dets += [det("cat", (0, 0, 5, 5), score=0.3), det("cat", (0, 0, 5, 5), score=0.31)]
    picked = rules.select_objects(dets, "single_object", TH)
    assert len(picked["dog"]) == 16 and picked["dog"][0].score == pytest.approx(
        0.69
    )  # best first, capped at 16
    assert [d.score for d in picked["cat"]] == [0.31]  # > 0.3 strictly
    assert "dog" not in rules.select_objects(dets, "counting", TH)  # counting needs > 0.9
    nms = rules.select_objects(dets, "x", Thresholds(max_overlap=0.5))
    # 11-px boxes shifted by k overlap 11 (11 - k) px: IoU < 0.5 iff k >= 4, so x0 = 19, 15, 11, 7 survive
    assert [d.box[0] for d in nms["dog"]] == [19.0, 15.0, 11.0, 7.0]


# ---------------------------------------------------------------- every tag, passing and failing


def test_single_object_and_two_object() -> None:
    row = {"tag": "single_object", "include": [{"class": "bowl", "count": 1}]}
    assert judge([det("bowl", (0, 0, 9, 9), 0.5)], row, NO_COLOR, TH).strict == 1.0
    low = judge([det("bowl", (0, 0, 9, 9), 0.25)], row, NO_COLOR, TH)
    assert (low.strict, low.partial, low.reasons) == (0.0, 0.0, ("expected bowl>=1, found 0",))
    two = {"tag": "two_object", "include": [{"class": "bowl", "count": 1}, {"class": "skis", "count": 1}]}
    half = judge([det("bowl", (0, 0, 9, 9)), det("dog", (9, 9, 19, 19))], two, NO_COLOR, TH)
    assert (half.strict, half.partial) == (0.0, 0.5)
    assert half.clauses == {"include:0:bowl": True, "include:1:skis": False}


def test_counting_with_its_threshold_and_exclude() -> None:
    row = {
        "tag": "counting",
        "include": [{"class": "wine glass", "count": 2}],
        "exclude": [{"class": "wine glass", "count": 3}],
    }
    glasses = [det("wine glass", (10 * i, 0, 10 * i + 8, 8), s) for i, s in enumerate((0.95, 0.92, 0.85))]
    assert judge(glasses, row, NO_COLOR, TH).strict == 1.0  # the 0.85 one is below the counting threshold 0.9
    three = judge(glasses[:2] + [det("wine glass", (50, 0, 58, 8), 0.91)], row, NO_COLOR, TH)
    assert (three.strict, three.partial) == (0.0, 0.5) and three.reasons == (
        "expected wine glass<3, found 3",
    )
    one = judge(glasses[:1], row, NO_COLOR, TH)
    assert (one.strict, one.partial) == (0.0, 0.5)  # include unmet, exclude met


def test_colors_counts_only_the_first_count_objects() -> None:
    row = {"tag": "colors", "include": [{"class": "cup", "count": 1, "color": "purple"}]}
    best, second = det("cup", (0, 0, 9, 9), 0.9), det("cup", (20, 0, 29, 9), 0.8)
    assert judge([best, second], row, colors_by_box({best.box: "purple"}), TH).strict == 1.0
    wrong = judge(
        [best, second], row, colors_by_box({second.box: "purple"}), TH
    )  # only the best cup is checked
    assert wrong.strict == 0.0 and "expected purple cup>=1" in wrong.reasons[0]


def test_position_needs_a_met_target_and_the_relation() -> None:
    row = {
        "tag": "position",
        "include": [
            {"class": "laptop", "count": 1},
            {"class": "cow", "count": 1, "position": ["right of", 0]},
        ],
    }
    laptop = det("laptop", (0, 0, 10, 10))
    assert judge([laptop, det("cow", (30, 0, 40, 10))], row, NO_COLOR, TH).strict == 1.0
    left = judge([laptop, det("cow", (-30, 0, -20, 10))], row, NO_COLOR, TH)
    assert (left.strict, left.partial) == (0.0, 0.5) and "found ['left of']" in left.reasons[0]
    close = judge([laptop, det("cow", (1, 0, 11, 10))], row, NO_COLOR, TH)  # within the 0.1 threshold
    assert close.strict == 0.0 and "no relation" in close.reasons[0]
    orphan = judge([det("cow", (30, 0, 40, 10))], row, NO_COLOR, TH)
    assert orphan.partial == 0.0 and orphan.reasons[1] == "no target for cow to be right of"


def test_color_attr_partial_credit() -> None:
    row = {
        "tag": "color_attr",
        "include": [
            {"class": "handbag", "count": 1, "color": "pink"},
            {"class": "scissors", "count": 1, "color": "black"},
        ],
    }
    bag, scissors = det("handbag", (0, 0, 9, 9)), det("scissors", (20, 0, 29, 9))
    good = judge([bag, scissors], row, colors_by_box({bag.box: "pink", scissors.box: "black"}), TH)
    assert (good.strict, good.partial) == (1.0, 1.0)
    swapped = judge([bag, scissors], row, colors_by_box({bag.box: "black", scissors.box: "pink"}), TH)
    assert (swapped.strict, swapped.partial) == (0.0, 0.0)
    half = judge([bag, scissors], row, colors_by_box({bag.box: "pink"}), TH)
    assert (half.strict, half.partial) == (0.0, 0.5)


def test_metadata_checks_name_the_prompt() -> None:
    with pytest.raises(RewardInputError, match="needs GenEval metadata for prompt 'a cat'"):
        rules.check_metadata("a cat", {})
    with pytest.raises(RewardInputError, match="malformed"):
        rules.check_metadata("a cat", {"tag": "colors", "include": [{"class": "cat", "count": 0}]})
    with pytest.raises(RewardInputError, match="unknown colour or relation \\['mauve'\\]"):
        rules.check_metadata(
            "a cat", {"tag": "colors", "include": [{"class": "cat", "count": 1, "color": "mauve"}]}
        )


# ---------------------------------------------------------------- colour crops


def test_color_classifier_greys_the_background_and_crops_the_box() -> None:
    seen: list[torch.Tensor] = []
    # the fake encoder's text embedding of a colour is one-hot on its index (mean of 3 identical templates)
    encoder = SimpleNamespace(
        text_features=lambda texts: torch.nn.functional.one_hot(
            torch.tensor([rules.COLORS.index(t.split()[4].split("-")[0]) for t in texts]), 10
        ).float(),
        image_features=lambda px: (
            seen.append(px) or torch.nn.functional.one_hot(torch.tensor([4]), 10).float()
        ),
    )
    image = np.zeros((8, 8, 3), np.uint8)
    image[2:6, 2:6] = 200
    mask = np.zeros((8, 8), bool)
    mask[3:5, 3:5] = True
    colors = ColorClassifier(encoder)(
        image, "cup", [det("cup", (2, 2, 6, 6), mask=mask), det("cup", (0, 0, 2, 1))]
    )
    assert colors == ["blue", "blue"]  # index 4
    crop = (seen[0][0] * 255).round().permute(1, 2, 0).numpy()
    assert crop.shape == (4, 4, 3) and crop[1, 1, 0] == 200 and crop[0, 0, 0] == 153  # #999 outside the mask
    assert tuple(seen[1].shape) == (1, 3, 1, 2)  # no mask: the raw crop rows 0..1, columns 0..2


# ---------------------------------------------------------------- the model path (tiny detector and CLIP)


def tiny_clip_dir(path) -> None:
    transformers = pytest.importorskip("transformers")
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = {c: i for i, c in enumerate(letters)}
    vocab.update({c + "</w>": 26 + i for i, c in enumerate(letters)})
    vocab.update({"<|startoftext|>": 52, "<|endoftext|>": 53})
    tokenizer = transformers.CLIPTokenizer(vocab=vocab, merges=[], model_max_length=32)
    processor = transformers.CLIPProcessor(
        image_processor=transformers.CLIPImageProcessor(
            size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}
        ),
        tokenizer=tokenizer,
    )
    common = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    text = dict(
        common, vocab_size=54, max_position_embeddings=32, bos_token_id=52, eos_token_id=53, pad_token_id=53
    )
    torch.manual_seed(3)
    config = transformers.CLIPConfig(
        text_config=text, vision_config=dict(common, image_size=16, patch_size=8), projection_dim=16
    )
    transformers.CLIPModel(config).save_pretrained(path)
    processor.save_pretrained(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    detection = pytest.importorskip("torchvision.models.detection")
    root = tmp_path_factory.mktemp("tiny-geneval")
    torch.manual_seed(0)
    model = detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, num_classes=91
    )
    predictor = model.roi_heads.box_predictor.cls_score
    with torch.no_grad():  # every proposal becomes a "dog" (COCO id 18) with p = e^8 / (e^8 + 90) = 0.97
        predictor.weight.zero_()
        predictor.bias.zero_()
        predictor.bias[18] = 8.0
    (root / "geneval").mkdir()
    torch.save(model.state_dict(), root / "geneval" / "detector.pth")
    tiny_clip_dir(root / "clip")
    return SimpleNamespace(ckpts=root, clip=str(root / "clip"))


def make(tiny, **options) -> GenEvalReward:
    path = str(tiny.ckpts / "geneval" / "detector.pth")
    options = {
        "detector": "fasterrcnn_mobilenet_v3_large_320_fpn",
        "clip_model": tiny.clip,
        "min_size": 64,
        "max_size": 64,
        "detector_path": path,
        **options,
    }
    return GenEvalReward(**options)


ROWS = [
    {"tag": "counting", "include": [{"class": "dog", "count": 2}], "exclude": [{"class": "dog", "count": 3}]},
    {"tag": "colors", "include": [{"class": "dog", "count": 1, "color": "red"}]},
    {"tag": "two_object", "include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1}]},
    {
        "tag": "position",
        "include": [{"class": "dog", "count": 1}, {"class": "dog", "count": 1, "position": ["left of", 0]}],
    },
]


def test_coco_label_map() -> None:
    assert len(COCO_IDS) == 80 and COCO_IDS[-1] == 90
    assert (LABELS[1], LABELS[18], LABELS[64], LABELS[74], LABELS[90]) == (
        "person", "dog", "potted plant", "computer mouse", "toothbrush",
    )  # fmt: skip


def test_detector_output_conversion_thresholds_masks_and_drops_unused_ids() -> None:
    from sanarl.rewards.scorers.geneval import TorchvisionDetector

    masks = torch.zeros(3, 1, 4, 4)
    masks[0, 0, 1:3, 1:3] = 0.7
    masks[0, 0, 0, 0] = 0.5  # not > 0.5
    result = {
        "boxes": torch.tensor([[1.0, 1.0, 3.0, 3.0], [0.0, 0.0, 4.0, 4.0], [0.0, 0.0, 1.0, 1.0]]),
        "scores": torch.tensor([0.9, 0.8, 0.7]),
        "labels": torch.tensor([18, 12, 90]),  # dog, an unused COCO id, toothbrush
        "masks": masks,
    }
    dets = TorchvisionDetector._detections(result)
    assert [(d.label, d.score, d.box) for d in dets] == [
        ("dog", pytest.approx(0.9), (1.0, 1.0, 3.0, 3.0)),
        ("toothbrush", pytest.approx(0.7), (0.0, 0.0, 1.0, 1.0)),
    ]
    assert dets[0].mask.sum() == 4 and not dets[0].mask[0, 0] and dets[1].mask.sum() == 0
    no_masks = TorchvisionDetector._detections({k: v for k, v in result.items() if k != "masks"})
    assert all(d.mask is None for d in no_masks)


def test_tiny_detector_through_the_loader_matches_the_rules_and_batches(tiny) -> None:
    images = torch.rand(4, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    prompts = ["two dogs", "a red dog", "a dog and a cat", "a dog left of a dog"]
    reward = make(tiny, batch_size=4)
    scores = reward.score(images, prompts, ROWS)
    dets = reward.detector(
        (images * 255).round() / 255
    )  # GenEval judges saved pixels: the detector sees them
    assert all(d and all(x.label == "dog" and x.score > 0.9 for x in d) for d in dets)
    arrays = (images * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    for i, row in enumerate(ROWS):
        expected = judge(dets[i], row, lambda c, o, a=arrays[i]: reward.colors(a, c, o), TH)
        assert (scores["partial"][i].item(), scores["strict"][i].item()) == (
            expected.partial,
            expected.strict,
        )
    assert scores["partial"][2].item() == 0.5  # a dog, never a cat
    single = make(tiny, batch_size=1)
    alone = [single.score(images[i : i + 1], prompts[i : i + 1], ROWS[i : i + 1]) for i in range(4)]
    for key in ("partial", "strict"):
        assert scores[key].tolist() == [a[key].item() for a in alone]
    assert torch.equal(reward.score(images, prompts, ROWS)["partial"], scores["partial"])


def test_uint8_pixels_score_as_their_floats(tiny) -> None:
    """`score_uint8` (the reward service's call, pixels as received) equals `score` of `x / 255` exactly."""
    generator = torch.Generator().manual_seed(1)
    pixels = torch.randint(0, 256, (4, 64, 64, 3), dtype=torch.uint8, generator=generator).permute(0, 3, 1, 2)
    prompts = ["two dogs", "a red dog", "a dog and a cat", "a dog left of a dog"]
    reward = make(tiny, batch_size=4)
    direct = reward.score_uint8(pixels, prompts, ROWS)
    floats = reward.score(pixels.float() / 255.0, prompts, ROWS)
    assert all(torch.equal(direct[key], floats[key]) for key in ("partial", "strict"))
    assert direct["partial"][2].item() == 0.5  # a dog, never a cat
    with pytest.raises(RewardInputError, match="needs GenEval metadata for prompt 'two dogs'"):
        reward.score_uint8(pixels[:1], prompts[:1])


def test_missing_metadata_is_an_input_error_before_any_load(tmp_path) -> None:
    reward = GenEvalReward(detector_path=str(tmp_path / "absent.pth"), clip_model=str(tmp_path / "absent"))
    with pytest.raises(RewardInputError, match="needs GenEval metadata for prompt 'a cat'"):
        reward.score(torch.rand(1, 3, 16, 16), ["a cat"])
    with pytest.raises(RewardInputError, match="prompt 'a dog'"):
        reward.score(torch.rand(2, 3, 16, 16), ["a cat", "a dog"], [ROWS[0], {"tag": "x"}])


def test_missing_weights_name_detector_and_clip(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SANARL_REWARD_CKPTS", raising=False)
    with pytest.raises(WeightsError) as err:
        GenEvalReward(clip_model=str(tmp_path / "no-clip")).score(
            torch.rand(1, 3, 16, 16), ["dogs"], ROWS[:1]
        )
    msg = str(err.value)
    assert "detector_path 'reward_ckpts/geneval/detector.pth': no such file" in msg
    assert f"clip_model '{tmp_path / 'no-clip'}'" in msg and "maskrcnn_resnet50_fpn" in msg


def test_registered_and_options_checked(tiny, tmp_path) -> None:
    assert "geneval" in known_rewards()
    assert isinstance(build_reward("geneval", threshold=0.5), GenEvalReward)
    with pytest.raises(ConfigError, match="detector='yolo'"):
        build_reward("geneval", detector="yolo")
    with pytest.raises(ConfigError, match="unknown options \\['treshold'\\]"):
        GenEvalReward(treshold=0.5)
    torch.save({"x": torch.zeros(1)}, tmp_path / "bad.pth")
    with pytest.raises(WeightsError, match="cannot load it into torchvision"):
        make(tiny, detector_path=str(tmp_path / "bad.pth")).setup("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_detector_and_clip_judge_like_the_cpu_ones(tiny) -> None:
    images = torch.rand(4, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    prompts = ["two dogs", "a red dog", "a dog and a cat", "a dog left of a dog"]
    reward = make(tiny, device="cuda")
    gpu = reward.score(images, prompts, ROWS)
    assert next(reward.detector.model.parameters()).device.type == "cuda"
    assert reward.colors.encoder.device.type == "cuda" and gpu["partial"].device.type == "cpu"
    dets = reward.detector(images)
    on_cpu = make(tiny)
    on_cpu.setup("cpu")
    cpu_dets = on_cpu.detector(images)
    for on_gpu, on_cpu in zip(dets, cpu_dets, strict=True):  # the strongest detection of each image agrees
        assert on_gpu[0].score == pytest.approx(on_cpu[0].score, abs=1e-3)
        assert on_gpu[0].box == pytest.approx(on_cpu[0].box, abs=0.05)
