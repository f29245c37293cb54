"""The multi-reward function of a run: every `[[train.train_policy.remote_reward.reward_fns]]` entry, combined.

`combine_scores` is the one combination, for the in-process rewards (`RewardFunction`, below) and the reward
service's (`sanarl.rewards.remote.RemoteRewardFunction`) alike: it picks each entry's score key (empty = the
reward's default key) and combines with `combine_rewards` (docs/algorithms.md, "Advantages and reward
combination"):

    total = clamp(sum_i clamp(score_i, clip_min_i, clip_max_i) * weight_i, reward_clip_min, reward_clip_max) * scale

Samples whose total is NaN (or infinite after clipping) are flagged in `RewardResult.nan_mask`; the caller drops
them (and counts them). A batch where every sample failed raises `RewardFailure`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from sanarl.core.advantages import nan_mask
from sanarl.errors import ConfigError, UserError
from sanarl.rewards.base import Reward, check_batch, check_images
from sanarl.rewards.registry import ENTRY_KEY, build_reward, resolve_score_key
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


class RewardSpecLike(Protocol):
    """Anything with the fields of `[[train.train_policy.remote_reward.reward_fns]]` (e.g. RewardFnConfig)."""

    name: str
    weight: float
    score_key: str
    clip_min: float | None
    clip_max: float | None


@dataclass(frozen=True)
class RewardSpec:
    """One reward of the weighted sum: `clamp(scores[score_key], clip_min, clip_max) * weight`.

    An empty `score_key` means the reward's own name is the key.
    """

    name: str
    weight: float = 1.0
    score_key: str = ""
    clip_min: float | None = None
    clip_max: float | None = None


class MissingScoreKeyError(KeyError, ValueError):
    """A reward's score_key is absent from the scores. A KeyError for dict-like callers, a ValueError otherwise."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _clamp_optional(x: torch.Tensor, low: float | None, high: float | None) -> torch.Tensor:
    if low is not None and high is not None and low > high:
        raise ValueError(f"reward clip range is empty: min={low} > max={high}; swap or fix the bounds.")
    if low is None and high is None:
        return x
    return x.clamp(min=low, max=high)


def _score_of(scores: Mapping[str, torch.Tensor], spec: RewardSpecLike) -> torch.Tensor:
    key = spec.score_key or spec.name
    if key not in scores:
        raise MissingScoreKeyError(
            f"reward {spec.name!r} reads score key {key!r}, which its scorer did not return; available keys: "
            f"{sorted(scores)}. Set score_key of this reward_fns entry to one of them."
        )
    value = torch.as_tensor(scores[key])
    if value.ndim != 1:
        raise ValueError(
            f"score {key!r} of reward {spec.name!r} must have shape [B], got {tuple(value.shape)}."
        )
    return value if value.is_floating_point() else value.float()


