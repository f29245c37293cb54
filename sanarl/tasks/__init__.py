"""Post-training tasks; `task_class` maps (`train_policy.type`, `trainer_type`) to the implementation."""

from __future__ import annotations

from sanarl.config.schema import Config
from sanarl.errors import ConfigError
from sanarl.tasks.base import Task


def task_class(cfg: Config) -> type[Task]:
    """The Task class a config asks for, or a ConfigError naming what this version provides."""
    from sanarl.tasks.grpo import FlowGRPOTask
    from sanarl.tasks.nft import NFTTask
    from sanarl.tasks.sft import SFTTask
    from sanarl.tasks.soar import SOARTask

    tp = cfg.train.train_policy
    available: dict[tuple[str, str], type[Task]] = {
        ("sft", ""): SFTTask,
        ("grpo", "diffusion_nft"): NFTTask,
        ("grpo", "flow_grpo"): FlowGRPOTask,
        ("sft", "soar"): SOARTask,
    }
    key = (tp.type, tp.trainer_type)
    if key not in available:
        offered = ", ".join(f"type={t!r} trainer_type={tt!r}" for t, tt in available)
        raise ConfigError(
            f"`train.train_policy.type = {tp.type!r}` with `trainer_type = {tp.trainer_type!r}` is not available in "
            f"this version of sanarl (available: {offered})."
        )
    return available[key]


__all__ = ["Task", "task_class"]
