"""The `unified_reward` reward: pointwise 1-5 judging by UnifiedReward (Wang et al. 2025, "Unified Reward Model for
Multimodal Understanding and Generation"), in-process on transformers' Qwen2.5-VL or through an OpenAI-compatible
endpoint (vLLM / SGLang serving the model), as Cosmos-RL's reward service and DiffusionNFT run it.

Protocol (Cosmos-RL's `unified_reward` handler):
1. per image, one user turn: the image (PNG, base64 data URL `data:image;base64,...` for an endpoint), then the
   question (`QUESTIONS["flow_grpo"]`, the default, which Cosmos-RL and flow_grpo send, or UnifiedReward's own
   element-checking point-score prompt `QUESTIONS["elements"]`) with the caption;
2. greedy decoding (temperature 0, as flow_grpo's and DiffusionNFT's endpoint requests); in-process,
   `decoding = "generation_config"` decodes with the checkpoint's own generation config instead (what a plain
   transformers `generate` call does);
3. the first match of `Final Score:\\s*([1-5](?:\\.\\d+)?)` in the answer is the score; no match scores 0.0;
4. `unified_reward = score / 5`.

Mode: `endpoint_url` set -> POST `<endpoint_url>/chat/completions` (model `endpoint_model`, bearer
`endpoint_api_key`), `max_concurrency` requests at a time; empty -> the model `model` in-process (images sized by
qwen-vl-utils' defaults: `smart_resize(H, W, 28, 4 * 28^2, 16384 * 28^2)`, PIL bicubic; left padding, batched).

Keys: `unified_reward` (default), `unified_reward_raw` (the parsed 1-5 score, 0.0 when unparsed) and
`unified_reward_parsed` (1.0 when the answer held a score).
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sanarl.config.toml_dump import MASK
from sanarl.errors import ConfigError
from sanarl.rewards.model_reward import parse_batch_size
from sanarl.rewards.scorers.vlm import qwen, vision
from sanarl.rewards.scorers.vlm.reason1 import pil_resize

UNIFIED_MODEL = "CodeGoat24/UnifiedReward-qwen-7b"
ENDPOINT_MODEL = "UnifiedReward-7b-v1.5"
SCORE_PATTERN = re.compile(r"Final Score:\s*([1-5](?:\.\d+)?)")
MIN_PIXELS = 4 * 28 * 28
MAX_PIXELS = 16384 * 28 * 28

_CRITERIA = (
    "You are given a text caption and a generated image based on that caption. Your task is to evaluate this image "
    "based on two key criteria:\n1. Alignment with the Caption: Assess how well this image aligns with the provided "
    "caption. Consider the accuracy of depicted objects, their relationships, and attributes as described in the "
    "caption.\n2. Overall Image Quality: Examine the visual quality of this image, including clarity, detail "
    "preservation, color accuracy, and overall aesthetic appeal.\n"
)
QUESTIONS = {
    "flow_grpo": "<image>\n"
    + _CRITERIA
    + "Based on the above criteria, assign a score from 1 to 5 after 'Final "
    "Score:'.\nYour task is provided as follows:\nText Caption: [{prompt}]",
    "elements": _CRITERIA
    + "Extract key elements from the provided text caption, evaluate their presence in the "
    "generated image using the format: 'element (type): value' (where value=0 means not generated, and value=1 "
    "means generated), and assign a score from 1 to 5 after 'Final Score:'.\nYour task is provided as "
    "follows:\nText Caption: [{prompt}]",
}
"""The judging questions, byte for byte: Cosmos-RL's (from flow_grpo) and UnifiedReward's point-score prompt."""


def parse_score(answer: str) -> float | None:
    """The 1-5 score after the first `Final Score:` of `answer`, or None when there is none."""
    match = SCORE_PATTERN.search(answer or "")
    return float(match.group(1)) if match else None


def scores_of(answers: list[str]) -> dict[str, torch.Tensor]:
    """The keys from B answers: unparsed answers score 0.0 (as Cosmos-RL does) and are flagged in `_parsed`."""
    parsed = [parse_score(a) for a in answers]
    raw = torch.tensor([p if p is not None else 0.0 for p in parsed], dtype=torch.float32)
    return {
        "unified_reward": raw / 5.0,
        "unified_reward_raw": raw,
        "unified_reward_parsed": torch.tensor([p is not None for p in parsed], dtype=torch.float32),
    }


def png_data_url(image: np.ndarray) -> str:
    """uint8 `[H, W, 3]` -> `data:image;base64,<PNG>` (the image_url Cosmos-RL sends)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return "data:image;base64," + base64.b64encode(buffer.getvalue()).decode("utf-8")


