"""What a run needs before its loop: the accelerate precision name, the optimizer, the LR warm-up and a writable
run directory (checked before anything is written)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from sanarl.config.schema import Config
from sanarl.errors import UserError
from sanarl.training.run_folder.folders import make_dir

MIXED_PRECISION = {"float32": "no", "bfloat16": "bf16", "float16": "fp16"}


def build_optimizer(cfg: Config, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """AdamW / Adam / SGD from `[train]`; `optm_impl` = foreach | fused | for-loop."""
    t = cfg.train
    impl = {"foreach": {"foreach": True}, "fused": {"fused": True}}.get(t.optm_impl, {"foreach": False})
    if t.optm_name == "SGD":
        return torch.optim.SGD(params, lr=t.optm_lr, weight_decay=t.optm_weight_decay, **impl)
    cls = torch.optim.AdamW if t.optm_name == "AdamW" else torch.optim.Adam
    return cls(
        params,
        lr=t.optm_lr,
        betas=tuple(t.optm_betas),
        eps=t.epsilon,
        weight_decay=t.optm_weight_decay,
        **impl,
    )


def warmup_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over `warmup_steps`, then constant."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: min(1.0, (k + 1) / warmup_steps) if warmup_steps > 0 else 1.0
    )


def check_writable(output_dir: str) -> Path:
    """Fail with exit code 2, before anything is written, when `output_dir` cannot be created or written (a name
    too long for the file system, a directory that refuses new entries: probed with a temporary directory that is
    removed at once)."""
    run_dir = Path(output_dir).expanduser().absolute()
    fix = "choose another directory with `--set train.output_dir=...`."
    longest = max(run_dir.parts, key=lambda part: len(part.encode()))
    if len(longest.encode()) > 255 or len(str(run_dir).encode()) > 4000:
        raise UserError(
            f"`train.output_dir` is too long for a file system (a name of {len(longest.encode())} bytes; at most 255 "
            f"per name, 4000 in all); {fix}"
        )
    probe = run_dir
    while not probe.exists():
        probe = probe.parent
    problem = None if probe.is_dir() else "is not a directory"
    if problem is None:
        try:
            tempfile.TemporaryDirectory(dir=probe, prefix=".sanarl-probe-").cleanup()
        except OSError as err:
            problem = f"refuses new entries: {err.strerror}"
    if problem or not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(
            f'`train.output_dir = "{output_dir}"` cannot be written ({probe} {problem or "is not writable"}); {fix}'
        )
    return run_dir


def prepare_run_dir(output_dir: str) -> Path:
    """Create the run directory (after `check_writable`); a failure is still reported as bad input."""
    return make_dir(check_writable(output_dir), f'train.output_dir = "{output_dir}"')
