"""Generation and scoring primitives (held-out scoring itself is sanarl/rewards/held_out.py) shared by `sanarl eval`, the shapes bench and (optionally) the runner.

Scores are keyed `<reward>/<key>` (every key a reward returns, e.g. `shapes/strict`, `shapes/partial`,
`pickscore/pickscore`); off-target image statistics (shapes world, docs/shapes.md) are keyed `stats/<name>`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from sanarl.models.base import DiffusionAdapter
from sanarl.rewards.base import Reward
from sanarl.rewards.held_out import build_rewards, score_images
from sanarl.rewards.summary import describe
from sanarl.training.sampling import GenerationSpec, generate_images
from sanarl.worlds import shapes as world

STATS_PREFIX = "stats/"


def image_statistics(images: torch.Tensor) -> dict[str, list[float]]:
    """Off-target statistics of images `[B, 3, H, W]` in [0, 1] (`shapes_world.image_stats`): background fraction,
    blobs and specks (connected components), colour entropy in bits -> `{"stats/<name>": [B]}`."""
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
    built = build_rewards(list(rewards)) if not isinstance(rewards, Mapping) else rewards
    module = adapter.trainable_module()
    was_training = module.training
    module.eval()
    try:
        scores = generate_and_score(adapter, prompts, metadata, seeds, spec, built, batch_size=batch_size)
    finally:
        module.train(was_training)
    return {key: describe(values)["mean"] for key, values in scores.items()}
