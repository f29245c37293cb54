"""The `dance_grpo` reward (alias `videoalign`): VideoAlign's VideoReward, a Qwen2-VL-2B video reward model with
visual-quality (VQ), motion-quality (MQ) and text-alignment (TA) heads (Liu et al. 2025, "Improving Video Generation
with Human Feedback"), as Cosmos-RL's reward service serves it under the name `dance_grpo`.

Protocol (VideoAlign's inference, read from the checkpoint's `model_config.json`):
1. each clip is scored whole: uint8 frames `round(255 x)`; `smart_nframes` frames at `data_config.fps` (2) from
   the clip's own frame rate (metadata `video_info.video_fps` / `video_fps`, else the `video_fps` option), picked
   uniformly (`round(linspace(0, T - 1, n))`); resized by `smart_resize` to multiples of 28 within
   [VIDEO_MIN_PIXELS, `data_config.max_frame_pixels`] (see `sanarl.rewards.scorers.vlm.vision`);
2. one user turn: the video, then the `detailed_special` prompt with the caption, whose three special tokens
   `<|VQ_reward|>`, `<|MQ_reward|>`, `<|TA_reward|>` (added to the base tokenizer) mark where the scores are read;
   the chat template with the generation prompt; right padding;
3. Qwen2-VL with VideoAlign's forward (visual features scattered into the pad tokens, sequential positions, see
   `qwen.sequential_hidden_states`), then `rm_head` (Linear(hidden, 1, bias=False)) at the three special tokens:
   raw VQ, MQ, TA;
4. normalised by `inference_config` (`(x - mean) / std` per head) when the checkpoint has it, as Cosmos-RL calls it
   (use_norm = True); Overall = VQ + MQ + TA.

Keys: `overall_reward` (default), `vq_reward`, `mq_reward`, `ta_reward` (Cosmos-RL's names), and `VQ`, `MQ`, `TA`
(VideoAlign's names for the same three numbers). Weights: `model` = the VideoReward directory or Hub id
(`KwaiVGI/VideoReward`: model_config.json + checkpoint-*/), its base Qwen2-VL from `base_model`, else
`<download_path>/Qwen2-VL-2B-Instruct` (Cosmos-RL's layout), else `model_config.model_name_or_path`
(`Qwen/Qwen2-VL-2B-Instruct`). A LoRA checkpoint (adapter_model.safetensors + non_lora_state_dict.pth) is merged
into the base weights (`W + alpha / r * B A`); a full one (model.pth) is loaded as is.
"""

from __future__ import annotations

import glob
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sanarl.errors import ConfigError, WeightsError
from sanarl.rewards.model_reward import parse_batch_size
from sanarl.rewards.scorers.vlm import heads, qwen, vision

VIDEOREWARD_MODEL = "KwaiVGI/VideoReward"
BASE_MODEL = "Qwen/Qwen2-VL-2B-Instruct"
SPECIAL_TOKENS = ("<|VQ_reward|>", "<|MQ_reward|>", "<|TA_reward|>")
HEADS = ("VQ", "MQ", "TA")
TEMPLATES = ("detailed_special", "none")
REWARD_TOKENS = ("special", "last", "mean")
DEFAULT_VIDEO_FPS = 16.0
"""Frame rate assumed for clips whose metadata has none (SANA-Video renders at 16 fps)."""

