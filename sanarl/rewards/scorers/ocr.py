"""The `ocr` reward: does the image show the text the prompt asks for? (Flow-GRPO's OCR reward, Liu et al. 2025.)

    target = the first double-quoted span of the prompt (or metadata["target"], which the ocr prompt set fills in)
    rec    = every text line the OCR engine reads in the image, concatenated in reading order
    both normalised: lower-cased, all whitespace removed
    d      = 0 if target occurs inside rec, else Levenshtein(rec, target)
    ocr    = 1 - min(d, len(target)) / len(target)                                  in [0, 1]

The normalisation and the substring rule follow the public Flow-GRPO / DiffusionNFT OCR reward (a sign that shows
the target among other words is not penalised; unrelated extra characters cost at most the target length).

Engine: RapidOCR (`pip install rapidocr-onnxruntime`, PP-OCRv4 detection + recognition as ONNX models shipped inside
the wheel, so it runs offline on CPU with onnxruntime). Lines below the engine's text confidence (`text_score`,
0.5) are dropped by the engine. The engine reads uint8 BGR pixels (its OpenCV convention): a `Uint8Reward`, it
judges the `round(255 x)` pixels, those the reward service receives as they are. Keys: `ocr`.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import torch

from sanarl.errors import ConfigError
from sanarl.rewards.base import RewardInputError, Uint8Reward

QUOTED = re.compile(r'"([^"]*)"')
"""The first double-quoted span (same pattern as the ocr prompt set's `target`)."""
INSTALL = "pip install 'sanarl[ocr]' (rapidocr-onnxruntime)"


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions, each cost 1) by the two-row dynamic programme."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i]
        for j, char_b in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def normalise(text: str) -> str:
    """Lower-case and remove all whitespace ("Eat Here" -> "eathere")."""
    return "".join(text.split()).lower()


def ocr_score(recognised: str, target: str) -> float:
    """`1 - min(d, len) / len` on normalised strings, d = 0 when the target occurs in the recognised text."""
    rec, want = normalise(recognised), normalise(target)
    if not want:
        raise ValueError("the OCR target is empty after removing whitespace")
    distance = 0 if want in rec else levenshtein(rec, want)
    return 1.0 - min(distance, len(want)) / len(want)


def target_of(prompt: str, metadata: dict[str, Any]) -> str:
    """The text to render: `metadata["target"]` when given, else the first "..." span of the prompt.

    Raises RewardInputError (naming the prompt) when there is none or it is blank.
    """
    target = metadata.get("target")
    if target is None and "target" not in metadata:
        match = QUOTED.search(prompt)
        target = match.group(1) if match else None
    if not isinstance(target, str) or not normalise(target):
        raise RewardInputError(
            f"reward 'ocr' needs the text to render in double quotes in the prompt (e.g. 'a sign saying \"Open\"'), "
            f"or a non-empty metadata['target']; prompt {prompt!r} has none. Use the ocr prompt set, quote the "
            "text in your prompts, or choose another reward."
        )
    return target


class OCRReward(Uint8Reward):
    """OCR accuracy of the quoted text of each prompt (see the module doc).

    Args:
        text_score: the engine's minimum confidence for a recognised line (RapidOCR default 0.5).
        det_limit_side_len, det_limit_type: the detector's input scaling (RapidOCR defaults 736, "min": the shorter
            side is scaled to 736 px, up or down; "max" scales the longer side down to the limit only). Small images
            upscaled to 736 px cost seconds on a CPU; "max" with the image size avoids that.
        threads: onnxruntime intra-op threads (-1 = the engine's default, all cores).
        device: accepted for a uniform interface; the engine runs on the CPU.
    """

    name = "ocr"
    keys = ("ocr",)
    default_key = "ocr"

    def __init__(
        self,
        text_score: float = 0.5,
        det_limit_side_len: int = 736,
        det_limit_type: str = "min",
        threads: int = -1,
        device: str | None = None,
    ) -> None:
        super().__init__()
        if det_limit_type not in ("min", "max"):
            raise ConfigError(
                f"reward 'ocr': option det_limit_type={det_limit_type!r} must be 'min' or 'max'."
            )
        if (
            isinstance(det_limit_side_len, bool)
            or not isinstance(det_limit_side_len, int)
            or det_limit_side_len < 32
        ):
            raise ConfigError(
                f"reward 'ocr': option det_limit_side_len={det_limit_side_len!r} must be an int >= 32."
            )
        self.det = {"det_limit_side_len": det_limit_side_len, "det_limit_type": det_limit_type}
        if isinstance(threads, bool) or not isinstance(threads, int) or (threads < 1 and threads != -1):
            raise ConfigError(f"reward 'ocr': option threads={threads!r} must be -1 (all cores) or >= 1.")
        if not isinstance(text_score, int | float) or not 0.0 <= float(text_score) <= 1.0:
            raise ConfigError(f"reward 'ocr': option text_score={text_score!r} must be a number in [0, 1].")
        self.text_score = float(text_score)
        self.threads = threads
        self.engine: Any = None
        self._engine_lock = threading.Lock()

    def _load(self) -> None:
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"reward 'ocr' needs the OCR engine RapidOCR ({exc}); install it with {INSTALL}."
            ) from None
        options: dict[str, Any] = {"text_score": self.text_score, **self.det}
        if self.threads != -1:
            options.update(intra_op_num_threads=self.threads, inter_op_num_threads=1)
        self.engine = RapidOCR(**options)

    def read(self, image_hwc: Any) -> str:
        """Text lines the engine reads in one uint8 RGB `[H, W, 3]` image, concatenated in reading order."""
        bgr = image_hwc[..., ::-1].copy()
        with self._engine_lock:  # onnxruntime sessions are shared; keep one call at a time
            result, _ = self.engine(bgr)
        return "".join(line[1] for line in result or [])

    def _score_uint8(
        self, pixels: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> dict[str, torch.Tensor]:
        """uint8 pixels `[B, 3, H, W]` and B prompts -> `{ocr: [B]}`."""
        targets = [target_of(p, m) for p, m in zip(prompts, metadata, strict=True)]
        arrays = pixels.permute(0, 2, 3, 1).cpu().numpy()
        scores = [ocr_score(self.read(a), t) for a, t in zip(arrays, targets, strict=True)]
        return {"ocr": torch.tensor(scores, dtype=torch.float32)}
