"""The `cosmos_reason1` reward: physical plausibility of a clip from Cosmos-Reason1-7B-Reward (a Qwen2.5-VL-7B),
computed as Cosmos-RL's reward service does.

Protocol (Cosmos-RL's `cosmos_reason1` handler):
1. frames: uint8 `round(255 x)`; every `interval`-th frame with `interval = max(1, (T - 1) // 160 + 1)` (at most
   160 frames), sampled fps = `video_fps / interval`; the last frame dropped when the count is odd;
2. size: `smart_resize(H, W, 28, min_pixels = 16 * 28^2 * 2, max_pixels = 9216 * 28^2 * 2 // n)` (a budget of
   9216 visual tokens per clip), each frame resized by PIL's bicubic filter;
3. chat: the system prompt below (the one the reward model was trained with), then one user turn: the video (at
   the sampled fps, which sets Qwen2.5-VL's temporal positions: `second_per_grid_ts = 2 / fps`) and a text. Cosmos-RL
   sends the request's prompt (the generation caption) as that text (`ask = "caption"`, the default); `ask =
   "question"` sends the model card's question "Does the video contain any anomalies or artifacts?" instead;
4. the next-token logits after the generation prompt at the first tokens of "Yes" and "No":
   `no_score = softmax([yes_logit, no_logit])[1]`, the probability that the clip has no anomaly.

Keys: `no_score` (default), `yes_logit`, `no_logit`, and `good` (1.0 where Cosmos-RL's `prediction` is "Good",
i.e. `yes_logit <= no_logit`, else 0.0; the service cannot return strings).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from sanarl.errors import ConfigError
from sanarl.rewards.base import RewardInputError
from sanarl.rewards.model_reward import parse_batch_size
from sanarl.rewards.scorers.vlm import qwen, vision

REASON1_MODEL = "nvidia/Cosmos-Reason1-7B-Reward"
SYSTEM_PROMPT = "\n".join(
    (
        "You are a helpful video analyzer. The goal is to identify artifacts and anomalies in the video. Watch "
        "carefully and focus on the following aspects:",
        "",
        "* Gravity (e.g. a ball cannot fly in the air)",
        "* Collision (e.g. two objects cannot penetrate each other)",
        "* Object interaction (e.g. an object cannot move without any apparent reason)",
        "* Fluid dynamics (e.g. a liquid cannot flow through a solid object)",
        "* Object permanence (e.g. an object cannot suddenly appear, disappear or change its shape)",
        "* Common sense (e.g. an object should be functional and useful)",
        "* Cause-and-effect (e.g. a door cannot open without any apparent reason)",
        "* Human motion (e.g. a person's body cannot morph and the joints cannot move in impossible ways)",
        "",
        "Here are some examples of non-artifacts you should not include in your analysis:",
        "",
        "* Being an animated video, such as a cartoon, does not automatically make it artifacts.",
        "* The video has no sound. Do not make any conclusions based on sound.",
        "* Ignore any lighting, shadows, blurring, and camera effects.",
        "* Avoid judging based on overall impression, artistic style, or background elements.",
        "",
        'Begin your response with a single word: "Yes" or "No".',
    )
)
"""The system prompt Cosmos-Reason1-7B-Reward was trained with."""
QUESTION = "Does the video contain any anomalies or artifacts?"
ASK = ("caption", "question")
TEMPORAL_PATCH = 2
MAX_FRAMES = 160
TARGET_TOKENS = 9216
MIN_PIXELS = 16 * 28 * 28 * TEMPORAL_PATCH
MAX_PIXELS = TARGET_TOKENS * 28 * 28 * TEMPORAL_PATCH


def sample_frames(total: int, video_fps: float) -> tuple[list[int], float]:
    """(indices of the frames kept, their fps): every `interval`-th frame, an even count (see the module doc)."""
    interval = max(1, (total - 1) // MAX_FRAMES + 1)
    indices = list(range(0, total, interval))
    if len(indices) % TEMPORAL_PATCH:
        indices = indices[: -(len(indices) % TEMPORAL_PATCH)]
    return indices, video_fps / interval


def frame_size(height: int, width: int, frames: int) -> tuple[int, int]:
    """Frame size under the clip's 9216-token budget: `smart_resize` with `max_pixels // frames` per frame."""
    return vision.smart_resize(height, width, 28, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS // frames)


def pil_resize(frames: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """uint8 frames `[T, 3, H, W]` -> float `[T, 3, height, width]` in [0, 255] through PIL's bicubic resize."""
    from PIL import Image

    out = []
    for frame in frames.permute(0, 2, 3, 1).numpy():
        image = Image.fromarray(frame).resize((width, height), resample=Image.Resampling.BICUBIC)
        out.append(torch.from_numpy(np.asarray(image).copy()))
    return torch.stack(out).permute(0, 3, 1, 2).float()


def yes_no_scores(yes_logit: torch.Tensor, no_logit: torch.Tensor) -> dict[str, torch.Tensor]:
    """The keys from the two next-token logits `[B]`: `no_score = softmax([yes, no])[1]`, `good = yes <= no`."""
    pair = torch.stack([yes_logit.float(), no_logit.float()], dim=-1)
    return {
        "no_score": torch.softmax(pair, dim=-1)[..., 1],
        "yes_logit": yes_logit.float(),
        "no_logit": no_logit.float(),
        "good": (yes_logit <= no_logit).float(),
    }


class CosmosReason1(qwen.VideoVlmReward):
    """Cosmos-Reason1's "no anomaly" probability of whole clips `[B, 3, T, H, W]` in [0, 1] (see the module doc).

    Args:
        model: Cosmos-Reason1 reward model directory or Hub id.
        ask: "caption" (Cosmos-RL: the request's prompt is the user text) | "question" (the model card's question).
        video_fps: frame rate of clips whose metadata carries none (`video_info.video_fps` / `video_fps`).
        device, dtype (auto = bfloat16 on GPU, float32 on CPU), batch_size (clips per forward pass).
    """

    name = "cosmos_reason1"
    keys = ("no_score", "yes_logit", "no_logit", "good")
    default_key = "no_score"

    def __init__(
        self,
        model: str = REASON1_MODEL,
        ask: str = "caption",
        video_fps: float = 16.0,
        device: str | torch.device | None = None,
        dtype: str = "auto",
        batch_size: int = 1,
    ) -> None:
        super().__init__(device, dtype, parse_batch_size(batch_size, self.name))
        if ask not in ASK:
            raise ConfigError(f"reward {self.name!r}: option ask={ask!r} must be one of {ASK}.")
        if isinstance(video_fps, bool) or not isinstance(video_fps, int | float) or not video_fps > 0:
            raise ConfigError(
                f"reward {self.name!r}: option video_fps={video_fps!r} must be a positive number."
            )
        self.model_name, self.ask, self.video_fps = str(model), ask, float(video_fps)

    def check_weights(self) -> Any:
        """The model directory (WeightsError naming the id when missing), without loading it."""
        qwen.require_vlm_packages(self.name)
        return qwen.resolve_model_dir(self.name, "model", self.model_name)

    def _load(self) -> None:
        directory = self.check_weights()
        self.processor = qwen.load_processor(directory, self.name, padding_side="right")
        self.model = qwen.load_vlm(directory, self.device, self.model_dtype(), self.name)
        tokenizer = self.processor.tokenizer
        self.yes_id = tokenizer.encode("Yes", add_special_tokens=False)[0]
        self.no_id = tokenizer.encode("No", add_special_tokens=False)[0]

    def clip_inputs(self, clip: torch.Tensor, row: dict[str, Any]) -> tuple[torch.Tensor, float]:
        """One clip `[3, T, H, W]` in [0, 1] -> (frames float `[n, 3, h, w]` in [0, 255], their fps)."""
        frames = vision.to_uint8_frames(clip)
        indices, fps = sample_frames(frames.shape[0], qwen.video_fps(row, self.video_fps))
        if not indices:
            raise RewardInputError(f"reward {self.name!r} needs clips of at least {TEMPORAL_PATCH} frames.")
        frames = frames[indices]
        return pil_resize(frames, *frame_size(frames.shape[2], frames.shape[3], len(indices))), fps

    def texts(self, prompts: list[str]) -> list[str]:
        """The chat texts (system prompt, video + user text, generation prompt) of B captions."""
        chats = [
            [
                {"role": "system", "content": SYSTEM_PROMPT},
                {
                    "role": "user",
                    "content": [
                        {"type": "video"},
                        {"type": "text", "text": p if self.ask == "caption" else QUESTION},
                    ],
                },
            ]
            for p in prompts
        ]
        return self.processor.apply_chat_template(chats, tokenize=False, add_generation_prompt=True)

    def _score(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> dict[str, torch.Tensor]:
        """Clips `[B, 3, T, H, W]` in [0, 1] -> `{no_score, yes_logit, no_logit, good}`, each `[B]`."""
        yes, no = [], []
        for start in range(0, len(prompts), self.batch_size):
            stop = start + self.batch_size
            inputs = [
                self.clip_inputs(c, r) for c, r in zip(images[start:stop], metadata[start:stop], strict=True)
            ]
            batch = qwen.encode(
                self.processor, self.texts(prompts[start:stop]), [frames for frames, _ in inputs]
            )
            if "second_per_grid_ts" in batch or self.model.config.model_type == "qwen2_5_vl":
                batch["second_per_grid_ts"] = torch.tensor([TEMPORAL_PATCH / fps for _, fps in inputs])
            batch = qwen.to_device(batch, self.device)
            hidden = self.model.model(**batch).last_hidden_state
            last = batch["attention_mask"].sum(dim=1) - 1  # right padding: the last real token of each row
            logits = self.model.lm_head(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])
            yes.append(logits[:, self.yes_id].float().cpu())
            no.append(logits[:, self.no_id].float().cpu())
        return yes_no_scores(torch.cat(yes), torch.cat(no))