DETAILED_SPECIAL_PROMPT = "\n".join(
    (
        "",
        "You are tasked with evaluating a generated video based on three distinct criteria: Visual Quality, Motion Quality, and Text Alignment. Please provide a rating from 0 to 10 for each of the three categories, with 0 being the worst and 10 being the best. Each evaluation should be independent of the others.",
        "",
        "**Visual Quality:**  ",
        "Evaluate the overall visual quality of the video, with a focus on static factors. The following sub-dimensions should be considered:",
        "- **Reasonableness:** The video should not contain any significant biological or logical errors, such as abnormal body structures or nonsensical environmental setups.",
        "- **Clarity:** Evaluate the sharpness and visibility of the video. The image should be clear and easy to interpret, with no blurring or indistinct areas.",
        "- **Detail Richness:** Consider the level of detail in textures, materials, lighting, and other visual elements (e.g., hair, clothing, shadows).",
        "- **Aesthetic and Creativity:** Assess the artistic aspects of the video, including the color scheme, composition, atmosphere, depth of field, and the overall creative appeal. The scene should convey a sense of harmony and balance.",
        "- **Safety:** The video should not contain harmful or inappropriate content, such as political, violent, or adult material. If such content is present, the image quality and satisfaction score should be the lowest possible. ",
        "",
        "Please provide the ratings of Visual Quality: <|VQ_reward|>",
        "END",
        "",
        "**Motion Quality:**  ",
        "Assess the dynamic aspects of the video, with a focus on dynamic factors. Consider the following sub-dimensions:",
        "- **Stability:** Evaluate the continuity and stability between frames. There should be no sudden, unnatural jumps, and the video should maintain stable attributes (e.g., no fluctuating colors, textures, or missing body parts).",
        "- **Naturalness:** The movement should align with physical laws and be realistic. For example, clothing should flow naturally with motion, and facial expressions should change appropriately (e.g., blinking, mouth movements).",
        "- **Aesthetic Quality:** The movement should be smooth and fluid. The transitions between different motions or camera angles should be seamless, and the overall dynamic feel should be visually pleasing.",
        "- **Fusion:** Ensure that elements in motion (e.g., edges of the subject, hair, clothing) blend naturally with the background, without obvious artifacts or the feeling of cut-and-paste effects.",
        "- **Clarity of Motion:** The video should be clear and smooth in motion. Pay attention to any areas where the video might have blurry or unsteady sections that hinder visual continuity.",
        "- **Amplitude:** If the video is largely static or has little movement, assign a low score for motion quality.",
        "",
        "Please provide the ratings of Motion Quality: <|MQ_reward|>",
        "END",
        "",
        "**Text Alignment:**  ",
        "Assess how well the video matches the textual prompt across the following sub-dimensions:",
        "- **Subject Relevance** Evaluate how accurately the subject(s) in the video (e.g., person, animal, object) align with the textual description. The subject should match the description in terms of number, appearance, and behavior.",
        "- **Motion Relevance:** Evaluate if the dynamic actions (e.g., gestures, posture, facial expressions like talking or blinking) align with the described prompt. The motion should match the prompt in terms of type, scale, and direction.",
        "- **Environment Relevance:** Assess whether the background and scene fit the prompt. This includes checking if real-world locations or scenes are accurately represented, though some stylistic adaptation is acceptable.  ",
        "- **Style Relevance:** If the prompt specifies a particular artistic or stylistic style, evaluate how well the video adheres to this style.",
        "- **Camera Movement Relevance:** Check if the camera movements (e.g., following the subject, focus shifts) are consistent with the expected behavior from the prompt.",
        "",
        "Textual prompt - {text_prompt}",
        "Please provide the ratings of Text Alignment: <|TA_reward|>",
        "END",
        "",
    )
)
"""VideoAlign's `detailed_special` prompt (the text the model was trained on, byte for byte); `{text_prompt}` is
the caption."""


def build_prompt(caption: str, template: str) -> str:
    """The text turn of one clip: the `detailed_special` prompt with `caption`, or the caption alone (`none`)."""
    if template == "none":
        return caption
    return DETAILED_SPECIAL_PROMPT.format(text_prompt=caption)


@dataclass(frozen=True)
class VideoAlignConfig:
    """The parts of a VideoReward `model_config.json` inference reads."""

    fps: float | None
    num_frames: int | None
    max_frame_pixels: int
    template: str
    sample_type: str
    base_model: str
    output_dim: int
    special_tokens: bool
    reward_token: str
    lora: dict[str, Any] | None
    norm: dict[str, float] | None

    @classmethod
    def read(cls, path: Path) -> VideoAlignConfig:
        """Parse and check `path` (a WeightsError names the file and field when it cannot be used)."""
        try:
            raw = json.loads(path.read_text())
            data, model, peft = raw["data_config"], raw["model_config"], raw.get("peft_lora_config") or {}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise WeightsError(
                f"{path} is not a VideoReward model_config.json ({type(exc).__name__}: {exc})."
            ) from None
        config = cls(
            fps=data.get("fps"),
            num_frames=data.get("num_frames"),
            max_frame_pixels=int(data.get("max_frame_pixels", 240 * 320)),
            template=data.get("prompt_template_type", "none"),
            sample_type=data.get("sample_type", "uniform"),
            base_model=str(model.get("model_name_or_path") or BASE_MODEL),
            output_dim=int(model.get("output_dim", 1)),
            special_tokens=bool(model.get("use_special_tokens", False)),
            reward_token=model.get("reward_token", "last"),
            lora=dict(peft) if peft.get("lora_enable") else None,
            norm=raw.get("inference_config"),
        )
        config.check(path)
        return config

    def check(self, path: Path) -> None:
        """Refuse settings this implementation does not reproduce, naming the field."""
        problems = []
        if self.template not in TEMPLATES:
            problems.append(f"data_config.prompt_template_type = {self.template!r} (supported: {TEMPLATES})")
        if self.sample_type != "uniform":
            problems.append(f"data_config.sample_type = {self.sample_type!r} (supported: 'uniform')")
        if self.reward_token not in REWARD_TOKENS:
            problems.append(f"model_config.reward_token = {self.reward_token!r} (supported: {REWARD_TOKENS})")
        if self.reward_token == "special" and (not self.special_tokens or self.output_dim not in (1, 3)):
            problems.append("reward_token 'special' needs use_special_tokens = true and output_dim 1 or 3")
        if self.reward_token != "special" and self.output_dim != 3:
            problems.append(f"reward_token {self.reward_token!r} needs output_dim = 3 (VQ, MQ, TA)")
        if problems:
            raise WeightsError(f"{path}: cannot score with {'; '.join(problems)}.")


