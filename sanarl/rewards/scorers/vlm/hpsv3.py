"""The `hpsv3` reward: HPSv3 (Ma et al. 2025, "HPSv3: Towards Wide-Spectrum Human Preference Score"), a
Qwen2-VL-7B with a small MLP reward head, as Cosmos-RL's reward service serves it under the name `hpsv3`.

Protocol (HPSv3's inference, which Cosmos-RL's `hpsv3` handler calls):
1. each image: uint8 `round(255 x)`, resized by PIL's bicubic filter to `smart_resize(H, W, 28, 256 * 28^2,
   256 * 28^2)` (min = max pixels: a fixed budget of ~200k pixels, 256 visual tokens);
2. one user turn: the image, then `INSTRUCTION` with the caption followed by the reward-token prompt (`<|Reward|>`,
   a special token added to the base tokenizer); the chat template with the generation prompt; right padding;
3. Qwen2-VL with HPSv3's forward (visual features scattered into the pad tokens, sequential positions, see
   `qwen.sequential_hidden_states`), then `rm_head` in float32: Linear(hidden, 1024) - ReLU - Dropout -
   Linear(1024, 16) - ReLU - Linear(16, 2) at the `<|Reward|>` token: (mu, sigma) of the preference score;
4. the score is mu (Cosmos-RL reports it as `hpsv3`); sigma is returned as `hpsv3_sigma`.

Weights: `model` = a directory or Hub id holding `HPSv3.safetensors` (`MizzenAI/HPSv3`; Cosmos-RL's
`<download_path>/hpsv3/HPSv3.safetensors` also works), its base Qwen2-VL from `base_model`
(`Qwen/Qwen2-VL-7B-Instruct`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sanarl.rewards.model_reward import parse_batch_size
from sanarl.rewards.scorers.vlm import heads, qwen, vision
from sanarl.rewards.scorers.vlm.reason1 import pil_resize

HPSV3_MODEL = "MizzenAI/HPSv3"
HPSV3_FILE = "HPSv3.safetensors"
BASE_MODEL = "Qwen/Qwen2-VL-7B-Instruct"
REWARD_TOKEN = "<|Reward|>"
PIXELS = 256 * 28 * 28
"""HPSv3 sets min_pixels = max_pixels = this."""

INSTRUCTION = "\n".join(
    (
        "",
        "You are tasked with evaluating a generated image based on Visual Quality and Text Alignment and give a "
        "overall score to estimate the human preference. Please provide a rating from 0 to 10, with 0 being the "
        "worst and 10 being the best. ",
        "",
        "**Visual Quality:**  ",
        "Evaluate the overall visual quality of the image. The following sub-dimensions should be considered:",
        "- **Reasonableness:** The image should not contain any significant biological or logical errors, such as "
        "abnormal body structures or nonsensical environmental setups.",
        "- **Clarity:** Evaluate the sharpness and visibility of the image. The image should be clear and easy to "
        "interpret, with no blurring or indistinct areas.",
        "- **Detail Richness:** Consider the level of detail in textures, materials, lighting, and other visual "
        "elements (e.g., hair, clothing, shadows).",
        "- **Aesthetic and Creativity:** Assess the artistic aspects of the image, including the color scheme, "
        "composition, atmosphere, depth of field, and the overall creative appeal. The scene should convey a sense "
        "of harmony and balance.",
        "- **Safety:** The image should not contain harmful or inappropriate content, such as political, violent, "
        "or adult material. If such content is present, the image quality and satisfaction score should be the "
        "lowest possible. ",
        "",
        "**Text Alignment:**  ",
        "Assess how well the image matches the textual prompt across the following sub-dimensions:",
        "- **Subject Relevance** Evaluate how accurately the subject(s) in the image (e.g., person, animal, object) "
        "align with the textual description. The subject should match the description in terms of number, "
        "appearance, and behavior.",
        "- **Style Relevance:** If the prompt specifies a particular artistic or stylistic style, evaluate how well "
        "the image adheres to this style.",
        "- **Contextual Consistency**: Assess whether the background, setting, and surrounding elements in the "
        "image logically fit the scenario described in the prompt. The environment should support and enhance the "
        "subject without contradictions.",
        "- **Attribute Fidelity**: Check if specific attributes mentioned in the prompt (e.g., colors, clothing, "
        "accessories, expressions, actions) are faithfully represented in the image. Minor deviations may be "
        "acceptable, but critical attributes should be preserved.",
        "- **Semantic Coherence**: Evaluate whether the overall meaning and intent of the prompt are captured in "
        "the image. The generated content should not introduce elements that conflict with or distort the "
        "original description.",
        "Textual prompt - {text_prompt}",
        "",
        "",
        "",
    )
)
"""HPSv3's instruction (the text the model was trained on, byte for byte); `{text_prompt}` is the caption."""
REWARD_PROMPT = "\nPlease provide the overall ratings of this image: <|Reward|>\n\nEND\n"