def combine_rewards(
    scores: Mapping[str, torch.Tensor],
    fns: Sequence[RewardSpecLike],
    *,
    scale: float = 1.0,
    clip_min: float | None = None,
    clip_max: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Multi-reward combiner (docs/algorithms.md, "Advantages and reward combination").

    total = clamp(sum_i clamp(scores[key_i], clip_min_i, clip_max_i) * weight_i, clip_min, clip_max) * scale.
    `scores` maps score keys to `[B]` tensors. Returns `(total [B], per_key)`, where per_key maps each reward name
    to its raw score `[B]` and "avg" to the weighted sum before the final clamp and scale. NaN scores propagate
    to `total`: find them with `nan_mask` and drop those samples.
    """
    if not fns:
        raise ValueError(
            "no rewards to combine: add at least one [[train.train_policy.remote_reward.reward_fns]]."
        )
    names = [spec.name for spec in fns]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(
            f"reward names must be unique in reward_fns, repeated: {dupes}; rename or merge them."
        )
    if "avg" in names:
        raise ValueError('a reward may not be named "avg" (the key of the weighted sum); rename it.')
    per_key: dict[str, torch.Tensor] = {}
    weighted_sum: torch.Tensor | None = None
    for spec in fns:
        raw = _score_of(scores, spec)
        if weighted_sum is not None and raw.shape != weighted_sum.shape:
            raise ValueError(
                f"score of reward {spec.name!r} has shape {tuple(raw.shape)} but earlier rewards have "
                f"{tuple(weighted_sum.shape)}; every reward must score the same batch."
            )
        per_key[spec.name] = raw
        term = _clamp_optional(raw, spec.clip_min, spec.clip_max) * spec.weight
        weighted_sum = term if weighted_sum is None else weighted_sum + term
    assert weighted_sum is not None
    per_key["avg"] = weighted_sum
    total = _clamp_optional(weighted_sum, clip_min, clip_max) * scale
    return total, per_key


@dataclass(frozen=True)
class Scored:
    """One reward's scores of a batch: every key it returned (float32 `[B]`), the key its entry reads, its time."""

    scores: Mapping[str, torch.Tensor]
    key: str
    seconds: float = 0.0


def combine_scores(
    config: RemoteRewardConfig,
    scored: Mapping[str, Scored],
    *,
    source: str = "",
    unscored: torch.Tensor | None = None,
    error: type[RewardFailure] = RewardFailure,
) -> RewardResult:
    """The combined `RewardResult` of every entry of `config` from its reward's `scored[name]`: the picked score,
    clipped, weighted and summed, clipped and scaled (`combine_rewards`); `per_key` holds every key each reward
    returned as `<name>/<key>`, each picked score as `<name>` and the weighted sum as `avg`.

    `unscored`: bool `[B]`, samples the scores do not stand for (the reward service's non-finite pixels), made NaN.
    Non-finite totals are flagged in `nan_mask` and logged; `error` (a RewardFailure, naming `source`, e.g. the
    service's task) is raised when an entry's key is missing or no sample is left.
    """
    picked: dict[str, torch.Tensor] = {}
    per_key: dict[str, torch.Tensor] = {}
    for fn in config.reward_fns:
        answer = scored[fn.name]
        if answer.key not in answer.scores:
            raise error(
                f"{source}reward {fn.name!r} returned keys {sorted(answer.scores)}, not its score key "
                f"{answer.key!r}; set score_key of this reward_fns entry to one of them."
            )
        picked[fn.name] = answer.scores[answer.key]
        per_key.update({f"{fn.name}/{key}": value for key, value in answer.scores.items()})
    specs = [RewardSpec(fn.name, fn.weight, fn.name, fn.clip_min, fn.clip_max) for fn in config.reward_fns]
    total, combined = combine_rewards(
        picked, specs, scale=config.scale, clip_min=config.reward_clip_min, clip_max=config.reward_clip_max
    )
    total = total.float()
    if unscored is not None:
        total = torch.where(unscored, torch.tensor(float("nan")), total)
    per_key.update(combined)
    mask = nan_mask(total) | torch.isinf(total)
    _report_nan(mask, picked, unscored, source, error)
    durations = {fn.name: scored[fn.name].seconds for fn in config.reward_fns}
    return RewardResult(total, per_key, mask, durations)


def _report_nan(
    mask: torch.Tensor,
    picked: Mapping[str, torch.Tensor],
    unscored: torch.Tensor | None,
    source: str,
    error: type[RewardFailure],
) -> None:
    """Warn about dropped samples; raise `error` when all of them are."""
    if not bool(mask.any()):
        return
    counts = {name: int((~torch.isfinite(value)).sum()) for name, value in picked.items()}
    if unscored is not None and bool(unscored.any()):
        counts["non-finite pixels"] = int(unscored.sum())
    detail = ", ".join(f"{name}: {n}" for name, n in counts.items())
    batch = int(mask.numel())
    if bool(mask.all()):
        raise error(
            f"{source}every one of the {batch} samples got a non-finite reward (non-finite scores per reward: "
            f"{detail}); nothing is left to train on. Check the rewards' inputs (NaN images mean the model "
            "diverged: lower train.optm_lr) and the reward models themselves."
        )
    log.warning(
        "%sdropping %d of %d samples with a non-finite reward (%s)", source, int(mask.sum()), batch, detail
    )


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
        self.keys: dict[str, str] = {}
        """The score key each entry reads (its `score_key`, else the reward's default)."""
        for i, fn in enumerate(config.reward_fns):
            if fn.name in prebuilt:
                reward = prebuilt[fn.name]
            else:
                reward = build_reward(fn.name, **{**fn.options, **dict(options.get(fn.name, {}))})
                check = getattr(reward, "check_weights", None)
                if check is not None:  # missing weights stop the run here, before any rollout (VLM rewards)
                    check()
            self.rewards[fn.name] = reward
            self.keys[fn.name] = resolve_score_key(i, fn.name, fn.score_key, reward)
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
        scored = {}
        for name in self.names:
            start = time.perf_counter()
            scores = self._run(name, images, prompt_list, meta)
            scored[name] = Scored(scores, self.keys[name], time.perf_counter() - start)
        return combine_scores(self.config, scored)