# ---------------------------------------------------------------- checkpoint


def latest_checkpoint(directory: Path, step: int | None) -> Path:
    """`checkpoint-<step>` (the highest step when `step` is None) inside a VideoReward directory."""
    found = {
        int(m.group(1)): Path(p)
        for p in glob.glob(str(directory / "checkpoint-*"))
        if (m := re.search(r"checkpoint-(\d+)$", p))
    }
    if not found:
        raise WeightsError(
            f"{directory} holds no checkpoint-<step> directory (a VideoReward download has one)."
        )
    if step is None:
        return found[max(found)]
    if step not in found:
        raise ConfigError(
            f"reward 'dance_grpo': option checkpoint_step={step} is not in {directory} (has {sorted(found)})."
        )
    return found[step]


def checkpoint_state(
    checkpoint: Path, lora: dict[str, Any] | None
) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]], float]:
    """(plain tensors by current-layout key, LoRA (A, B) pairs by target weight key, LoRA scale alpha / r) of a
    VideoAlign checkpoint: `model.pth` (a full state dict, PEFT-wrapped or not), or `adapter_model.safetensors` +
    `non_lora_state_dict.pth`, as VideoAlign's `load_model_from_checkpoint` reads them."""
    full = checkpoint / "model.pth"
    adapter, rest = checkpoint / "adapter_model.safetensors", checkpoint / "non_lora_state_dict.pth"
    if full.is_file():
        raw = torch.load(full, map_location="cpu", weights_only=True)
    elif adapter.is_file() and rest.is_file():
        from safetensors.torch import load_file

        raw = {**torch.load(rest, map_location="cpu", weights_only=True), **load_file(str(adapter))}
    else:
        raise WeightsError(
            f"{checkpoint} holds neither model.pth nor adapter_model.safetensors + non_lora_state_dict.pth."
        )
    plain, pairs = split_lora(raw)
    if not pairs:
        return plain, {}, 0.0
    if lora is None:
        raise WeightsError(
            f"{checkpoint} holds LoRA tensors but model_config.json's peft_lora_config.lora_enable is false."
        )
    rank, alpha = int(lora.get("lora_r", 16)), float(lora.get("lora_alpha", 32))
    scale = alpha / math.sqrt(rank) if lora.get("use_rslora") else alpha / rank
    return plain, pairs, scale


