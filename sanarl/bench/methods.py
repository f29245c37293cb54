"""The methods `sanarl bench shapes` compares: each method's shipped presets from the method registry
(sanarl/methods/registry.py), and the rollout / reward-call arithmetic.

Rollout images and reward calls are not logged per step by every task, so they come from the config and the
number of optimizer steps taken (one record per step in metrics.jsonl), by each method's `rollout_cost`.
"""

from __future__ import annotations

from sanarl.config.schema import Config
from sanarl.errors import ConfigError
from sanarl.methods.registry import bench_plugins, bench_presets, method_of

METHODS: dict[str, str] = bench_presets()
"""Bench method name -> shipped preset (sanarl/presets/<name>.toml)."""
PLUGINS: dict[str, str] = bench_plugins()
"""Bench method name -> the dataset plugin its preset trains with (the shapes world's prompts or pairs)."""

RATIOS: tuple[tuple[str, str, str], ...] = (
    ("soar", "sft-more", "SOAR vs SFT-more at equal compute"),
    ("nft", "grpo", "DiffusionNFT vs Flow-GRPO at equal wall time"),
    ("ddrl", "grpo", "DDRL vs Flow-GRPO-Fast at equal wall time"),
    ("awm", "nft", "AWM vs DiffusionNFT at equal wall time"),
    ("grpo-guard", "grpo", "GRPO-Guard vs Flow-GRPO-Fast at equal wall time"),
    ("mixgrpo", "grpo", "MixGRPO vs Flow-GRPO-Fast at equal wall time"),
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
    """(rollout images generated, reward calls = images scored) for `steps` optimizer steps of `cfg`."""
    return method_of(cfg).rollout_cost(cfg, steps)
