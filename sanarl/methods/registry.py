"""The one table of post-training methods.

Each entry names what selects the method (`train.train_policy.type` / `trainer_type`), the task that runs it, its
typed config view, its checks and warnings, the `sanarl bench shapes` runs of it (bench name -> shipped preset) and
the cost arithmetic the bench and the capacity plan report. The config loader is handed this table
(`sanarl.methods.config_loading`; an entry is the loader's `config.method_rules.MethodRules`); `sanarl train` / `validate`,
evaluation (a task's LoRA names), the capacity plan and the bench read it too. Adding a method is a folder
`sanarl/methods/<name>/` (task.py, config.py) plus one entry in METHODS (docs/architecture.md, "Adding a method").
Task modules are imported on use, so loading a config never imports torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from sanarl.config.method_rules import rules_of
from sanarl.config.schema import Config
from sanarl.errors import ConfigError
from sanarl.methods.awm import config as awm
from sanarl.methods.ddrl import config as ddrl
from sanarl.methods.dpo import config as dpo
from sanarl.methods.flow_grpo import config as flow_grpo
from sanarl.methods.mixgrpo import config as mixgrpo
from sanarl.methods.nft import config as nft
from sanarl.methods.sft import config as sft
from sanarl.methods.soar import config as soar
from sanarl.methods.work import GuidedRows, StepPlan, TrainedWork

if TYPE_CHECKING:
    from sanarl.training.protocol import Task


@dataclass(frozen=True, kw_only=True)
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
    warnings: Callable[[Config], list[str]]
    """Valid settings that have no effect for it (its config.py), the loader's notes before the generic ones."""
    rollout_cost: Callable[[Config, int], tuple[int, int]]
    """(images generated, reward calls) of N optimizer steps."""
    plan: Callable[[Config], StepPlan]
    """The levels each sample trains (its config.py): the one count its task trains, its `describe` prints and
    `trained_work` prices."""
    trained_work: Callable[[Config, GuidedRows], TrainedWork]
    """What one optimizer step trains per sample, built on `plan` (its config.py; the capacity plan reads it)."""
    group_rollouts: bool = False
    """Rolls out prompt groups from the policy and scores them: a rollout phase with the reward models resident."""
    sde_transitions: bool = False
    """Trains on the recorded SDE / CPS transitions (Flow-GRPO's per-step ratio objective)."""
    reference_copy: Literal["never", "with_kl", "always"] = "never"
    """When a full fine-tune (no LoRA; with LoRA the reference is the base without adapters) keeps a frozen copy of
    the transformer as its reference: "with_kl" only with `kl_beta > 0` (the KL base of Flow-GRPO, DDRL, MixGRPO,
    AWM), "always" (DPO: the reference is in every loss), "never" (no reference, or LoRA only)."""
    bench: Mapping[str, str] = field(default_factory=dict)
    """`sanarl bench shapes --methods` names -> shipped preset."""
    bench_plugin: str = "sanarl.datasets.shapes"
    """The dataset plugin `sanarl bench shapes` trains those presets with (offline DPO: the shapes world's pairs)."""

    def task_class(self) -> type[Task]:
        module, _, cls = self.task.partition(":")
        return getattr(importlib.import_module(module), cls)


