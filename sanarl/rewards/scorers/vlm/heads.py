"""Qwen2-VL reward models with a scalar head on the hidden states (VideoAlign, HPSv3): checkpoint key mapping, the
head model, and reading the head at the reward tokens.

Both references subclass transformers 4's `Qwen2VLForConditionalGeneration` with a forward that scatters the
visual features into the pad tokens, runs the language model with plain sequential positions and applies `rm_head`
to every hidden state; their checkpoints use transformers 4 names (`model.layers...`, `visual...`), which
`to_current_layout` maps to this transformers' (`model.language_model...`, `model.visual...`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sanarl.errors import WeightsError
from sanarl.rewards.base import RewardInputError
from sanarl.rewards.scorers.vlm import qwen


def strip_peft(key: str) -> str:
    """A state-dict key without the PEFT wrappers (`base_model.model.` prefix, `.base_layer.`)."""
    return key.removeprefix("base_model.model.").replace(".base_layer.", ".")


def to_current_layout(key: str) -> str:
    """Transformers 4 Qwen2-VL names -> this transformers' (`visual.` -> `model.visual.`, `model.` ->
    `model.language_model.`); `rm_head`, `lm_head` and names already in the new layout stay."""
    if key.startswith("visual."):
        return "model." + key
    if key.startswith("model.") and not key.startswith(("model.language_model.", "model.visual.")):
        return "model.language_model." + key.removeprefix("model.")
    return key


def fresh_vlm(directory: Path, reward: str) -> Any:
    """A Qwen-VL model from `directory` in float32 on the CPU, not shared (a checkpoint is merged into it)."""
    transformers = qwen.require_vlm_packages(reward)
    cls = getattr(transformers, qwen.MODEL_CLASSES[qwen.model_type(directory, reward)])
    try:
        return cls.from_pretrained(str(directory), dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise WeightsError(
            f"reward {reward!r}: cannot load {cls.__name__} from {directory} ({type(exc).__name__}: {exc})."
        ) from None


class RewardHeadModel(torch.nn.Module):
    """A Qwen-VL model and a reward head `rm_head` applied to every hidden state.

    `head_in_float32`: run the head in float32 whatever the model's dtype (HPSv3 does; VideoAlign does not).
    """

    def __init__(self, vlm: Any, head: torch.nn.Module, head_in_float32: bool = False) -> None:
        super().__init__()
        self.vlm, self.rm_head, self.head_in_float32 = vlm, head, head_in_float32

    def load_checkpoint(
        self,
        plain: dict[str, torch.Tensor],
        pairs: dict[str, tuple[torch.Tensor, torch.Tensor]],
        scale: float,
        where: Path,
    ) -> None:
        """Overlay the checkpoint's tensors (current-layout keys), merge its LoRA pairs (`W += scale * B @ A`) and
        load the head; a tensor the model lacks, or a head that does not fit, is a WeightsError."""
        params = dict(self.vlm.named_parameters())
        plain = {
            k: v for k, v in plain.items() if not k.startswith("lm_head.")
        }  # unused (tied in Qwen2-VL-2B)
        head = {
            k.removeprefix("rm_head."): plain.pop(k) for k in [k for k in plain if k.startswith("rm_head.")]
        }
        if not head:
            raise WeightsError(f"{where} has no rm_head tensors (not a reward-model checkpoint).")
        unknown = sorted({*plain, *pairs} - set(params))
        if unknown:
            raise WeightsError(
                f"{where} has tensors this model lacks, e.g. {unknown[:3]} (another base model?)."
            )
        shapes = {k: v.shape for k, v in plain.items()} | {
            k: (b.shape[0], a.shape[1]) for k, (a, b) in pairs.items()
        }
        wrong = sorted(k for k, shape in shapes.items() if tuple(params[k].shape) != tuple(shape))
        if wrong:
            key = wrong[0]
            raise WeightsError(
                f"{where}: {key} has shape {tuple(shapes[key])}, the model {tuple(params[key].shape)} (and "
                f"{len(wrong) - 1} more); the checkpoint was trained on another base model or tokenizer."
            )
        try:
            self.rm_head.load_state_dict(head)
        except RuntimeError as exc:
            raise WeightsError(f"{where}: its rm_head does not fit this reward's head ({exc}).") from None
        with torch.no_grad():
            for key, value in plain.items():
                params[key].copy_(value)
            for key, (a, b) in pairs.items():
                params[key].add_(scale * (b.float() @ a.float()).to(params[key].dtype))

    def place(self, device: torch.device, dtype: torch.dtype) -> RewardHeadModel:
        """Move to `device`, cast the model to `dtype` (the head stays float32 when `head_in_float32`), freeze."""
        self.to(device=device, dtype=dtype)
        if self.head_in_float32:
            self.rm_head.float()
        return self.eval().requires_grad_(False)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-token head outputs `[B, L, output_dim]`."""
        hidden = qwen.sequential_hidden_states(self.vlm, batch)
        return self.rm_head(hidden.float() if self.head_in_float32 else hidden)


def at_special_tokens(logits: torch.Tensor, input_ids: torch.Tensor, special_ids: list[int]) -> torch.Tensor:
    """`[B, L, N]` head outputs -> `[B, K, N]` at the K reward tokens of each row (in sequence order)."""
    mask = torch.zeros_like(input_ids, dtype=torch.bool)
    for token in special_ids:
        mask |= input_ids == token
    batch = input_ids.shape[0]
    if int(mask.sum()) != len(special_ids) * batch:
        raise RewardInputError(
            "each prompt must hold each reward token exactly once (did a caption carry one?)."
        )
    return logits[mask].view(batch, len(special_ids), -1)