DECODINGS = ("greedy", "generation_config")
"""In-process decoding: greedy, or the checkpoint's generation config."""


def endpoint_key(reward: str, key: str, env: str, file: str) -> str:
    """The endpoint's bearer key from one of the options `endpoint_api_key` (the key), `endpoint_api_key_env` (an
    environment variable's name) or `endpoint_api_key_file` (a file's path; surrounding whitespace dropped).

    Raises:
        ConfigError: more than one is set, the variable or file is missing or empty, or the key is the mask a
            run's config.toml holds in its place.
    """
    given = [
        n
        for n, v in (
            ("endpoint_api_key", key),
            ("endpoint_api_key_env", env),
            ("endpoint_api_key_file", file),
        )
        if v
    ]
    where = f"reward {reward!r}: option"
    if len(given) > 1:
        raise ConfigError(f"{where}s {', '.join(given)} each give the endpoint key: keep one.")
    if key == MASK:
        raise ConfigError(
            f"{where} endpoint_api_key is {MASK!r}: the key was masked when the run's config.toml was written "
            '(a run never writes it). Give it with endpoint_api_key_env = "VARIABLE" or endpoint_api_key_file = '
            '"PATH" (docs/rewards.md), or set endpoint_api_key again.'
        )
    if env:
        key = os.environ.get(env, "")
        if not key:
            raise ConfigError(
                f"{where} endpoint_api_key_env = {env!r}: that environment variable is not set."
            )
    if file:
        try:
            key = Path(file).expanduser().read_text().strip()
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"{where} endpoint_api_key_file = {file!r} cannot be read ({err}).") from None
        if not key:
            raise ConfigError(f"{where} endpoint_api_key_file = {file!r} is empty.")
    return key


