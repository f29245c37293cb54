"""Console output and error display shared by the `sanarl` commands (train, validate, presets, eval, bench).

Below the commands in the import order (docs/architecture.md), so `sanarl.evaluation` and `sanarl.bench` print and
report errors the same way as sanarl/cli.py without importing it.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand

from sanarl.errors import RunStopped, UserError

console = Console(stderr=True)
"""Messages, progress and errors (stderr)."""
out = Console()
"""Results a user may pipe (stdout)."""


def launched_rank() -> int:
    """This process's global rank under `accelerate launch` / torchrun (their `RANK`), 0 when run alone."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def guarded(debug: bool, fn: Callable[..., Any], *args: Any) -> None:
    """Run fn; bad input -> message + exit 2, a run stopped on purpose (signal, divergence) -> message + its exit
    code, other failures -> traceback + exit 1. Under a multi-process launch every rank meets the same bad input
    and stops with the same code; only rank 0 prints the message (`--debug` tracebacks come from every rank)."""
    speaks = launched_rank() == 0
    try:
        fn(*args)
    except UserError as err:
        if debug:
            traceback.print_exc()
        if speaks:  # brackets are text, not markup
            console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
        raise SystemExit(err.exit_code) from None
    except RunStopped as err:
        if debug:
            traceback.print_exc()
        if speaks:
            console.print(f"[bold yellow]stopped:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
        raise SystemExit(err.exit_code) from None
    except KeyboardInterrupt:
        if speaks:
            console.print("[yellow]interrupted[/]: resume with `--set train.resume=true`.", soft_wrap=True)
        raise SystemExit(130) from None


class PlainUsage(TyperCommand):
    """A Typer command whose usage line names a required argument as click does (`PLUGIN`, not `{PLUGIN}`)."""

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        pieces = super().collect_usage_pieces(ctx)
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p for p in pieces]


def run_typer(app: Callable[..., Any], args: list[str]) -> None:
    """Run a Typer app on `args` as `sanarl`; a usage error (unknown option, missing argument, bad value) is one
    line, `error: ...` with where to look, and exit code 2, like sanarl's own errors (not Typer's boxed panel)."""
    try:
        code = app(args, prog_name="sanarl", standalone_mode=False)
    except typer.Abort:
        raise SystemExit(130) from None
    except typer.TyperException as err:  # Typer's click errors: usage (exit 2), bad file (exit 1)
        context = getattr(err, "ctx", None)
        where = context.command_path if context is not None else "sanarl"
        message = " ".join(err.format_message().split())
        if not message:  # `sanarl bench` alone: Typer has printed the group's help
            raise SystemExit(getattr(err, "exit_code", 2)) from None
        console.print(
            f"[bold red]error:[/] {escape(message)} (`{where} --help`)", highlight=False, soft_wrap=True
        )
        raise SystemExit(getattr(err, "exit_code", 2)) from None
    if isinstance(code, int) and code:
        raise SystemExit(code)
