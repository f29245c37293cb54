"""The multi-reward function of a run: every `[[train.train_policy.remote_reward.reward_fns]]` entry, combined.

`RewardFunction` builds each configured reward once, scores a batch with all of them, picks each entry's
`score_key` (empty = the reward's `default_key`) and combines them with `sanarl.core.advantages.combine_rewards`
(docs/algorithms.md, "Advantages and reward combination"):

    total = clamp(sum_i clamp(score_i, clip_min_i, clip_max_i) * weight_i, reward_clip_min, reward_clip_max) * scale

Samples whose total is NaN (or infinite after clipping) are flagged in `RewardResult.nan_mask`; the caller drops
them (and counts them). A batch where every sample failed raises `RewardFailure`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from sanarl.core.advantages import MissingScoreKeyError, RewardSpec, combine_rewards, nan_mask
from sanarl.errors import ConfigError, UserError
from sanarl.rewards.base import Reward, check_batch, check_images
from sanarl.rewards.registry import ENTRY_KEY, build_reward
from sanarl.rewards.video import frames_as_images, score_video

if TYPE_CHECKING:  # rewards do not import the config package at run time
    from sanarl.config.schema import Config, RemoteRewardConfig

log = logging.getLogger(__name__)


class RewardFailure(RuntimeError):
    """Scoring failed: a reward raised (the message names it), or no sample of a batch got a finite reward."""


@dataclass
class RewardResult:
    """Rewards of one batch of B samples.

    total: float32 `[B]`, the combined reward (NaN / inf where `nan_mask` is true).
    per_key: float32 `[B]` tensors: `<name>` = the raw score each entry read, `avg` = the weighted sum before the
        final clip and scale, `<name>/<key>` = every key each reward returned (for logging).
    nan_mask: bool `[B]`, true for samples to drop (non-finite total).
    durations: seconds spent in each reward.
    """

    total: torch.Tensor
    per_key: dict[str, torch.Tensor]
    nan_mask: torch.Tensor
    durations: dict[str, float] = field(default_factory=dict)

    @property
    def num_dropped(self) -> int:
        """Number of samples flagged in `nan_mask`."""
        return int(self.nan_mask.sum())

    def metrics(self, prefix: str = "reward/") -> dict[str, float]:
        """Scalars for logging over the kept samples: mean / std (population) / min / max of `total`, the mean of
        every `per_key` entry (NaN-ignoring), the dropped count and each reward's time in seconds."""
        keep = ~self.nan_mask
        kept = self.total[keep].double()
        out = {
            f"{prefix}mean": float(kept.mean()),
            f"{prefix}std": float(kept.std(correction=0)),
            f"{prefix}min": float(kept.min()),
            f"{prefix}max": float(kept.max()),
            f"{prefix}dropped": float(self.num_dropped),
        }
        for key, value in self.per_key.items():
            out[f"{prefix}{key}"] = float(value[keep].double().nanmean())
        for name, seconds in self.durations.items():
            out[f"{prefix}time/{name}"] = seconds
        return out


def _resolve_key(index: int, name: str, score_key: str, reward: Reward) -> str:
    """The key entry `index` reads from `reward`: `score_key`, or the reward's default key when empty."""
    key = score_key or reward.default_key
    if key not in reward.keys:
        raise ConfigError(
            f"`{ENTRY_KEY}[{index}]` (name = {name!r}) has score_key = {key!r}, which reward {name!r} does not "
            f"return; available keys: {list(reward.keys)}. Set score_key to one of them (empty = "
            f"{reward.default_key!r})."
        )
    return key


def _check_names(config: RemoteRewardConfig, options: Mapping[str, Any]) -> list[str]:
    names = [fn.name for fn in config.reward_fns]
    if not names:
        raise ConfigError(
            f'no rewards configured: add at least one [[{ENTRY_KEY}]] table with name = "..." and weight = 1.0.'
        )
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(
            f"`{ENTRY_KEY}` lists {dupes} more than once; each reward may appear once (its per-key outputs are "
            "all logged, so one entry per reward suffices)."
        )
    unused = sorted(set(options) - set(names))
    if unused:
        raise ConfigError(f"reward options given for {unused}, which are not in `{ENTRY_KEY}` ({names}).")
    return names


