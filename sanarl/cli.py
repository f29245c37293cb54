"""The `sanarl` command line (Typer).

    sanarl --config PRESET PLUGIN [--set key=value ...] [--dry-run] [--debug]         train
    sanarl validate --config PRESET PLUGIN [--set ...]                                 resolve + print the plan
    sanarl presets [--copy NAME DIR]                                                   list / copy shipped presets

Exit codes: 0 ok, 2 bad input (message names the key / file and the fix), 1 internal failure, 3 training
diverged, 130 / 143 stopped by SIGINT / SIGTERM after a final checkpoint (docs/reliability.md).
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from sanarl.config.dataset_plugins import DatasetPlugin
from sanarl.config.presets import preset_summary, resolve_preset_path, shipped_presets
from sanarl.ui import PlainUsage, console, guarded, out, run_typer

SUBCOMMANDS = ("validate", "presets", "eval", "bench")

ConfigOpt = Annotated[
    str,
    typer.Option(
        "--config", "-c", metavar="PRESET", help="Preset TOML file (or the name of a shipped preset)."
    ),
]
PluginArg = Annotated[
    str, typer.Argument(metavar="PLUGIN", help="Dataset plugin: dotted module or path/to/plugin.py.")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", metavar="KEY=VALUE", help="Override: dotted.key=value (repeatable)."),
]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks for bad input too.")]
DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Resolve everything, load the model, build the task and print the plan, then stop before the first "
        "training step.",
    ),
]


# --- train -------------------------------------------------------------------------------------------------------
def train(
    config: ConfigOpt,
    plugin: PluginArg,
    set_: SetOpt = None,
    dry_run: DryRunOpt = False,
    debug: DebugOpt = False,
):
    """Post-train a model with a preset and a dataset plugin."""
    guarded(debug, _train, config, plugin, set_, dry_run)


def _train(config: str, plugin_spec: str, overrides: list[str] | None, dry_run: bool) -> None:
    from sanarl import api
    from sanarl.config.dataset_plugins import cosmos_plugin, resolve_plugin
    from sanarl.methods.config_loading import load_config
    from sanarl.rewards.reward_checks import check_reward_names
    from sanarl.tools.capacity.fit import check_fits_machine
    from sanarl.training.distributed import launch_state

    loaded = load_config(resolve_preset_path(config), overrides or [])
    check_fits_machine(loaded.config)  # before any model loads: a run that cannot fit here stops with the fix
    main_process = launch_state().is_main_process
    plugin_spec = cosmos_plugin(plugin_spec, notice=lambda text: _note(text) if main_process else None)
    resolve_plugin(plugin_spec)  # before the reward check: a plugin may register rewards
    reward_warnings = check_reward_names(loaded.config)
    if main_process:
        for note in loaded.notes:
            _note(note)
        _print_warnings(reward_warnings)
    outcome = api.train(
        loaded,
        plugin_spec,
        dry_run=dry_run,
        on_plan=lambda rows, run_dir: _print_plan(loaded.config, rows, loaded.ignored, run_dir),
        on_preflight=_print_warnings,
    )
    if not main_process:
        return
    if outcome.result is None:
        out.print("[bold]dry run[/]: model loaded and task built; no training step taken.")
        return
    out.print(f"[bold green]done[/]: {outcome.result.steps} steps -> {outcome.result.run_dir}")
    if outcome.result.export_dir is not None:
        out.print(f"exported model: {outcome.result.export_dir}")


def _print_warnings(lines: list[str]) -> None:
    for line in lines:
        if line.startswith("warning: "):
            console.print(f"[yellow]warning:[/] {escape(line.removeprefix('warning: '))}", highlight=False)


def _note(text: str) -> None:
    console.print(f"[yellow]note:[/] {escape(text)}", highlight=False)  # `[section]` names are text


def _note_out(text: str) -> None:
    out.print(f"[yellow]note:[/] {escape(text)}", highlight=False)


def _print_plan(cfg, rows: list[tuple[str, str]], ignored: list[str], run_dir: Path | str) -> None:
    table = Table(title="sanarl plan", show_header=False, title_justify="left")
    tp = cfg.train.train_policy
    base = [
        ("model", cfg.policy.model_name_or_path),
        ("task", f"{tp.type}" + (f" / {tp.trainer_type}" if tp.trainer_type else "")),
        (
            "LoRA",
            "off (full fine-tune)"
            if cfg.policy.lora is None
            else f"r={cfg.policy.lora.r} "
            f"alpha={cfg.policy.lora.lora_alpha} adapters={cfg.policy.lora.lora_names}",
        ),
        ("image size", "x".join(map(str, cfg.policy.diffusers.inference_size))),
        ("optimizer", f"{cfg.train.optm_name} lr={cfg.train.optm_lr:g} wd={cfg.train.optm_weight_decay:g}"),
        ("precision", cfg.train.param_dtype),
        ("output dir", str(run_dir)),
    ]
    for label, value in base + rows:
        table.add_row(label, escape(value))
    if len(ignored) > 6:
        table.add_row(
            "ignored keys", f"{len(ignored)} Cosmos-RL keys (`sanarl validate` says what sanarl does instead)"
        )
    elif ignored:
        table.add_row("ignored keys", ", ".join(ignored))
    out.print(table)


# --- validate / presets ------------------------------------------------------------------------------------------
tools = typer.Typer(
    add_completion=False, no_args_is_help=True, help="sanarl tools.", pretty_exceptions_enable=False
)


@tools.command(cls=PlainUsage)
def validate(
    config: ConfigOpt,
    plugin: PluginArg,
    set_: SetOpt = None,
    world_size: Annotated[
        int | None,
        typer.Option(
            "--world-size",
            "--gpus",
            help="Ranks to plan for (default: the preset's Cosmos-RL policy.parallelism, else 1).",
        ),
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option(help="Plan memory and time for this accelerator: h100, h200, b200, a100, l40s."),
    ] = None,
    gpu_memory: Annotated[
        float | None, typer.Option(help="Plan memory for an accelerator with this many GB per rank.")
    ] = None,
    fsdp: Annotated[bool, typer.Option("--fsdp", help="Plan for an FSDP launch (default: DDP).")] = False,
    memory: Annotated[
        bool, typer.Option("--memory", help="Print the memory plan against this machine's memory.")
    ] = False,
    debug: DebugOpt = False,
):
    """Resolve preset and plugin, check the data, print the plan. Loads no model weights.

    With --gpu / --gpu-memory / --memory / --fsdp it also prints the memory plan (per rank and phase, from the real
    architecture on the meta device), FLOPs and time per iteration, and whether the run fits (docs/capacity.md)."""
    capacity = (gpu, gpu_memory, fsdp) if (gpu or gpu_memory is not None or memory or fsdp) else None
    guarded(debug, _validate, config, plugin, set_, world_size, capacity)


def _validate(
    config: str, plugin_spec: str, overrides: list[str] | None, world_size: int | None, capacity=None
) -> None:
    from sanarl.config import load_plugin
    from sanarl.config.cosmos.drop_in import planned_world_size, report
    from sanarl.methods.config_loading import load_config
    from sanarl.methods.registry import task_class
    from sanarl.models.tiny import check_tiny_name
    from sanarl.models.weight_sources import TINY_PREFIX, local_weights
    from sanarl.rewards.reward_checks import check_reward_names, check_reward_prompts
    from sanarl.training.preflight import check_outputs, preflight

    path = resolve_preset_path(config)
    loaded = load_config(path, overrides or [])
    cfg = loaded.config
    if capacity is not None and capacity[0] is not None:  # a bad accelerator name stops before any other work
        from sanarl.tools.capacity.accelerators import accelerator

        accelerator(capacity[0])
    check_outputs(cfg, verify=True)
    if cfg.policy.model_name_or_path.startswith(TINY_PREFIX):
        check_tiny_name(cfg.policy.model_name_or_path[len(TINY_PREFIX) :])
    if capacity is None:  # this machine's memory, refused as `train` refuses it (the options print the plan)
        from sanarl.tools.capacity.fit import check_fits_machine

        check_fits_machine(cfg)  # before the data: a sample of an absurd size is never rendered
    world_size = world_size or planned_world_size(loaded.cosmos)
    plugin = load_plugin(plugin_spec, notice=_note_out)
    cls = task_class(cfg)
    reward_report = check_reward_names(cfg)
    dataset = plugin.get_dataset(cfg)
    check_reward_prompts(cfg, plugin)
    name = cfg.policy.model_name_or_path
    model_here = name.startswith(TINY_PREFIX) or local_weights(name, cfg.policy.model_revision) is not None
    reward_report += preflight(cfg, plugin, dataset=dataset, strict=model_here)
    val_rows = _validation_rows(cfg, plugin)
    _print_plan(cfg, cls.describe(cfg, len(dataset), world_size) + val_rows, [], cfg.train.output_dir)
    for line in [*reward_report, *report(loaded.cosmos), *_default_report(loaded)]:
        out.print(escape(line), highlight=False)
    for note in [*loaded.notes, *getattr(dataset, "notes", [])]:
        _note_out(note)
    if name.startswith(TINY_PREFIX):
        out.print(f"weights: {name} is built locally on first use (no download).")
    elif not model_here:
        out.print(
            f"[yellow]warning:[/] weights for {name} are not available locally; training will stop at start. "
            f"Run `hf download {name}` where the Hub is reachable (and share HF_HOME), or set "
            "`policy.model_name_or_path` to a local pipeline directory.",
            highlight=False,
        )
    else:
        out.print(f"weights: found locally for {name}.")
    if capacity is not None:
        from sanarl.tools.capacity import plan_lines

        for line in plan_lines(cfg, world_size, capacity[2], capacity[0], capacity[1]):
            out.print(line, highlight=False, soft_wrap=True)
    out.print("[bold green]valid[/]")


def _validation_rows(cfg, plugin: DatasetPlugin) -> list[tuple[str, str]]:
    """With validation on, the plugin's validation set is loaded here too (a bad one would stop the run at its
    first validation, after hours); returns the plan row."""
    if not cfg.validation.enable or getattr(plugin, "get_val_dataset", None) is None:
        return []
    early = cfg.validation.early_steps
    when = (f"after steps {', '.join(map(str, sorted(early)))}, then " if early else "") + "every"
    val = plugin.get_val_dataset(cfg)
    if val is None:
        return [("validation", f"{when} {cfg.validation.freq} steps, prompts from the training set")]
    return [("validation", f"{when} {cfg.validation.freq} steps, {len(val)} validation prompts")]


def _default_report(loaded) -> list[str]:
    """For a Cosmos-RL launch file (it sets `redis` or `mode`): the keys it leaves out whose Cosmos-RL default
    differs from sanarl's, so the user sees where the run differs from Cosmos-RL's."""
    from sanarl.config.cosmos.drop_in import default_differences

    if not {"redis", "mode"} & set(loaded.cosmos):
        return []
    diffs = default_differences(loaded.config, loaded.given)
    if not diffs:
        return []
    return [
        "defaults: keys this Cosmos-RL preset does not set run with sanarl's defaults: "
        + "; ".join(diffs)
        + ". Set the keys to run as Cosmos-RL would."
    ]


@tools.command(cls=PlainUsage)
def presets(
    copy: Annotated[
        tuple[str, Path] | None,
        typer.Option("--copy", metavar="NAME DIR", help="Copy the shipped preset NAME into DIR to edit it."),
    ] = None,
    debug: DebugOpt = False,
):
    """List the shipped presets (name, purpose, file); `--copy NAME DIR` copies one out to edit."""
    guarded(debug, _presets, copy)


def _presets(copy: tuple[str, Path] | None) -> None:
    from sanarl.config.presets import copy_preset, data_dir

    if copy is not None:
        target = copy_preset(copy[0], copy[1])
        out.print(
            f"copied {copy[0]} -> {target}; run it with `sanarl --config {target} PLUGIN`.", highlight=False
        )
        return
    table = Table(
        title="shipped presets (`--config NAME`)", title_justify="left", box=None, padding=(0, 2, 1, 0)
    )
    table.add_column("preset", no_wrap=True, style="bold")
    table.add_column("purpose / file", overflow="fold")
    for path in shipped_presets():
        table.add_row(path.stem, f"{preset_summary(path)}\n[dim]{path}[/]")
    out.print(table, highlight=False)
    out.print(f"accelerate configs (`--config_file`): {data_dir('accelerate')}", highlight=False)


# --- eval / bench (sanarl/evaluation, sanarl/bench) --------------------------------------------------------------
def _register_eval_and_bench() -> None:
    from sanarl.bench.cli import bench_app
    from sanarl.evaluation.cli import eval_command

    tools.command("eval", cls=PlainUsage)(eval_command)
    tools.add_typer(bench_app, name="bench")


_register_eval_and_bench()


HELP_FLAGS = ("--help", "-h")


def _first_line(doc: str | None) -> str:
    """The first sentence of a docstring's first paragraph."""
    paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
    head, dot, _ = paragraph.partition(". ")
    return head + "." if dot else paragraph


