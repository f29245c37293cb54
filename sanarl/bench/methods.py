"""The methods `sanarl bench shapes` compares: a shipped preset each, and the rollout / reward-call arithmetic.

Rollout images and reward calls are not logged per step by every task, so they are computed from the config and the
number of optimizer steps taken (one record per step in metrics.jsonl):
- DiffusionNFT / Flow-GRPO: `train_batch_per_replica` images per step, each scored once;
- Sol-RL family: per prompt (`train_batch_per_replica / n_generation` prompts) `num_candidates` previews plus
  `n_generation` regenerated samples, every one scored (docs/nft.md);
- SOAR: `num_rollout_paths` reward-free ODE rollouts per training image (no reward calls);
- SFT: none.
"""

from __future__ import annotations

from sanarl.config.schema import Config
from sanarl.errors import ConfigError

METHODS: dict[str, str] = {
    "nft": "tiny-shapes-nft",
    "nft-solrl": "tiny-shapes-nft-solrl",
    "grpo": "tiny-shapes-grpo",
    "soar": "tiny-shapes-soar",
    "sft-more": "tiny-shapes-sft-more",
}
"""Bench method name -> shipped preset (sanarl/presets/<name>.toml)."""

RATIOS: tuple[tuple[str, str, str], ...] = (
    ("soar", "sft-more", "SOAR vs SFT-more at equal compute"),
    ("nft", "grpo", "DiffusionNFT vs Flow-GRPO at equal wall time"),
)
"""(numerator, denominator, what) pairs of held-out strict accuracy reported as ratios when both ran."""


def parse_methods(spec: str) -> list[str]:
    """`--methods a,b,...` -> names (order kept); unknown names -> ConfigError listing the known ones."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in METHODS]
    if unknown or not names:
        raise ConfigError(
            f"`--methods {spec}`: unknown method(s) {unknown or '(none given)'}. Known methods: "
            f"{', '.join(METHODS)} (comma-separated)."
        )
    return list(dict.fromkeys(names))


def rollout_cost(cfg: Config, steps: int) -> tuple[int, int]:
    """(rollout images generated, reward calls = images scored) for `steps` optimizer steps of `cfg` (RL: one
    rollout per `optimizer_steps_per_rollout` steps)."""
    tp, ro = cfg.train.train_policy, cfg.rollout
    batch = cfg.train.train_batch_per_replica
    if tp.type == "sft" and tp.trainer_type == "soar":
        return steps * batch * tp.soar.num_rollout_paths, 0
    if tp.type == "sft":
        return 0, 0
    spr = tp.optimizer_steps_per_rollout
    steps = -(-steps // spr)  # rollouts: one per optimizer_steps_per_rollout optimizer steps
    if ro.family == "sol_rl":
        prompts = batch // ro.n_generation
        per_step = prompts * ((ro.num_candidates or ro.n_generation) + ro.n_generation)
        return steps * per_step, steps * per_step
    return steps * batch, steps * batch