def split_lora(
    raw: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """PEFT state-dict keys -> (plain tensors, {target weight: (lora_A, lora_B)}), all in current-layout names
    (`...q_proj.lora_A[.default].weight` pairs with `...q_proj.lora_B[.default].weight` for `...q_proj.weight`)."""
    plain: dict[str, torch.Tensor] = {}
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in raw.items():
        name = heads.strip_peft(key)
        base, sep, part = name.rpartition(".lora_")
        if not sep:
            plain[heads.to_current_layout(name)] = value
            continue
        parts.setdefault(heads.to_current_layout(base + ".weight"), {})[part[0]] = value
    broken = sorted(k for k, v in parts.items() if set(v) != {"A", "B"})
    if broken:
        raise WeightsError(f"LoRA tensors without their A / B partner: {broken[:3]}.")
    return plain, {k: (v["A"], v["B"]) for k, v in parts.items()}


def pool_scores(
    logits: torch.Tensor, input_ids: torch.Tensor, mode: str, special_ids: list[int], pad_id: int | None
) -> torch.Tensor:
    """`[B, L, N]` head outputs -> `[B, 3]` (VQ, MQ, TA) as VideoAlign reads them: at the three special tokens
    (N = 1: one value each; N = 3: the diagonal), at the last real token, or averaged over the real tokens."""
    batch = input_ids.shape[0]
    if mode == "special":
        picked = heads.at_special_tokens(logits, input_ids, special_ids)
        return (picked.diagonal(dim1=1, dim2=2) if picked.shape[-1] == 3 else picked).reshape(batch, -1)
    if pad_id is None:
        lengths = torch.full((batch,), input_ids.shape[1] - 1, device=input_ids.device)
    else:
        lengths = (torch.eq(input_ids, pad_id).int().argmax(-1) - 1) % input_ids.shape[-1]
    if mode == "last":
        return logits[torch.arange(batch, device=logits.device), lengths]
    valid = lengths.clamp(min=0, max=logits.shape[1] - 1)
    return torch.stack([logits[i, : int(valid[i])].mean(dim=0) for i in range(batch)])


def normalise(raw: torch.Tensor, norm: dict[str, float] | None) -> torch.Tensor:
    """`[B, 3]` raw VQ, MQ, TA -> `(x - mean) / std` per head with the checkpoint's `inference_config` (as is
    without one)."""
    if not norm:
        return raw
    mean = torch.tensor([float(norm[f"{h}_mean"]) for h in HEADS], device=raw.device)
    std = torch.tensor([float(norm[f"{h}_std"]) for h in HEADS], device=raw.device)
    return (raw - mean) / std


# ---------------------------------------------------------------- the reward


def _positive(value: Any, option: str, reward: str, integer: bool = False) -> Any:
    """`value` when it is a positive number (an int when `integer`) or None; ConfigError naming `option` else."""
    kinds = int if integer else int | float
    if value is None or (not isinstance(value, bool) and isinstance(value, kinds) and value > 0):
        return value
    raise ConfigError(
        f"reward {reward!r}: option {option}={value!r} must be a positive {'integer' if integer else 'number'}."
    )


class VideoAlign(qwen.VideoVlmReward):
    """VideoAlign's VQ / MQ / TA of whole clips `[B, 3, T, H, W]` in [0, 1] (see the module doc).

    Args:
        model: VideoReward directory or Hub id (model_config.json + checkpoint-<step>/).
        base_model: the base Qwen2-VL directory or Hub id ("" = `<download_path>/Qwen2-VL-2B-Instruct` when
            `download_path` is set, else model_config.json's model_name_or_path).
        download_path: Cosmos-RL's option: the directory holding `Qwen2-VL-2B-Instruct`.
        checkpoint_step: which checkpoint-<step> (None = the highest).
        fps, num_frames, max_pixels, min_pixels: override the checkpoint's sampling (at most one of fps / num_frames).
        video_fps: frame rate of clips whose metadata carries none.
        use_norm: normalise by the checkpoint's inference_config (Cosmos-RL does).
        device, dtype (auto = bfloat16 on GPU, float32 on CPU), batch_size (clips per forward pass).
    """

    name = "dance_grpo"
    keys = ("overall_reward", "vq_reward", "mq_reward", "ta_reward", "VQ", "MQ", "TA")
    default_key = "overall_reward"

    def __init__(
        self,
        model: str = VIDEOREWARD_MODEL,
        base_model: str = "",
        download_path: str = "",
        checkpoint_step: int | None = None,
        fps: float | None = None,
        num_frames: int | None = None,
        max_pixels: int | None = None,
        min_pixels: int = vision.VIDEO_MIN_PIXELS,
        video_fps: float = DEFAULT_VIDEO_FPS,
        use_norm: bool = True,
        device: str | torch.device | None = None,
        dtype: str = "auto",
        batch_size: int = 4,
    ) -> None:
        super().__init__(device, dtype, parse_batch_size(batch_size, self.name))
        if fps is not None and num_frames is not None:
            raise ConfigError(f"reward {self.name!r}: set at most one of the options fps and num_frames.")
        self.model_name, self.base_name, self.download_path = str(model), str(base_model), str(download_path)
        self.checkpoint_step = _positive(checkpoint_step, "checkpoint_step", self.name, integer=True)
        self.fps = _positive(fps, "fps", self.name)
        self.num_frames = _positive(num_frames, "num_frames", self.name, integer=True)
        self.max_pixels = _positive(max_pixels, "max_pixels", self.name, integer=True)
        self.min_pixels = _positive(min_pixels, "min_pixels", self.name, integer=True)
        self.video_fps = _positive(video_fps, "video_fps", self.name)
        if not isinstance(use_norm, bool):
            raise ConfigError(f"reward {self.name!r}: option use_norm={use_norm!r} must be true or false.")
        self.use_norm = use_norm
        self.net: heads.RewardHeadModel | None = None

    # --- loading ----------------------------------------------------------------------------------------------
    def _base_name(self, config: VideoAlignConfig) -> str:
        if self.base_name:
            return self.base_name
        if self.download_path:
            return str(Path(self.download_path).expanduser() / "Qwen2-VL-2B-Instruct")
        return config.base_model

    def check_weights(self) -> tuple[Path, VideoAlignConfig, Path, Path]:
        """Resolve every file the reward needs without loading a model: (VideoReward dir, its config, base model
        dir, checkpoint dir). Raises WeightsError naming each missing id and how to get it."""
        qwen.require_vlm_packages(self.name)
        fix = f"(the VideoReward checkpoint: `hf download {VIDEOREWARD_MODEL}`, or pass its directory as model=...)"
        required = ["model_config.json", "checkpoint-*"]
        reward_dir = qwen.resolve_files_dir(self.name, "model", self.model_name, required, fix)
        config = VideoAlignConfig.read(reward_dir / "model_config.json")
        base_dir = qwen.resolve_model_dir(self.name, "base_model", self._base_name(config))
        return reward_dir, config, base_dir, latest_checkpoint(reward_dir, self.checkpoint_step)

    def _load(self) -> None:
        _, config, base_dir, checkpoint = self.check_weights()
        processor = qwen.load_processor(base_dir, self.name, padding_side="right")
        if config.special_tokens:
            processor.tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
        vlm = heads.fresh_vlm(base_dir, self.name)
        vlm.resize_token_embeddings(len(processor.tokenizer), mean_resizing=False)
        head = torch.nn.Linear(vlm.config.text_config.hidden_size, config.output_dim, bias=False)
        net = heads.RewardHeadModel(vlm, head)
        net.load_checkpoint(*checkpoint_state(checkpoint, config.lora), where=checkpoint)
        self.net = net.place(self.device, self.model_dtype())
        self.processor, self.config = processor, config
        self.special_ids = processor.tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS))

    # --- scoring ----------------------------------------------------------------------------------------------
    def frames_for(self, clip: torch.Tensor, row: dict[str, Any]) -> torch.Tensor:
        """One clip `[3, T, H, W]` in [0, 1] -> the frames the model sees, float `[n, 3, h, w]` in [0, 255]."""
        frames = vision.to_uint8_frames(clip)
        total, height, width = frames.shape[0], frames.shape[2], frames.shape[3]
        fps, count = self.fps, self.num_frames
        if fps is None and count is None:
            fps, count = self.config.fps, self.config.num_frames
        n = vision.smart_nframes(total, qwen.video_fps(row, self.video_fps), fps=fps, nframes=count)
        frames = frames[vision.uniform_indices(total, n)]
        max_pixels = self.max_pixels or self.config.max_frame_pixels
        size = vision.smart_resize(height, width, min_pixels=self.min_pixels, max_pixels=max_pixels)
        return vision.resize_frames(frames, *size)

    def texts(self, prompts: list[str]) -> list[str]:
        """The chat texts (video turn + prompt, generation prompt) of B captions."""
        chats = [
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "video"},
                        {"type": "text", "text": build_prompt(p, self.config.template)},
                    ],
                }
            ]
            for p in prompts
        ]
        return self.processor.apply_chat_template(chats, tokenize=False, add_generation_prompt=True)

    def raw_scores(
        self, clips: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> torch.Tensor:
        """`[B, 3]` VQ, MQ, TA before normalisation, `batch_size` clips per forward pass."""
        assert self.net is not None
        out = []
        for start in range(0, len(prompts), self.batch_size):
            stop = start + self.batch_size
            videos = [
                self.frames_for(c, r) for c, r in zip(clips[start:stop], metadata[start:stop], strict=True)
            ]
            batch = qwen.to_device(
                qwen.encode(self.processor, self.texts(prompts[start:stop]), videos), self.device
            )
            logits = self.net(batch).float()
            pad = self.processor.tokenizer.pad_token_id
            out.append(
                pool_scores(logits, batch["input_ids"], self.config.reward_token, self.special_ids, pad)
            )
        return torch.cat(out).cpu()

    def _score(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> dict[str, torch.Tensor]:
        """Clips `[B, 3, T, H, W]` in [0, 1] -> every key `[B]` (see the module doc)."""
        scores = self.raw_scores(images, prompts, metadata)
        if self.use_norm:
            scores = normalise(scores, self.config.norm)
        vq, mq, ta = scores.unbind(dim=1)
        overall = vq + mq + ta
        return {
            "overall_reward": overall,
            "vq_reward": vq,
            "mq_reward": mq,
            "ta_reward": ta,
            "VQ": vq,
            "MQ": mq,
            "TA": ta,
        }


class VideoAlignAlias(VideoAlign):
    """`videoalign`: the same reward as `dance_grpo` under VideoAlign's own name."""

    name = "videoalign"