def command_lines() -> list[tuple[str, str]]:
    """(command, one line) for every command: training, each tools command and group, the reward service."""
    rows = [("[train] --config PRESET PLUGIN", _first_line(train.__doc__))]
    for cmd in tools.registered_commands:
        rows.append((cmd.name or cmd.callback.__name__, _first_line(cmd.help or cmd.callback.__doc__)))
    for group in tools.registered_groups:
        for cmd in group.typer_instance.registered_commands:
            name = cmd.name or cmd.callback.__name__
            rows.append((f"{group.name} {name}", _first_line(cmd.help or cmd.callback.__doc__)))
    rows.append(
        ("sanarl-reward --help", "The async reward service (FastAPI + Redis workers), its own command.")
    )
    return rows


def overview() -> str:
    """`sanarl --help`: usage and every command, one line each."""
    rows = command_lines()
    width = max(len(name) for name, _ in rows)
    lines = [
        "Usage: sanarl --config PRESET PLUGIN [--set key=value ...] [--dry-run] [--debug]",
        "       sanarl COMMAND [ARGS]...        (`sanarl COMMAND --help` for a command's options)",
        "",
        "Post-train text-to-image and text-to-video diffusion models (SFT, LoRA-SFT, DiffusionNFT, Flow-GRPO, DDRL, SOAR).",
        "PRESET: a shipped preset's name (`sanarl presets`) or a TOML path; PLUGIN: a dataset plugin module or file.",
        "",
        "Commands:",
        *(
            f"  sanarl {name:<{width}}  {line}"
            if not name.startswith("sanarl-")
            else f"  {name:<{width + 7}}  {line}"
            for name, line in rows
        ),
        "",
        "Example: sanarl --config tiny-shapes-sft sanarl.datasets.shapes   (the embedded CPU default)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Entry point: subcommands go to the tools app, anything else (or `train ...`) is a training run. Called as
    the `sanarl` program (no argv), a failure's exit code is kept even when a thread outlives it."""
    if argv is not None:
        _dispatch(list(argv))
        return
    try:
        _dispatch(sys.argv[1:])
    except SystemExit as exc:
        _exit_past_lingering_threads(exc.code)
        raise
    except Exception:  # an internal failure: its traceback, exit code 1
        traceback.print_exc()
        _exit_past_lingering_threads(1)
        raise SystemExit(1) from None


WORKER_THREAD_PREFIX = "sanarl-"
"""Name prefix of sanarl's own worker threads (the reward pool's `sanarl-reward-<i>`), which run native code."""


def _exit_past_lingering_threads(code: object) -> None:
    """After a failure, a sanarl worker thread still inside native code (a reward hung past its deadline) would
    abort the interpreter's finalization ("terminate called without an active exception", exit 134): flush the
    streams and exit with the failure's code without finalizing. Clean exits (code 0), and failures that leave no
    such thread, finalize normally (other libraries' daemon threads, e.g. TensorBoard's writer, flush at exit)."""
    if code in (None, 0) or not isinstance(code, int):
        return
    threads = threading.enumerate()
    if any(t.daemon and t.is_alive() and t.name.startswith(WORKER_THREAD_PREFIX) for t in threads):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _check_not_a_misspelt_command(word: str) -> None:
    """A first word that is no command but is spelt like one (`sanarl trian ...`) is refused by name, rather than
    read as the dataset plugin of a training run; words that look like a plugin (a file, a dotted module) pass."""
    from sanarl.config.suggest import closest
    from sanarl.errors import UserError

    commands = ["train", *SUBCOMMANDS]
    close = closest(word, commands, cutoff=0.75)
    if close is None or "." in word or "/" in word or Path(word).exists() or Path(f"{word}.py").exists():
        return
    raise UserError(
        f"unknown command '{word}' (did you mean '{close}'?); the commands are {', '.join(commands)} "
        "(`sanarl --help`)."
    )


def _dispatch(args: list[str]) -> None:
    if not args or args[0] in HELP_FLAGS:
        print(overview())
        return
    if args[0] in SUBCOMMANDS:
        run_typer(tools, args)
        return
    if args[0] == "train":
        args = args[1:]
    elif not args[0].startswith("-"):
        guarded(False, _check_not_a_misspelt_command, args[0])
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command(help=train.__doc__, cls=PlainUsage)(train)
    run_typer(app, args)


if __name__ == "__main__":
    main()
