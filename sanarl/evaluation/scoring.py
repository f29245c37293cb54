"""Generation and scoring primitives shared by `sanarl eval`, the shapes bench and (optionally) the runner.

Scores are keyed `<reward>/<key>` (every key a reward returns, e.g. `shapes/strict`, `shapes/partial`,
`pickscore/pickscore`); off-target image statistics (shapes world, docs/shapes.md) are keyed `stats/<name>`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from sanarl.errors import ConfigError
from sanarl.models.base import DiffusionAdapter
from sanarl.rewards.base import Reward
from sanarl.tasks.sampling import GenerationSpec, generate_images

STATS_PREFIX = "stats/"


def build_rewards(names: Sequence[str]) -> dict[str, Reward]:
    """Build each named reward once (order kept, duplicates dropped). Unknown name -> ConfigError listing the known."""
    from sanarl.rewards.registry import build_reward, known_rewards

    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise ConfigError(
            f"`--rewards` is empty; name at least one reward (comma-separated), e.g. `--rewards shapes`. Known "
            f"rewards: {', '.join(known_rewards())}."
        )
    unknown = [n for n in names if n not in known_rewards()]
    if unknown:
        raise ConfigError(
            f"`--rewards`: {', '.join(map(repr, unknown))} not a known reward. Known rewards: "
            f"{', '.join(known_rewards())}. Fix the name, or register your own with `@sanarl.rewards.register`."
        )
    return {name: build_reward(name) for name in dict.fromkeys(names)}


def score_images(
    images: torch.Tensor,
    prompts: Sequence[str],
    metadata: Sequence[Mapping[str, Any]],
    rewards: Mapping[str, Reward],
) -> dict[str, list[float]]:
    """Every key of every reward for images `[B, 3, H, W]` in [0, 1]: `{"<reward>/<key>": [B] floats}`.

    Reward input errors (e.g. geneval rows missing) propagate as `RewardInputError` (a DataError, exit code 2).
    """
    out: dict[str, list[float]] = {}
    for name, reward in rewards.items():
        for key, values in reward.score(images, list(prompts), [dict(m) for m in metadata]).items():
            out[f"{name}/{key}"] = [float(v) for v in values.tolist()]
    return out


def image_statistics(images: torch.Tensor) -> dict[str, list[float]]:
    """Off-target statistics of images `[B, 3, H, W]` in [0, 1] (`shapes_world.image_stats`): background fraction,
    blobs and specks (connected components), colour entropy in bits -> `{"stats/<name>": [B]}`."""
    from sanarl.datasets import shapes_world as world

    rows = [world.image_stats(img) for img in world.batch_to_hwc(images)]
    return {f"{STATS_PREFIX}{k}": [r[k] for r in rows] for k in (rows[0] if rows else {})}


def generate_and_score(
    adapter: DiffusionAdapter,
    prompts: Sequence[str],
    metadata: Sequence[Mapping[str, Any]],
    seeds: Sequence[int],
    spec: GenerationSpec,
    rewards: Mapping[str, Reward],
    *,
    batch_size: int = 16,
    stats: bool = False,
    on_batch: Callable[[int, torch.Tensor, dict[str, list[float]]], None] | None = None,
) -> dict[str, list[float]]:
    """Generate image i from (prompts[i], seeds[i]) with `spec` and score it; batch by batch.

    `on_batch(start, images [b, 3, H, W], scores of the batch)` is called after each batch (writing PNGs, progress),
    so no more than one batch of images is held. Returns `{score key: [N] floats}`.
    """
    if not (len(prompts) == len(metadata) == len(seeds)):
        raise ValueError(
            f"{len(prompts)} prompts, {len(metadata)} metadata rows and {len(seeds)} seeds differ"
        )
    scores: dict[str, list[float]] = {}
    for start in range(0, len(prompts), batch_size):
        end = min(start + batch_size, len(prompts))
        images = generate_images(
            adapter, list(prompts[start:end]), list(seeds[start:end]), spec, batch_size=end - start
        )
        batch = score_images(images, prompts[start:end], metadata[start:end], rewards)
        if stats:
            batch.update(image_statistics(images))
        for key, values in batch.items():
            scores.setdefault(key, []).extend(values)
        if on_batch is not None:
            on_batch(start, images, batch)
    return scores


def evaluate_rewards(
    adapter: DiffusionAdapter,
    prompts: Sequence[str],
    metadata: Sequence[Mapping[str, Any]],
    seeds: Sequence[int],
    spec: GenerationSpec,
    rewards: Mapping[str, Reward] | Sequence[str],
    *,
    batch_size: int = 16,
) -> dict[str, float]:
    """Mean of every reward key over freshly generated samples, for logging (`{"<reward>/<key>": mean}`).

    The reward-hacking guard: score rewards a run does not train on (held-out rewards) with the current weights.
    `rewards` are built Reward objects or names. NaN scores are left out of the means. The transformer is put in
    eval mode for the call and its previous mode restored.
    """
    from sanarl.evaluation.summary import describe

    built = build_rewards(list(rewards)) if not isinstance(rewards, Mapping) else rewards
    module = adapter.trainable_module()
    was_training = module.training
    module.eval()
    try:
        scores = generate_and_score(adapter, prompts, metadata, seeds, spec, built, batch_size=batch_size)
    finally:
        module.train(was_training)
    return {key: describe(values)["mean"] for key, values in scores.items()}
