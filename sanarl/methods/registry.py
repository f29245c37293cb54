"""The one table of post-training methods.

Each entry names what selects the method (`train.train_policy.type` / `trainer_type`), the task that runs it, its
typed config view, its checks, the `sanarl bench shapes` runs of it (bench name -> shipped preset) and the cost
arithmetic the bench reports. The config loader (through sanarl/config/methods.py), `sanarl train` / `validate`,
evaluation (a task's LoRA names) and the bench read this table. Adding a method is a folder
`sanarl/methods/<name>/` (task.py, config.py) plus one entry in METHODS (docs/architecture.md, "Adding a method").
Task modules are imported on use, so loading a config never imports torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sanarl.config import methods as config_methods
from sanarl.config.schema import Config
from sanarl.errors import ConfigError
from sanarl.methods.ddrl import config as ddrl
from sanarl.methods.flow_grpo import config as flow_grpo
from sanarl.methods.nft import config as nft
from sanarl.methods.sft import config as sft
from sanarl.methods.soar import config as soar

if TYPE_CHECKING:
    from sanarl.training.protocol import Task


@dataclass(frozen=True)
class Method:
    """One post-training method."""

    name: str
    policy_type: str
    """`train.train_policy.type`."""
    trainer_type: str
    """`train.train_policy.trainer_type` ("" = plain SFT)."""
    task: str
    """"module:Class" of its Task, imported on use."""
    view: Callable[[Config], Any]
    """The config sections the method reads, typed (its config.py)."""
    validate: Callable[[Config], None] | None
    """Its cross-field checks, run by the loader after the generic ones (None: generic only)."""
    rollout_cost: Callable[[Config, int], tuple[int, int]]
    """(images generated, reward calls) of N optimizer steps."""
    bench: Mapping[str, str] = field(default_factory=dict)
    """`sanarl bench shapes --methods` names -> shipped preset."""

    def task_class(self) -> type[Task]:
        module, _, cls = self.task.partition(":")
        return getattr(importlib.import_module(module), cls)


METHODS: tuple[Method, ...] = (
    Method("sft", "sft", "", "sanarl.methods.sft.task:SFTTask", sft.view, None, sft.rollout_cost,
           {"sft-more": "tiny-shapes-sft-more"}),
    Method("soar", "sft", "soar", "sanarl.methods.soar.task:SOARTask", soar.view, soar.validate, soar.rollout_cost,
           {"soar": "tiny-shapes-soar"}),
    Method("diffusion_nft", "grpo", "diffusion_nft", "sanarl.methods.nft.task:NFTTask", nft.view, nft.validate,
           nft.rollout_cost, {"nft": "tiny-shapes-nft", "nft-solrl": "tiny-shapes-nft-solrl"}),
    Method("flow_grpo", "grpo", "flow_grpo", "sanarl.methods.flow_grpo.task:FlowGRPOTask", flow_grpo.view,
           flow_grpo.validate, flow_grpo.rollout_cost, {"grpo": "tiny-shapes-grpo"}),
    Method("ddrl", "grpo", "ddrl", "sanarl.methods.ddrl.task:DDRLTask", ddrl.view, ddrl.validate,
           ddrl.rollout_cost, {"ddrl": "tiny-shapes-ddrl"}),
)  # fmt: skip

for _method in METHODS:
    config_methods.register(_method.policy_type, _method.trainer_type, _method.validate)


def method_of(cfg: Config) -> Method:
    """The method a config selects, or a ConfigError naming what this version provides."""
    tp = cfg.train.train_policy
    for method in METHODS:
        if (method.policy_type, method.trainer_type) == (tp.type, tp.trainer_type):
            return method
    offered = ", ".join(f"type={m.policy_type!r} trainer_type={m.trainer_type!r}" for m in METHODS)
    raise ConfigError(
        f"`train.train_policy.type = {tp.type!r}` with `trainer_type = {tp.trainer_type!r}` is not available in "
        f"this version of sanarl (available: {offered})."
    )


def task_class(cfg: Config) -> type[Task]:
    """The Task class a config asks for (ConfigError when none)."""
    return method_of(cfg).task_class()


def bench_presets() -> dict[str, str]:
    """Every bench method name -> its shipped preset, in table order."""
    return {name: preset for method in METHODS for name, preset in method.bench.items()}
