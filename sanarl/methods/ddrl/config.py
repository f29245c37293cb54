"""DDRL's config view and checks (docs/algorithms.md, "DDRL"; docs/ddrl.md for the keys)."""

from __future__ import annotations

from dataclasses import dataclass

from sanarl.config.checks import require
from sanarl.config.group_rl_schema import FlowGRPOPolicy
from sanarl.config.schema import Config, DDRLConfig
from sanarl.methods.flow_grpo.config import plan as flow_grpo_plan
from sanarl.methods.flow_grpo.config import rollout_cost as flow_grpo_rollout_cost
from sanarl.methods.flow_grpo.config import sde_work
from sanarl.methods.flow_grpo.config import validate as flow_grpo_validate
from sanarl.methods.group_rl.config import GroupRLView, group_sections, keys_of, rollouts_for
from sanarl.methods.work import GuidedRows, StepPlan, TrainedWork

KEY = "train.train_policy.ddrl"
RANDOM_STEP = -1
"""A `train_on` entry drawing one step at random per rollout (sanarl.core.ddrl.RANDOM_STEP; config imports no
torch, so the value is repeated here)."""


@dataclass(frozen=True)
class DDRLView(GroupRLView[FlowGRPOPolicy]):
    """Flow-GRPO's view (DDRL's policy term is Flow-GRPO's), plus `[train.train_policy.ddrl]`."""

    ddrl: DDRLConfig


def view(cfg: Config) -> DDRLView:
    tp = cfg.train.train_policy
    return DDRLView(keys_of(FlowGRPOPolicy, tp), *group_sections(cfg), tp.ddrl)


def uses_data_items(cfg: Config) -> bool:
    """Whether the run reads the plugin's (image, caption) items: a data term fed by the dataset."""
    d = cfg.train.train_policy.ddrl
    return d.data_beta > 0 and d.data_source == "dataset"


def validate(cfg: Config) -> None:
    """DDRL's cross-field checks: Flow-GRPO's (its policy term and rollout), then `[train.train_policy.ddrl]`."""
    flow_grpo_validate(cfg)
    check_ddrl_config(cfg)


def warnings(cfg: Config) -> list[str]:
    """DDRL warns of nothing beyond the generic notes."""
    return []


def check_ddrl_config(cfg: Config) -> None:
    """`[train.train_policy.ddrl]` against the rest of the config (ConfigError naming the key and the fix)."""
    d, tp = cfg.train.train_policy.ddrl, cfg.train.train_policy
    require(
        tp.ratio == "plain",
        "train.train_policy.ratio = 'guard' (GRPO-Guard) is a Flow-GRPO option: its reference defines the "
        "normalised ratio for Flow-GRPO's clipped objective alone, and DDRL's loss (its policy term beside the data "
        "term and Cosmos-RL's loss_scale) has no GRPO-Guard form; set ratio = 'plain' for trainer_type = 'ddrl', "
        "or trainer_type = 'flow_grpo' for GRPO-Guard.",
    )
    if d.update_ref_every_iter > 0:
        _check_ref_updates(cfg, d.update_ref_every_iter)
    if d.train_on:
        _check_train_on(cfg, list(d.train_on))
    require(
        tp.optimizer_steps_per_rollout == 1 or not d.data_on_first_only,
        f"`{KEY}.data_on_first_only` = true takes the data term at a rollout's first trained step, which only the "
        "first of its optimizer_steps_per_rollout updates sees; set optimizer_steps_per_rollout = 1 or "
        "data_on_first_only = false.",
    )


def _check_ref_updates(cfg: Config, every: int) -> None:
    tp, lora, ckpt = cfg.train.train_policy, cfg.policy.lora, cfg.train.ckpt
    require(
        tp.kl_beta > 0,
        f"`{KEY}.update_ref_every_iter` = {every} moves the KL reference, but train.train_policy.kl_beta = "
        f"{tp.kl_beta} turns the KL term off; set kl_beta > 0 or update_ref_every_iter = 0.",
    )
    if lora is not None:
        require(
            "ref" in lora.lora_names,
            f"`{KEY}.update_ref_every_iter` = {every} keeps the moving reference in a LoRA adapter named "
            f'"ref"; add it: policy.lora.lora_names = {[*lora.lora_names, "ref"]!r}.',
        )
    elif ckpt.enable_checkpoint:
        require(
            ckpt.save_freq % every == 0,
            f"train.ckpt.save_freq = {ckpt.save_freq} is not a multiple of `{KEY}.update_ref_every_iter` = "
            f"{every}: a full fine-tune's reference copy is not checkpointed, so a resume must start where it is "
            f"refreshed; set save_freq to a multiple of {every}.",
        )


def _check_train_on(cfg: Config, train_on: list[int]) -> None:
    tp, sample = cfg.train.train_policy, cfg.policy.diffusers.sample
    n = sample.num_steps
    require(
        tp.sde_window_size == 0,
        f"`{KEY}.train_on` = {train_on} names grid steps, which needs every step stochastic; set "
        f"train.train_policy.sde_window_size = 0 (it is {tp.sde_window_size}) or train_on = [].",
    )
    last = n - 1 if sample.solver == "cps" else n  # cps's last step lands on s' = 0 deterministically
    fixed = [i for i in train_on if i != RANDOM_STEP]
    ok = all(0 <= i < last for i in fixed) and len(set(fixed)) == len(fixed)
    require(
        ok,
        f"`{KEY}.train_on` = {train_on} must list distinct grid steps in [0, {last - 1}] (or -1 for a random "
        f"one) with policy.diffusers.sample.num_steps = {n}"
        + (" (with cps the last step is deterministic and never trained)" if sample.solver == "cps" else "")
        + "; Cosmos-RL's DDRL runs train [0, 2, ..., 18] of 20 steps.",
    )
    extra = len(train_on) - len(fixed)
    require(
        extra <= last - len(fixed),
        f"`{KEY}.train_on` = {train_on} asks for {extra} random steps (-1) but only {last - len(fixed)} steps are "
        "not listed; remove some -1 entries.",
    )


def plan(cfg: Config) -> StepPlan:
    """The `train_on` steps when given (-1 drawn per rollout), else Flow-GRPO's plan."""
    train_on = cfg.train.train_policy.ddrl.train_on
    if train_on:
        return StepPlan(levels=len(train_on), rule=f"train_on = {list(train_on)} (-1 = random per rollout)")
    return flow_grpo_plan(cfg)


def trained_work(cfg: Config, guided: GuidedRows) -> TrainedWork:
    """Flow-GRPO's on the planned steps, with the data term's row beside each policy row (one shared forward)."""
    return sde_work(
        cfg, guided, plan(cfg).levels, data_rows=1 if cfg.train.train_policy.ddrl.data_beta > 0 else 0
    )


def rollout_cost(cfg: Config, steps: int) -> tuple[int, int]:
    """(images generated, reward calls): Flow-GRPO's, plus one base-model sample per prompt group with synthetic
    data (never scored)."""
    images, calls = flow_grpo_rollout_cost(cfg, steps)
    d = cfg.train.train_policy.ddrl
    if d.data_beta > 0 and d.data_source == "synthetic":
        images += rollouts_for(cfg, steps) * (cfg.train.train_batch_per_replica // cfg.rollout.n_generation)
    return images, calls