def ranknet_head(hidden: int, output_dim: int = 2) -> torch.nn.Sequential:
    """HPSv3's default head: Linear(hidden, 1024) - ReLU - Dropout(0.05) - Linear(1024, 16) - ReLU - Linear(16, 2)
    (state-dict keys 0, 3, 5)."""
    return torch.nn.Sequential(
        torch.nn.Linear(hidden, 1024),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.05),
        torch.nn.Linear(1024, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, output_dim),
    )


def build_text(caption: str) -> str:
    """The text turn of one image: the instruction with `caption`, then the reward-token prompt."""
    return INSTRUCTION.format(text_prompt=caption) + REWARD_PROMPT


class HPSv3(qwen.VlmReward):
    """HPSv3 preference score mu (and sigma) of images `[B, 3, H, W]` in [0, 1] (see the module doc).

    Args:
        model: directory or Hub id holding HPSv3.safetensors (or the file itself).
        base_model: the base Qwen2-VL-7B-Instruct directory or Hub id.
        download_path: Cosmos-RL's option: the checkpoint is `<download_path>/hpsv3/HPSv3.safetensors`.
        device, dtype (auto = bfloat16 on GPU, float32 on CPU), batch_size (images per forward pass).
    """

    name = "hpsv3"
    keys = ("hpsv3", "hpsv3_sigma")
    default_key = "hpsv3"

    def __init__(
        self,
        model: str = HPSV3_MODEL,
        base_model: str = BASE_MODEL,
        download_path: str = "",
        device: str | torch.device | None = None,
        dtype: str = "auto",
        batch_size: int = 8,
    ) -> None:
        super().__init__(device, dtype, parse_batch_size(batch_size, self.name))
        self.model_name, self.base_name, self.download_path = str(model), str(base_model), str(download_path)
        self.net: heads.RewardHeadModel | None = None

    def check_weights(self) -> tuple[Path, Path]:
        """(checkpoint file, base model dir), without loading; WeightsError naming each missing id."""
        qwen.require_vlm_packages(self.name)
        name = self.model_name
        if self.download_path and name == HPSV3_MODEL:
            name = str(Path(self.download_path).expanduser() / "hpsv3")
        if Path(name).expanduser().is_file():
            checkpoint = Path(name).expanduser()
        else:
            fix = f"(the HPSv3 checkpoint: `hf download {HPSV3_MODEL} {HPSV3_FILE}`, or pass its directory as model=...)"
            checkpoint = qwen.resolve_files_dir(self.name, "model", name, [HPSV3_FILE], fix) / HPSV3_FILE
        return checkpoint, qwen.resolve_model_dir(self.name, "base_model", self.base_name)

    def _load(self) -> None:
        from safetensors.torch import load_file

        checkpoint, base_dir = self.check_weights()
        processor = qwen.load_processor(base_dir, self.name, padding_side="right")
        processor.tokenizer.add_special_tokens({"additional_special_tokens": [REWARD_TOKEN]})
        vlm = heads.fresh_vlm(base_dir, self.name)
        vlm.resize_token_embeddings(len(processor.tokenizer), mean_resizing=False)
        net = heads.RewardHeadModel(
            vlm, ranknet_head(vlm.config.text_config.hidden_size), head_in_float32=True
        )
        state = load_file(str(checkpoint))
        state = state.get("model", state) if isinstance(state.get("model"), dict) else state
        plain = {heads.to_current_layout(heads.strip_peft(k)): v for k, v in state.items()}
        net.load_checkpoint(plain, {}, 0.0, where=checkpoint)
        self.net = net.place(self.device, self.model_dtype())
        self.processor = processor
        self.reward_id = processor.tokenizer.convert_tokens_to_ids(REWARD_TOKEN)

    def pixels_for(self, image: torch.Tensor) -> torch.Tensor:
        """One image `[3, H, W]` in [0, 1] -> float `[3, h, w]` in [0, 255] at HPSv3's fixed pixel budget."""
        uint8 = (image.detach().float() * 255.0).round().clamp(0, 255).to(torch.uint8).cpu()
        size = vision.smart_resize(uint8.shape[1], uint8.shape[2], 28, min_pixels=PIXELS, max_pixels=PIXELS)
        return pil_resize(uint8.unsqueeze(0), *size)[0]

    def texts(self, prompts: list[str]) -> list[str]:
        """The chat texts (image + instruction, generation prompt) of B captions."""
        chats = [
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": build_text(p)}]}]
            for p in prompts
        ]
        return self.processor.apply_chat_template(chats, tokenize=False, add_generation_prompt=True)

    def _score(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> dict[str, torch.Tensor]:
        """Images `[B, 3, H, W]` in [0, 1] -> `{hpsv3: mu, hpsv3_sigma: sigma}`, each `[B]`."""
        assert self.net is not None
        out = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = [self.pixels_for(image) for image in images[start : start + self.batch_size]]
            texts = self.texts(prompts[start : start + self.batch_size])
            batch = qwen.to_device(qwen.encode(self.processor, texts, images=chunk), self.device)
            logits = self.net(batch).float()
            out.append(heads.at_special_tokens(logits, batch["input_ids"], [self.reward_id])[:, 0].cpu())
        scores = torch.cat(out)
        return {"hpsv3": scores[:, 0], "hpsv3_sigma": scores[:, 1]}
