"""The `geneval` reward: GenEval's object-focused judge (Ghosh et al. 2023) as a reward, with torchvision models.

Per image: a COCO detector finds objects -> GenEval's selection, counting, colour and relative-position rules
(`geneval_rules`, pure) judge them against the prompt's GenEval metadata -> keys
- `partial` (default): fraction of the row's include and exclude entries that are met, in [0, 1];
- `strict`: 1 iff all are met (GenEval's `correct`, its benchmark accuracy).

Pixels: GenEval judges saved image files, so the judge here sees the uint8 pixels `round(255 x)` (a `Uint8Reward`:
the detector gets them as `x / 255`, the colour classifier as uint8 crops), in-process and in the reward service
alike.

Metadata: the geneval prompt set forwards each row's `{"tag", "include", "exclude"}` (sanarl/data/datasets/prompts/geneval);
a prompt without it is a RewardInputError.

Detector (behind the small `Detector` interface: images -> per-image `Detection` lists): a torchvision COCO
Mask R-CNN (default `maskrcnn_resnet50_fpn`; Faster R-CNN variants work too, without masks) with 91 COCO category
ids, weights from `<reward_ckpts>/geneval/detector.pth` (`detector_path`), e.g. torchvision's
`MaskRCNN_ResNet50_FPN_Weights.COCO_V1` file. GenEval itself uses an mmdetection Mask2Former; the rules and
thresholds here are GenEval's (score > 0.3, > 0.9 for counting, 16 objects per class, no extra NMS), the detector is
torchvision's, so numbers track but do not equal the benchmark's.

Colour: as GenEval, each object is cut out (background outside its mask set to grey #999999, then cropped to its
box) and classified zero-shot by CLIP ViT-L/14 over GenEval's 10 colours, each colour's text embedding the
renormalised mean of "a photo of a {c} {class}", "a photo of a {c}-colored {class}", "a photo of a {c} object".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from sanarl.errors import ConfigError, WeightsError
from sanarl.rewards.base import Uint8Reward
from sanarl.rewards.clip_encoder import ClipEncoder
from sanarl.rewards.model_reward import ModelReward
from sanarl.rewards.scorers import geneval_rules as rules
from sanarl.rewards.weight_files import Missing, resolve_dirs, reward_ckpt_path
from sanarl.worlds.geneval_templates import COCO_CLASSES, COLORS

COCO_IDS: tuple[int, ...] = (
    *range(1, 12), *range(13, 26), 27, 28, *range(31, 45), *range(46, 66), 67, 70, *range(72, 83), *range(84, 91),
)  # fmt: skip
"""The 91-way COCO category id of each of the 80 classes (COCO_CLASSES order); the other ids are unused."""
LABELS: dict[int, str] = dict(zip(COCO_IDS, COCO_CLASSES, strict=True))
DETECTORS = (
    "maskrcnn_resnet50_fpn",
    "maskrcnn_resnet50_fpn_v2",
    "fasterrcnn_resnet50_fpn",
    "fasterrcnn_resnet50_fpn_v2",
    "fasterrcnn_mobilenet_v3_large_fpn",
    "fasterrcnn_mobilenet_v3_large_320_fpn",
)
"""torchvision COCO detectors the `detector` option accepts."""
COLOR_MODEL = "openai/clip-vit-large-patch14"
COLOR_TEMPLATES = ("a photo of a {c} {cls}", "a photo of a {c}-colored {cls}", "a photo of a {c} object")
BACKGROUND = 153  # GenEval's bgcolor "#999"


class Detector(Protocol):
    """Images `[B, 3, H, W]` in [0, 1] -> one list of `Detection` per image (boxes in pixels)."""

    def __call__(self, images: torch.Tensor) -> list[list[rules.Detection]]: ...


class TorchvisionDetector:
    """A torchvision COCO detector (eval, frozen, float32) on `device`; `min_size` / `max_size` are its resize."""

    def __init__(self, model: Any, device: torch.device, batch_size: int) -> None:
        self.model = model.to(device).eval().requires_grad_(False)
        self.device, self.batch_size = device, batch_size

    @classmethod
    def load(
        cls, arch: str, path: Path, device: torch.device, batch_size: int, **sizes: int
    ) -> TorchvisionDetector:
        """Build `arch` with 91 classes and no pretrained downloads, then load `path` strictly."""
        import torchvision.models.detection as detection

        model = getattr(detection, arch)(weights=None, weights_backbone=None, num_classes=91, **sizes)
        try:
            state: Any = torch.load(path, map_location="cpu", weights_only=True)
            if isinstance(state, Mapping) and isinstance(state.get("model"), Mapping):
                state = state["model"]
            model.load_state_dict(state, strict=True)
        except Exception as exc:
            raise WeightsError(
                f"{path}: cannot load it into torchvision {arch} with 91 COCO classes ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0]}); save that detector's COCO state dict there (see docs/rewards.md)."
            ) from None
        return cls(model, device, batch_size)

    def __call__(self, images: torch.Tensor) -> list[list[rules.Detection]]:
        out: list[list[rules.Detection]] = []
        for chunk in images.split(self.batch_size):
            for result in self.model(list(chunk.to(self.device, torch.float32))):
                out.append(self._detections(result))
        return out

    @staticmethod
    def _detections(result: Mapping[str, torch.Tensor]) -> list[rules.Detection]:
        boxes, scores, labels = (result[k].float().cpu() for k in ("boxes", "scores", "labels"))
        masks = result["masks"][:, 0].cpu() > 0.5 if "masks" in result else None
        dets = []
        for i, label in enumerate(labels.tolist()):
            if label in LABELS:
                mask = masks[i].numpy() if masks is not None else None
                box = tuple(float(v) for v in boxes[i])
                dets.append(rules.Detection(box, float(scores[i]), LABELS[label], mask))  # type: ignore[arg-type]
        return dets


class ColorClassifier:
    """GenEval's zero-shot colour classifier on a `ClipEncoder` (see the module doc); text classifiers cached."""

    def __init__(self, encoder: ClipEncoder) -> None:
        self.encoder = encoder
        self._classifiers: dict[str, torch.Tensor] = {}

    def classifier(self, classname: str) -> torch.Tensor:
        """`[10, D]` unit colour embeddings for `classname`."""
        if classname not in self._classifiers:
            rows = []
            for color in COLORS:
                texts = [t.format(c=color, cls=classname) for t in COLOR_TEMPLATES]
                rows.append(torch.nn.functional.normalize(self.encoder.text_features(texts).mean(0), dim=-1))
            self._classifiers[classname] = torch.stack(rows)
        return self._classifiers[classname]

    def __call__(self, image: np.ndarray, classname: str, objects: Sequence[rules.Detection]) -> list[str]:
        """Colour of each object of `classname` in the uint8 `[H, W, 3]` image."""
        clf = self.classifier(classname)
        colors = []
        for obj in objects:
            crop = image
            if obj.mask is not None:
                crop = np.where(obj.mask[..., None], image, np.uint8(BACKGROUND))
            x0, y0, x1, y1 = (int(round(v)) for v in obj.box)
            x0, y0 = min(max(x0, 0), image.shape[1] - 1), min(max(y0, 0), image.shape[0] - 1)
            crop = crop[y0 : max(y1, y0 + 1), x0 : max(x1, x0 + 1)]
            pixels = torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1)[None].float() / 255.0
            logits = self.encoder.image_features(pixels) @ clf.T
            colors.append(COLORS[int(logits.argmax(dim=-1))])
        return colors