METHODS: tuple[Method, ...] = (
    Method(name="sft", policy_type="sft", trainer_type="", task="sanarl.methods.sft.task:SFTTask",
           view=sft.view, validate=None, warnings=sft.warnings, rollout_cost=sft.rollout_cost,
           plan=sft.plan, trained_work=sft.trained_work, bench={"sft-more": "tiny-shapes-sft-more"}),
    Method(name="soar", policy_type="sft", trainer_type="soar", task="sanarl.methods.soar.task:SOARTask",
           view=soar.view, validate=soar.validate, warnings=soar.warnings, rollout_cost=soar.rollout_cost,
           plan=soar.plan, trained_work=soar.trained_work, bench={"soar": "tiny-shapes-soar"}),
    Method(name="diffusion_nft", policy_type="grpo", trainer_type="diffusion_nft",
           task="sanarl.methods.nft.task:NFTTask", view=nft.view, validate=nft.validate, warnings=nft.warnings,
           rollout_cost=nft.rollout_cost, plan=nft.plan, trained_work=nft.trained_work, group_rollouts=True,
           bench={"nft": "tiny-shapes-nft", "nft-solrl": "tiny-shapes-nft-solrl"}),
    Method(name="flow_grpo", policy_type="grpo", trainer_type="flow_grpo",
           task="sanarl.methods.flow_grpo.task:FlowGRPOTask", view=flow_grpo.view, validate=flow_grpo.validate,
           warnings=flow_grpo.warnings, rollout_cost=flow_grpo.rollout_cost, plan=flow_grpo.plan, trained_work=flow_grpo.trained_work,
           group_rollouts=True, sde_transitions=True, reference_copy="with_kl", bench={"grpo": "tiny-shapes-grpo",
           "grpo-guard": "tiny-shapes-grpo-guard"}),
    Method(name="ddrl", policy_type="grpo", trainer_type="ddrl", task="sanarl.methods.ddrl.task:DDRLTask",
           view=ddrl.view, validate=ddrl.validate, warnings=ddrl.warnings, rollout_cost=ddrl.rollout_cost,
           plan=ddrl.plan, trained_work=ddrl.trained_work, group_rollouts=True, sde_transitions=True,
           reference_copy="with_kl",
           bench={"ddrl": "tiny-shapes-ddrl"}),
    Method(name="awm", policy_type="grpo", trainer_type="awm", task="sanarl.methods.awm.task:AWMTask",
           view=awm.view, validate=awm.validate, warnings=awm.warnings, rollout_cost=awm.rollout_cost,
           plan=awm.plan, trained_work=awm.trained_work, group_rollouts=True, reference_copy="with_kl",
           bench={"awm": "tiny-shapes-awm"}),
    Method(name="dpo", policy_type="sft", trainer_type="dpo", task="sanarl.methods.dpo.task:DPOTask",
           view=dpo.view, validate=None, warnings=dpo.warnings, rollout_cost=dpo.rollout_cost, plan=dpo.plan,
           trained_work=dpo.trained_work, reference_copy="always", bench={"dpo": "tiny-shapes-dpo"},
           bench_plugin="sanarl.datasets.shapes_pairs"),
    Method(name="dpo_online", policy_type="grpo", trainer_type="dpo", task="sanarl.methods.dpo.task:DPOOnlineTask",
           view=dpo.online_view, validate=dpo.validate_online, warnings=dpo.online_warnings,
           rollout_cost=dpo.online_rollout_cost, plan=dpo.plan, trained_work=dpo.online_trained_work,
           group_rollouts=True, reference_copy="always", bench={"dpo-online": "tiny-shapes-dpo-online"}),
    Method(name="mixgrpo", policy_type="grpo", trainer_type="mixgrpo", task="sanarl.methods.mixgrpo.task:MixGRPOTask",
           view=mixgrpo.view, validate=mixgrpo.validate, warnings=mixgrpo.warnings,
           rollout_cost=mixgrpo.rollout_cost, plan=mixgrpo.plan, trained_work=mixgrpo.trained_work,
           group_rollouts=True, sde_transitions=True, reference_copy="with_kl", bench={"mixgrpo": "tiny-shapes-mixgrpo"}),
)  # fmt: skip


def method_of(cfg: Config) -> Method:
    """The method a config selects, or a ConfigError naming what this version provides."""
    method = rules_of(cfg, METHODS)
    if method is not None:
        return method
    tp = cfg.train.train_policy
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


def bench_plugins() -> dict[str, str]:
    """Every bench method name -> the dataset plugin its preset trains with."""
    return {name: method.bench_plugin for method in METHODS for name in method.bench}
