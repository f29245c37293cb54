"""Programmatic entry points (the CLI is a thin layer over these)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from sanarl.config import LoadedConfig, config_to_dict, dump_toml, load_plugin
from sanarl.config.schema import Config
from sanarl.errors import UserError
from sanarl.methods.registry import task_class
from sanarl.models import load_adapter
from sanarl.rewards.reward_checks import check_reward_prompts
from sanarl.training.distributed import drop_single_process_state, enable_fsdp_on_cpu, on_cpu
from sanarl.training.preflight import check_outputs, preflight
from sanarl.training.protocol import Task
from sanarl.training.run_folder.exports import recover_export
from sanarl.training.run_folder.resume import ResumePlan, apply_plan, plan_resume, refuse_going_back
from sanarl.training.run_folder.run_files import disk_full_error, remove_stale_temporaries, write_file
from sanarl.training.run_folder.run_lock import run_lock
from sanarl.training.run_folder.setup import MIXED_PRECISION, check_writable, prepare_run_dir
from sanarl.training.runner import Runner, RunResult


@dataclass
class TrainOutcome:
    """The config that ran, the task (with its adapter and trained weights in memory) and what the run left on disk."""

    cfg: Config
    task: Task
    result: RunResult | None
    plan: list[tuple[str, str]]


def quiet_libraries() -> None:
    """Silence the per-component loading bars and notices of diffusers / transformers (sanarl shows its own)."""
    import warnings

    from diffusers.utils import logging as dlog
    from transformers.utils import logging as tlog

    dlog.set_verbosity_error()
    dlog.disable_progress_bar()
    tlog.set_verbosity_error()
    tlog.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*Expected types for.*")


def _accelerator(mixed_precision: str, cpu: bool):
    """An Accelerator for this run (an FSDP launch on CPU processes shards too: `enable_fsdp_on_cpu`). Several runs
    in one process (tests, notebooks) may differ in precision: accelerate keeps its state process-wide, so that
    part is reset (the process group is kept)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=False)
    drop_single_process_state()
    acc = Accelerator(mixed_precision=mixed_precision, cpu=cpu)
    enable_fsdp_on_cpu(acc)
    return acc


def train(
    loaded: LoadedConfig, plugin_spec: str, *, dry_run: bool = False, on_plan=None, on_preflight=None
) -> TrainOutcome:
    """Resolve the plugin, check what the run would reject later (`sanarl.training.preflight`), load the model,
    build the task and run it (or stop after the plan when dry_run). `on_plan(rows, run_dir)` and
    `on_preflight(lines)` are called on the main process."""
    import torch

    quiet_libraries()
    cfg = loaded.config
    plugin = load_plugin(plugin_spec)
    cls = task_class(cfg)
    check_outputs(cfg)  # the run's folder and resume, before the data is read
    check_reward_prompts(cfg, plugin)  # the data against the rewards, before any model loads
    preflight_lines = preflight(cfg, plugin, dataset=plugin.get_dataset(cfg))
    acc = _accelerator(MIXED_PRECISION[cfg.train.param_dtype], cpu=on_cpu())
    run_dir = check_writable(cfg.train.output_dir)
    record = {"config": config_to_dict(cfg), "plugin": _plugin_identity(plugin_spec)}
    with contextlib.ExitStack() as held:
        resume = None
        if not dry_run:  # one run per folder; the resume checked before any model loads
            resume = _decided_by_main(acc, lambda: _lock_and_plan(held, cfg, run_dir, record))
        if on_preflight is not None and acc.is_main_process:
            on_preflight(preflight_lines)
        torch.manual_seed(cfg.train.seed)
        with acc.main_process_first():  # rank 0 builds / downloads into the shared cache first
            adapter = load_adapter(cfg.policy, acc.device)
        task = cls(cfg, adapter, plugin, rank=acc.process_index, world=acc.num_processes)
        task.setup_model()
        plan = cls.describe(cfg, len(task.train_dataset), acc.num_processes)
        if on_plan is not None and acc.is_main_process:
            on_plan(plan, run_dir)
        if dry_run:
            return TrainOutcome(cfg, task, None, plan)
        runner = Runner(cfg, task, acc, run_dir, plan=resume, record=record)
        limit = f"train.epoch = {cfg.train.epoch} of {task.steps_per_epoch()} steps, train.max_num_steps = "
        refuse_going_back(
            resume, runner.total_steps, run_dir / "checkpoints", limit + str(cfg.train.max_num_steps)
        )
        _decided_by_main(acc, lambda: _start_records(resume, cfg, run_dir))
        acc.wait_for_everyone()
        return TrainOutcome(cfg, task, runner.run(), plan)


def _notice(text: str) -> None:
    Console(stderr=True).print(f"[yellow]note:[/] {text}", highlight=False)


def _plugin_identity(spec: str) -> str:
    """The plugin as a checkpoint records it: a plugin file by its absolute path, a module by its name."""
    path = Path(spec).expanduser()
    return str(path.resolve()) if path.is_file() else spec


def _start_records(plan: ResumePlan, cfg: Config, run_dir: Path) -> None:
    """Rank 0, before the first step: the plan's retirements, resumes.jsonl and config.toml (what runs: allowed
    resume changes applied), each file replaced whole; a full disk is exit 2 naming the folder."""
    prepare_run_dir(cfg.train.output_dir)
    try:
        for line in apply_plan(plan, run_dir / "checkpoints", run_dir):
            _notice(line)
        write_file(run_dir / "config.toml", dump_toml(cfg), fail_at="config_write")
    except OSError as err:
        raise disk_full_error(
            run_dir, "the run did not start (config.toml and resumes.jsonl are whole; no step was taken)", err
        ) from None


def _lock_and_plan(held: contextlib.ExitStack, cfg: Config, run_dir: Path, record: dict) -> ResumePlan:
    """Rank 0: take the folder's lock for the run (held until `held` closes), then plan the resume."""
    held.enter_context(run_lock(run_dir, notice=_notice))
    remove_stale_temporaries(run_dir)
    for line in recover_export(run_dir):
        _notice(line)
    groups = ("model", "ema") if cfg.train.ema_enable else ("model",)
    plan = plan_resume(cfg.train.resume, run_dir / "checkpoints", groups, record["config"], record["plugin"])
    steps = cfg.train.max_num_steps
    if steps is not None:  # before any model loads (the epochs' cap is checked once the task knows its data)
        refuse_going_back(plan, steps, run_dir / "checkpoints", f"train.max_num_steps = {steps}")
    for line in plan.notices:
        _notice(line)
    return plan


def _decided_by_main(acc, decide: Callable[[], Any]) -> Any:
    """Rank 0's `decide()` on every rank; its bad-input error stops every rank with the same message."""
    import torch

    result, error = None, None
    if acc.is_main_process:
        try:
            result = decide()
        except UserError as err:
            error = err
    if acc.num_processes > 1:
        box = [(result, str(error) if error else None)]
        torch.distributed.broadcast_object_list(box, src=0)
        result, message = box[0]
        if message and error is None:
            raise UserError(message)
    if error is not None:
        raise error
    return result
