"""What a run would reject after loading its models, found before: `sanarl validate` and the start of a run call
`preflight` (no model loads, nothing is written). Each failure is a UserError (exit code 2) naming the key and the
fix: an output directory that cannot be written, a `train.resume` that names no checkpoint or one past the run's
`train.max_num_steps`, a logger that is not installed, in-process reward weights that
are not on this machine, an unset REMOTE_REWARD_* variable or a reward service that does not answer or refuses the
token, accelerate's own gradient accumulation set in the environment, a plugin whose samples do not have the
preset's size, and a plugin without pair items for offline DPO.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sanarl.config.dataset_plugins import plugin_label
from sanarl.config.schema import Config
from sanarl.datasets.pairs import check_pair_item, wants_pairs
from sanarl.errors import DataError, UserError, WeightsError
from sanarl.rewards.registry import build_reward
from sanarl.rewards.remote import RemoteRewardFunction
from sanarl.rewards.weight_files import env_hub_offline, local_only
from sanarl.training.run_folder.checkpoint_store import (
    CheckpointError,
    list_checkpoints,
    read_meta,
    resolve_resume,
    verify_checkpoint,
)
from sanarl.training.run_folder.resume import ResumePlan, refuse_going_back
from sanarl.training.run_folder.setup import check_writable

LOGGER_MODULES = {"wandb": ("wandb", "wandb"), "tensorboard": ("torch.utils.tensorboard", "tensorboard")}
"""`logging.logger` entry -> (the module the run imports for it, its pip package = sanarl extra)."""


def preflight(cfg: Config, plugin: Any = None, *, dataset: Any = None, strict: bool = True) -> list[str]:
    """Every check of the module docstring; returns the lines worth printing (warnings, what was checked).
    `dataset` (the plugin's training set) is read for its first item's shape when given. `strict` False turns
    what only the training machine must have (logger packages, reward weights, the reward service) into
    warnings: `sanarl validate` where the model's own weights are missing too checks a preset, not this machine."""
    check_outputs(cfg)
    lines = _machine_check(check_accelerate_accumulation, cfg, strict)
    lines += _machine_check(check_loggers, cfg, strict)
    lines += check_reward_weights(cfg, required=strict)
    lines += _machine_check(check_reward_service, cfg, strict)
    if dataset is not None and plugin is not None:
        check_pair_form(cfg, plugin, dataset)
        check_sample_shape(cfg, plugin, dataset)
    return lines


def check_outputs(cfg: Config, *, verify: bool = False) -> None:
    """The checks of the run's folder, from the config alone (before the data is read): `train.output_dir` can be
    written, and `check_resume` (`verify`: with checksums, as `sanarl validate` runs it)."""
    check_writable(cfg.train.output_dir)
    check_resume(cfg, verify=verify)


def check_resume(cfg: Config, *, verify: bool = False) -> None:
    """`train.resume` names a checkpoint (a path that holds none is refused), and the one the run would resume
    from is not past `train.max_num_steps` (a resume never goes back: `resume.refuse_going_back`). With
    `train.resume = true` that is the newest intact checkpoint: found when `verify` (every checksum read), else
    left to the run's resume plan, which verifies them anyway."""
    root = Path(cfg.train.output_dir).expanduser().absolute() / "checkpoints"
    try:
        found = resolve_resume(cfg.train.resume, root)
    except ValueError as err:
        raise UserError(str(err)) from None
    steps = cfg.train.max_num_steps
    if found is None or steps is None or (cfg.train.resume is True and not verify):
        return
    groups = ("model", "ema") if cfg.train.ema_enable else ("model",)
    for path in list(reversed(list_checkpoints(root))) if cfg.train.resume is True else [found]:
        if verify and verify_checkpoint(path, groups) is not None:
            continue  # damaged: `train.resume = true` falls back to an older one
        try:
            step = int(read_meta(path)["step"])
        except CheckpointError:
            return  # damaged: the run's resume plan names it
        refuse_going_back(ResumePlan(path=path, step=step), steps, root, f"train.max_num_steps = {steps}")
        return


def _machine_check(check: Callable[[Config], list[str] | None], cfg: Config, strict: bool) -> list[str]:
    try:
        return check(cfg) or []
    except UserError as exc:
        if strict:
            raise
        return [f"warning: {exc} (checked again when the run starts)"]


ACCUMULATION_ENV = "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"


def check_accelerate_accumulation(cfg: Config) -> None:
    """accelerate's own gradient accumulation is off (`ACCELERATE_GRADIENT_ACCUMULATION_STEPS` unset or 1): every
    Accelerator reads it, and its `backward` divides each loss by it, while the runner already averages the
    micro-batches of an optimizer step itself; any other count scales every gradient (0: a NaN gradient norm)."""
    value = os.environ.get(ACCUMULATION_ENV)
    if value is None or value.strip() == "1":
        return
    train = cfg.train
    raise UserError(
        f"{ACCUMULATION_ENV}={value!r} is set in the environment (accelerate's own gradient accumulation: "
        "exported, or by `accelerate launch --use_deepspeed --gradient_accumulation_steps N`): accelerate would "
        "divide every loss of the run by it, while sanarl already averages the micro-batches of each optimizer "
        f"step itself (train.train_batch_per_replica = {train.train_batch_per_replica} samples in micro-batches "
        f"of train.train_policy.mini_batch = {train.train_policy.mini_batch}), so every gradient would be divided "
        f"by it as well (0: a NaN gradient norm at step 1). Unset it (`unset {ACCUMULATION_ENV}`) or set it to "
        "1; for more samples per optimizer step raise train.train_batch_per_replica."
    )


def check_loggers(cfg: Config) -> None:
    """Each of `logging.logger` that needs a package imports as the run will import it."""
    for name in cfg.logging.logger:
        if name not in LOGGER_MODULES:
            continue
        module, package = LOGGER_MODULES[name]
        try:
            importlib.import_module(module)
        except ImportError as exc:
            others = json.dumps([x for x in cfg.logging.logger if x != name] or ["console"])
            raise UserError(
                f'`logging.logger` includes "{name}" but it cannot be imported ({exc}): `pip install {package}` '
                f"(or `pip install \"sanarl[{package}]\"`), or drop it with `--set 'logging.logger={others}'` "
                "(docs/logging.md)."
            ) from None


def _in_process_rewards(cfg: Config) -> list[tuple[str, Callable[[], Any]]]:
    """(what, build) of every reward the run scores in this process: the trained ones (Flow-GRPO / NFT without
    the service) and `validation.held_out_rewards`."""
    tp = cfg.train.train_policy
    wanted = []
    if tp.type == "grpo" and not tp.use_remote_reward:
        for fn in tp.remote_reward.reward_fns:
            wanted.append((fn.name, lambda fn=fn: build_reward(fn.name, **fn.options)))
    if cfg.validation.enable:
        for name in cfg.validation.held_out_rewards:
            wanted.append((name, lambda name=name: build_reward(name)))
    return wanted


def check_reward_weights(cfg: Config, *, required: bool = True) -> list[str]:
    """Every in-process reward with a `check_weights()` hook finds its weights on this machine (local
    directories and the Hub cache; nothing is downloaded). With HF_HUB_OFFLINE set a miss stops here
    (WeightsError) when `required`; otherwise (the run would still download Hub ids at start) it is a warning."""
    lines = []
    for name, build in _in_process_rewards(cfg):
        check = getattr(build(), "check_weights", None)
        if check is None:
            continue
        try:
            with local_only():
                check()
        except WeightsError as exc:
            if required and env_hub_offline():
                raise
            later = (
                "the run stops at start without them"
                if env_hub_offline()
                else "the run downloads Hub ids at start; a missing local file stops it"
            )
            lines.append(f"warning: reward {name!r}: weights not found on this machine, so {later}. {exc}")
            continue
        lines.append(f"weights: reward {name!r} found locally.")
    return lines


def check_reward_service(cfg: Config) -> list[str]:
    """With `use_remote_reward`: the REMOTE_REWARD_* variables are set, the service's /health answers and serves
    every configured reward, and its ping accepts the token."""
    tp = cfg.train.train_policy
    if not (tp.use_remote_reward and tp.remote_reward.reward_fns):
        return []
    service = RemoteRewardFunction(tp.remote_reward, check=False, timeout_s=10.0)
    service.check_service()
    service.check_token()
    return ["reward service: its /health answers, serves every reward above and accepts the token."]


def check_sample_shape(cfg: Config, plugin: Any, dataset: Any) -> None:
    """The first training item's image (or clip) has the preset's `policy.diffusers.inference_size`. A dataset
    with its own size buckets (a `buckets` mapping or the `batch_items` hook, e.g. `sanarl.datasets.soar_jsonl`)
    chooses its sizes and is not checked."""
    if len(dataset) == 0 or hasattr(dataset, "buckets") or hasattr(dataset, "batch_items"):
        return
    item = dataset[0]
    if not isinstance(item, dict):
        return
    for key in ("image", "video", "chosen", "rejected"):
        media = item.get(key)
        shape = getattr(media, "shape", None)
        if shape is None or len(shape) < 3:
            continue
        got, want = [int(x) for x in shape[-2:]], [int(x) for x in cfg.policy.diffusers.inference_size]
        if got != want:
            raise DataError(
                f"dataset plugin {plugin_label(plugin)} returns {key}s of {got[0]}x{got[1]} (item 0, shape "
                f"{list(shape)}) but `policy.diffusers.inference_size` = {want} ({want[0]}x{want[1]}): resize "
                f"them to {want[0]}x{want[1]} in the plugin, or set `--set policy.diffusers.inference_size="
                f"[{got[0]},{got[1]}]` to train at their size."
            )


def check_pair_form(cfg: Config, plugin: Any, dataset: Any) -> None:
    """Offline DPO's first training item is a pair item (`sanarl.datasets.pairs.check_pair_item`)."""
    tp = cfg.train.train_policy
    if wants_pairs(tp.type, tp.trainer_type) and len(dataset) > 0:
        check_pair_item(dataset[0], plugin_label(plugin))