class UnifiedReward(qwen.VlmReward):
    """UnifiedReward's 1-5 judgement of images `[B, 3, H, W]` in [0, 1], scaled to [0, 1] (see the module doc).

    Args:
        model: in-process model directory or Hub id (used when endpoint_url is empty).
        endpoint_url: an OpenAI-compatible base URL (e.g. http://host:8000/v1); set = judge through it.
        endpoint_api_key: its bearer key ("" = none); or endpoint_api_key_env (the name of an environment
            variable holding it) or endpoint_api_key_file (a file holding it): a run writes the key itself only
            masked (config.toml, meta.json), so a config.toml rerun needs one of these two.
        endpoint_model: the model name the endpoint serves.
        question: "flow_grpo" (Cosmos-RL's) | "elements" (UnifiedReward's point-score prompt).
        max_new_tokens: longest in-process answer; timeout_s, max_concurrency: endpoint requests.
        decoding: in-process "greedy" (do_sample = False, the default) | "generation_config" (the checkpoint's).
        device, dtype (auto = bfloat16 on GPU, float32 on CPU), batch_size (in-process images per generate call).
    """

    name = "unified_reward"
    keys = ("unified_reward", "unified_reward_raw", "unified_reward_parsed")
    default_key = "unified_reward"

    def __init__(
        self,
        model: str = UNIFIED_MODEL,
        endpoint_url: str = "",
        endpoint_api_key: str = "",
        endpoint_model: str = ENDPOINT_MODEL,
        question: str = "flow_grpo",
        max_new_tokens: int = 512,
        timeout_s: float = 120.0,
        max_concurrency: int = 8,
        device: str | torch.device | None = None,
        dtype: str = "auto",
        batch_size: int = 4,
        decoding: str = "greedy",
        endpoint_api_key_env: str = "",
        endpoint_api_key_file: str = "",
    ) -> None:
        super().__init__(device, dtype, parse_batch_size(batch_size, self.name))
        if decoding not in DECODINGS:
            raise ConfigError(
                f"reward {self.name!r}: option decoding={decoding!r} must be one of {', '.join(DECODINGS)}."
            )
        self.decoding = decoding
        if question not in QUESTIONS:
            raise ConfigError(
                f"reward {self.name!r}: option question={question!r} must be one of {sorted(QUESTIONS)}."
            )
        if endpoint_url and not endpoint_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"reward {self.name!r}: option endpoint_url={endpoint_url!r} must be an http(s) URL such as "
                "http://127.0.0.1:8000/v1 (or empty to judge in-process)."
            )
        for option, value in (("max_new_tokens", max_new_tokens), ("max_concurrency", max_concurrency)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"reward {self.name!r}: option {option}={value!r} must be a positive integer."
                )
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
            raise ConfigError(
                f"reward {self.name!r}: option timeout_s={timeout_s!r} must be a positive number."
            )
        self.model_name, self.question = str(model), question
        self.endpoint_url, self.endpoint_api_key, self.endpoint_model = (
            endpoint_url.rstrip("/"),
            endpoint_key(self.name, endpoint_api_key, endpoint_api_key_env, endpoint_api_key_file),
            endpoint_model,
        )
        self.max_new_tokens, self.timeout_s, self.max_concurrency = (
            max_new_tokens,
            float(timeout_s),
            max_concurrency,
        )

    # --- in-process -------------------------------------------------------------------------------------------
    def check_weights(self) -> Any:
        """The in-process model directory (nothing to check for an endpoint); WeightsError naming the id."""
        if self.endpoint_url:
            return None
        qwen.require_vlm_packages(self.name)
        return qwen.resolve_model_dir(self.name, "model", self.model_name)

    def _load(self) -> None:
        directory = self.check_weights()
        if directory is None:
            return
        self.processor = qwen.load_processor(directory, self.name, padding_side="left")
        self.model = qwen.load_vlm(directory, self.device, self.model_dtype(), self.name)

    def text_of(self, prompt: str) -> str:
        """The question with the caption."""
        return QUESTIONS[self.question].format(prompt=prompt)

    def generate(self, images: np.ndarray, questions: list[str]) -> list[str]:
        """Answers (greedy unless `decoding`) of the in-process model to uint8 images `[B, H, W, 3]` and their full question texts."""
        if not self._ready:
            self.setup(self.device)
        answers: list[str] = []
        for start in range(0, len(questions), self.batch_size):
            chunk, texts = images[start : start + self.batch_size], questions[start : start + self.batch_size]
            pixels = []
            for image in chunk:
                frame = torch.from_numpy(np.array(image)).permute(2, 0, 1).unsqueeze(0)
                size = vision.smart_resize(image.shape[0], image.shape[1], 28, MIN_PIXELS, MAX_PIXELS)
                pixels.append(pil_resize(frame, *size)[0])
            chats = [
                [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}] for q in texts
            ]
            text = self.processor.apply_chat_template(chats, tokenize=False, add_generation_prompt=True)
            batch = qwen.to_device(qwen.encode(self.processor, text, images=pixels), self.device)
            greedy = {"do_sample": False} if self.decoding == "greedy" else {}
            out = self.model.generate(**batch, max_new_tokens=self.max_new_tokens, **greedy)
            answers += self.processor.batch_decode(
                out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True
            )
        return answers

    # --- endpoint ---------------------------------------------------------------------------------------------
    def _ask_endpoint(self, image: np.ndarray, prompt: str) -> str:
        """One chat completion (temperature 0) from the endpoint; RuntimeError naming the URL on failure."""
        body = {
            "model": self.endpoint_model,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": png_data_url(image)}},
                        {"type": "text", "text": self.text_of(prompt)},
                    ],
                }
            ],
            "temperature": 0,
            "stream": False,
        }
        url = f"{self.endpoint_url}/chat/completions"
        headers = {"Content-Type": "application/json"}
        if self.endpoint_api_key:
            headers["Authorization"] = f"Bearer {self.endpoint_api_key}"
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                answer = json.loads(response.read())
            return str(answer["choices"][0]["message"]["content"] or "")
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise RuntimeError(
                f"reward {self.name!r}: the endpoint {url} did not answer ({type(exc).__name__}: {exc})."
            ) from exc

    def answers(self, images: torch.Tensor, prompts: list[str]) -> list[str]:
        """The judge's raw answers to images `[B, 3, H, W]` in [0, 1] (in-process or through the endpoint)."""
        uint8 = (
            (images.detach().float() * 255.0)
            .round()
            .clamp(0, 255)
            .to(torch.uint8)
            .permute(0, 2, 3, 1)
            .cpu()
            .numpy()
        )
        if not self.endpoint_url:
            return self.generate(uint8, [self.text_of(p) for p in prompts])
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(prompts))) as pool:
            return list(pool.map(self._ask_endpoint, list(uint8), prompts))

    def _score(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> dict[str, torch.Tensor]:
        """Images `[B, 3, H, W]` in [0, 1] -> the three keys, each `[B]`."""
        return scores_of(self.answers(images, prompts))
