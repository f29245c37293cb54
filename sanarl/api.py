"""Programmatic entry points (the CLI is a thin layer over these)."""

from __future__ import annotations

from dataclasses import dataclass

from sanarl.config import LoadedConfig, check_plugin, dump_toml, resolve_plugin
from sanarl.config.schema import Config
from sanarl.methods.registry import task_class
from sanarl.models import load_adapter
from sanarl.rewards.preflight import check_reward_prompts
from sanarl.training.distributed import drop_single_process_state, enable_fsdp_on_cpu, on_cpu
from sanarl.training.preflight import preflight
from sanarl.training.protocol import Task
from sanarl.training.runner import Runner, RunResult
from sanarl.training.setup import MIXED_PRECISION, check_writable, prepare_run_dir


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
    plugin = resolve_plugin(plugin_spec)
    check_plugin(plugin)
    cls = task_class(cfg)
    check_reward_prompts(cfg, plugin)  # the data against the rewards, before any model loads
    preflight_lines = preflight(cfg, plugin, dataset=plugin.get_dataset(cfg))
    acc = _accelerator(MIXED_PRECISION[cfg.train.param_dtype], cpu=on_cpu())
    run_dir = check_writable(cfg.train.output_dir)
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
    runner = Runner(
        cfg, task, acc, run_dir
    )  # resolves train.resume: a bad path fails before anything is written
    if acc.is_main_process:
        prepare_run_dir(cfg.train.output_dir)
        (run_dir / "config.toml").write_text(dump_toml(cfg))
    acc.wait_for_everyone()
    return TrainOutcome(cfg, task, runner.run(), plan)