class RewardFunction:
    """All rewards of a run behind one call: `fn(images [B, 3, H, W] in [0, 1], prompts, metadata) -> RewardResult`.

    Args:
        config: `train.train_policy.remote_reward` (entries, `scale`, `reward_clip_min` / `reward_clip_max`).
        options: keyword options per reward name, passed to `build_reward` (over the entry's own `options`).
        rewards: already built rewards by entry name (shared models, tests); the others are built by name.
    """

    def __init__(
        self,
        config: RemoteRewardConfig,
        *,
        options: Mapping[str, Mapping[str, Any]] | None = None,
        rewards: Mapping[str, Reward] | None = None,
    ) -> None:
        options, prebuilt = dict(options or {}), dict(rewards or {})
        names = _check_names(config, options)
        self.config = config
        self.rewards: dict[str, Reward] = {}
        specs = []
        for i, fn in enumerate(config.reward_fns):
            if fn.name in prebuilt:
                reward = prebuilt[fn.name]
            else:
                reward = build_reward(fn.name, **{**fn.options, **dict(options.get(fn.name, {}))})
                check = getattr(reward, "check_weights", None)
                if check is not None:  # missing weights stop the run here, before any rollout (VLM rewards)
                    check()
            self.rewards[fn.name] = reward
            key = _resolve_key(i, fn.name, fn.score_key, reward)
            specs.append(RewardSpec(fn.name, fn.weight, key, fn.clip_min, fn.clip_max))
        self.specs: tuple[RewardSpec, ...] = tuple(specs)
        self.names: tuple[str, ...] = tuple(names)

    @classmethod
    def from_config(cls, cfg: Config, **kwargs: Any) -> RewardFunction:
        """Build from a full run config (`cfg.train.train_policy.remote_reward`)."""
        return cls(cfg.train.train_policy.remote_reward, **kwargs)

    def setup(self, device: str | torch.device = "cpu") -> None:
        """Load every reward's model on `device` (optional: rewards load lazily on the CPU otherwise)."""
        for reward in self.rewards.values():
            reward.setup(device)

    def _run(
        self, name: str, images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> dict[str, torch.Tensor]:
        """One reward's scores; internal failures become RewardFailure naming the reward (bad input stays a
        UserError, whose message already names the reward)."""
        try:
            if images.ndim == 5 and not getattr(self.rewards[name], "video_native", False):
                rr = self.config
                return score_video(
                    self.rewards[name],
                    images,
                    prompts,
                    metadata,
                    stride=rr.video_frame_stride,
                    reduction=rr.video_frame_reduction,
                )
            return self.rewards[name].score(images, prompts, metadata)
        except UserError:
            raise
        except Exception as exc:
            raise RewardFailure(
                f"reward {name!r} failed while scoring {len(prompts)} images: {type(exc).__name__}: {exc}"
            ) from exc

    def __call__(
        self,
        images: torch.Tensor,
        prompts: Sequence[str],
        metadata: Sequence[Mapping[str, Any]] | None = None,
    ) -> RewardResult:
        """Score a batch with every reward and combine; see the module doc. Raises RewardFailure when every
        sample's total is non-finite or a reward raised, RewardInputError for bad inputs."""
        label = "+".join(self.names)
        if isinstance(images, torch.Tensor) and images.ndim == 5:  # video clips [B, C, T, H, W]
            check_images(frames_as_images(images)[0], label)
            prompt_list, meta = check_batch(images, prompts, metadata, label)
        else:
            images = check_images(images, label)
            prompt_list, meta = check_batch(images, prompts, metadata, label)
        picked: dict[str, torch.Tensor] = {}
        per_key: dict[str, torch.Tensor] = {}
        durations: dict[str, float] = {}
        for spec in self.specs:
            start = time.perf_counter()
            out = self._run(spec.name, images, prompt_list, meta)
            durations[spec.name] = time.perf_counter() - start
            if spec.score_key not in out:
                raise MissingScoreKeyError(
                    f"reward {spec.name!r} did not return its score key {spec.score_key!r}; available keys: "
                    f"{sorted(out)}. Set score_key of this reward_fns entry to one of them."
                )
            picked[spec.name] = out[spec.score_key]
            per_key.update({f"{spec.name}/{key}": value for key, value in out.items()})
        rr = self.config
        by_name = [RewardSpec(s.name, s.weight, s.name, s.clip_min, s.clip_max) for s in self.specs]
        total, combined = combine_rewards(
            picked, by_name, scale=rr.scale, clip_min=rr.reward_clip_min, clip_max=rr.reward_clip_max
        )
        per_key.update(combined)
        mask = nan_mask(total) | torch.isinf(total)
        self._report_nan(mask, picked)
        return RewardResult(total.float(), per_key, mask, durations)

    def _report_nan(self, mask: torch.Tensor, picked: Mapping[str, torch.Tensor]) -> None:
        """Warn about dropped samples; raise RewardFailure when all of them are."""
        if not bool(mask.any()):
            return
        counts = {name: int((~torch.isfinite(value)).sum()) for name, value in picked.items()}
        detail = ", ".join(f"{name}: {n}" for name, n in counts.items())
        batch = int(mask.numel())
        if bool(mask.all()):
            raise RewardFailure(
                f"every one of the {batch} samples got a non-finite reward (non-finite scores per reward: "
                f"{detail}); nothing is left to train on. Check the rewards' inputs (NaN images mean the model "
                "diverged: lower train.optm_lr) and the reward models themselves."
            )
        log.warning("dropping %d of %d samples with a non-finite reward (%s)", int(mask.sum()), batch, detail)