class GenEvalReward(Uint8Reward, ModelReward):
    """GenEval partial / strict credit of each image against its prompt's GenEval metadata (see the module doc).

    Args:
        detector: torchvision detector builder name (one of DETECTORS).
        detector_path: its COCO weights; None = `<reward_ckpts>/geneval/detector.pth`.
        clip_model, clip_processor: CLIP for the colour classifier (Hub id or local directory, as for clipscore).
        device, dtype, batch_size: as for the CLIP rewards (the detector always runs in float32).
        min_size, max_size: the detector's input resize (torchvision defaults 800 / 1333).
        threshold, counting_threshold, max_objects, max_overlap, position_threshold: GenEval's options.
    """

    name = "geneval"
    keys = ("partial", "strict")
    default_key = "partial"

    def __init__(
        self,
        detector: str = DETECTORS[0],
        detector_path: str | None = None,
        clip_model: str = COLOR_MODEL,
        clip_processor: str | None = None,
        device: str | None = None,
        dtype: str = "float32",
        batch_size: int = 8,
        min_size: int = 800,
        max_size: int = 1333,
        **thresholds: Any,
    ) -> None:
        super().__init__(device, dtype, batch_size)
        if detector not in DETECTORS:
            raise ConfigError(
                f"reward 'geneval': option detector={detector!r} is not one of {list(DETECTORS)}."
            )
        try:
            self.thresholds = rules.Thresholds(**thresholds)
        except TypeError:
            known = list(rules.Thresholds.__dataclass_fields__)
            raise ConfigError(
                f"reward 'geneval': unknown options {sorted(thresholds)}; GenEval's are {known}."
            ) from None
        self.detector_name, self.detector_path = detector, detector_path
        self.clip_model, self.clip_processor = str(clip_model), str(clip_processor or clip_model)
        self.sizes = {"min_size": int(min_size), "max_size": int(max_size)}
        self.detector: Detector | None = None
        self.colors: ColorClassifier | None = None

    def detector_file(self) -> Path:
        """Where the detector weights are read from (see `detector_path`)."""
        return reward_ckpt_path(self.detector_path, Path("geneval", "detector.pth"))

    def check_weights(self) -> tuple[Path, dict[str, Path]]:
        """(detector file, CLIP directories), without loading; one WeightsError for everything missing."""
        path, missing = self.detector_file(), []
        if not path.is_file():
            fix = (
                f"Save the COCO state dict of torchvision's {self.detector_name} there (on a machine with internet: "
                "`torch.save(torchvision.models.detection.maskrcnn_resnet50_fpn(weights='DEFAULT').state_dict(), "
                f"'detector.pth')`) into {path.parent}/, or set $SANARL_REWARD_CKPTS, or pass detector_path=...."
            )
            missing.append(Missing("detector_path", str(path), "no such file", fix))
        wanted = {
            "clip_model": (self.clip_model, "model"),
            "clip_processor": (self.clip_processor, "processor"),
        }
        return path, resolve_dirs(self.name, wanted, missing)

    def _load(self) -> None:
        path, dirs = self.check_weights()
        encoder = ClipEncoder.load(
            dirs["clip_model"],
            dirs["clip_processor"],
            device=self.device,
            dtype=self.dtype,
            batch_size=self.batch_size,
        )
        self.detector = TorchvisionDetector.load(
            self.detector_name, path, self.device, self.batch_size, **self.sizes
        )
        self.colors = ColorClassifier(encoder)

    def check_rows(self, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]] | None) -> None:
        """RewardInputError naming the prompt whose GenEval metadata (one row per image, required) is missing or
        malformed: checked by both entry points before any model loads."""
        if metadata is None:
            rules.check_metadata(str(prompts[0]) if len(prompts) else "", {}, self.name)
        if isinstance(metadata, Sequence) and len(metadata) == len(prompts):
            for prompt, meta in zip(prompts, metadata, strict=True):
                rules.check_metadata(str(prompt), meta if isinstance(meta, Mapping) else {}, self.name)

    def verdicts(self, pixels: torch.Tensor, metadata: list[dict[str, Any]]) -> list[rules.Verdict]:
        """One `geneval_rules.Verdict` per uint8 image `[B, 3, H, W]` (any strides)."""
        assert self.detector is not None and self.colors is not None
        detections = self.detector(pixels.contiguous().float() / 255.0)  # x / 255, as `from_uint8`
        arrays = pixels.permute(0, 2, 3, 1).cpu().numpy()
        out = []
        for dets, array, meta in zip(detections, arrays, metadata, strict=True):
            color_of = lambda cls, objs, a=array: self.colors(a, cls, objs)  # noqa: E731
            out.append(rules.judge(dets, meta, color_of, self.thresholds))
        return out

    def _score_uint8(
        self, pixels: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> dict[str, torch.Tensor]:
        """uint8 pixels `[B, 3, H, W]`, B prompts, B GenEval rows -> `{partial, strict}`, each `[B]`."""
        for prompt, meta in zip(prompts, metadata, strict=True):
            rules.check_metadata(prompt, meta, self.name)
        verdicts = self.verdicts(pixels, metadata)
        return {
            "partial": torch.tensor([v.partial for v in verdicts], dtype=torch.float32),
            "strict": torch.tensor([v.strict for v in verdicts], dtype=torch.float32),
        }
