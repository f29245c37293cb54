"""Which checkpoint a run resumes from, and what it does to the checkpoints already in its output_dir.

`plan_resume` (rank 0, under the run lock, before any model loads) repairs what a kill left
(`checkpoint_store.recover_root`), verifies the candidate checkpoints (checksums; `train.resume = true` falls back to the
newest intact one with a notice, an explicit path must be intact), compares the config and plugin the checkpoint
recorded with the run's (`sanarl.config.resume_rules`), and lists the checkpoints of this run's folder that must
leave rotation before training on: damaged ones, and those of another timeline (past a rewind point, or all of
them when the run starts fresh). `apply_plan` moves those to `checkpoints/retired/` and records the resume.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sanarl.config.resume_rules import PLUGIN_KEY, config_changes
from sanarl.errors import UserError
from sanarl.training.run_folder.checkpoint_store import (
    checkpoint_step,
    list_checkpoints,
    read_meta,
    recover_root,
    resolve_resume,
    retire,
    unverified_notice,
    verify_checkpoint,
)
from sanarl.training.run_folder.run_files import write_file


@dataclass
class ResumePlan:
    """The checkpoint to load (None: start fresh) and what happens to the others."""

    path: Path | None = None
    step: int = 0
    damaged: list[Path] = field(default_factory=list)
    abandoned: list[Path] = field(default_factory=list)
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)


def plan_resume(
    resume: bool | str, root: Path, groups: tuple[str, ...], config: dict[str, Any], plugin: str
) -> ResumePlan:
    """The resume plan of a run whose checkpoints live in `root`, needing tensor `groups` ("model", and "ema" with
    EMA on), for `config` (`config_to_dict`) and `plugin`.

    Raises:
        UserError: the designated checkpoint is damaged (or, for `true`, every checkpoint is), or the config
            changes keys a resume may not change.
    """
    plan = ResumePlan(notices=recover_root(root))
    try:
        designated = resolve_resume(resume, root)
    except ValueError as err:
        raise UserError(str(err)) from None
    own = list_checkpoints(root)
    if designated is None:  # a fresh start: checkpoints already here belong to another run
        plan.abandoned = own
        return _noted_abandoned(plan, root, "train.resume = false")
    if resume is True:
        _newest_intact(plan, own, groups)
        if plan.path is None:
            return plan
    else:
        problem = verify_checkpoint(designated, groups)
        if problem:
            raise UserError(
                f"cannot resume from {designated}: {problem}. Point `train.resume` at another checkpoint, or "
                "set `train.resume = false` to start fresh."
            )
        plan.path = designated
    meta = read_meta(plan.path)
    plan.step = int(meta["step"])
    unverified = unverified_notice(plan.path)
    if unverified:
        plan.notices.append(unverified)
    branch = resume is not True
    plan.changes = _checked_changes(plan.path, meta, config, plugin, branch)
    if branch:
        inside = plan.path.resolve().parent == root.resolve()
        plan.abandoned = [
            p
            for p in own
            if p not in plan.damaged and (checkpoint_step(p) > plan.step or (not inside and p != plan.path))
        ]
        _noted_abandoned(plan, root, f"the rewind to {plan.path}")
    return plan


def _newest_intact(plan: ResumePlan, own: list[Path], groups: tuple[str, ...]) -> None:
    """Pick the newest checkpoint that verifies; the newer damaged ones are listed (and retired)."""
    problems = []
    for candidate in reversed(own):
        problem = verify_checkpoint(candidate, groups)
        if problem is None:
            plan.path = candidate
            break
        plan.damaged.append(candidate)
        problems.append(problem)
    if plan.path is None and problems:
        raise UserError(
            "no intact checkpoint to resume from: "
            + "; ".join(problems)
            + ". Set `train.resume = false` to start fresh (the damaged checkpoints move to checkpoints/retired/), "
            "or `train.resume = <path>` to a copy of the run."
        )
    for path, problem in zip(plan.damaged, problems, strict=True):
        plan.notices.append(
            f"checkpoint {path.name} is damaged ({problem}); resuming from the newest intact one, "
            f"{plan.path.name}, and moving {path.name} to checkpoints/retired/"
        )


def _noted_abandoned(plan: ResumePlan, root: Path, why: str) -> ResumePlan:
    if plan.abandoned:
        names = ", ".join(p.name for p in plan.abandoned)
        plan.notices.append(
            f"{why}: the checkpoints {names} of {root} belong to another timeline; they move to "
            "checkpoints/retired/ (out of rotation and of `train.resume = true`)"
        )
    return plan


def _checked_changes(
    path: Path, meta: dict[str, Any], config: dict[str, Any], plugin: str, branch: bool
) -> dict[str, tuple[Any, Any]]:
    """The allowed config changes against the checkpoint's recorded config; refused ones raise."""
    recorded = meta.get("config")
    if not isinstance(recorded, dict):
        return {}
    old = {**recorded, PLUGIN_KEY: meta.get("plugin", plugin)}
    new = {**json.loads(json.dumps(config)), PLUGIN_KEY: plugin}
    allowed, refused = config_changes(old, new, branch)
    if refused:
        listed = "; ".join(f"`{k}` {v[0]!r} -> {v[1]!r}" for k, v in refused.items())
        raise UserError(
            f"resuming from {path} with a changed config: {listed}. A resume continues the checkpoint's "
            "optimizer, schedule and data, so these keys must keep the checkpoint's values (its config is in "
            f"{path / 'meta.json'}). Set them back, or start a new run: another `train.output_dir`, or "
            "`train.resume = false` (this folder's checkpoints then move to checkpoints/retired/)."
        )
    return allowed


def refuse_going_back(plan: ResumePlan, total_steps: int, root: Path, limit: str) -> None:
    """A resume never goes back: a checkpoint past the run's `total_steps` (a shorter re-run into the folder of a
    longer one) would end at once and overwrite step `total_steps`'s checkpoint and the export with its later
    weights. `limit` says what sets `total_steps`.

    Raises:
        UserError: naming the checkpoint's step and the ways out; nothing is written.
    """
    if plan.path is None or plan.step <= total_steps:
        return
    earlier = [p for p in list_checkpoints(root) if (checkpoint_step(p) or 0) <= total_steps]
    rewind = (
        f'rewind to an earlier checkpoint with `train.resume = "{earlier[-1]}"`, '
        if earlier and earlier[-1] != plan.path
        else ""
    )
    raise UserError(
        f"{plan.path} is at step {plan.step}, past the {total_steps} steps this run plans ({limit}): a resume "
        f"cannot go back, and finishing here would overwrite step {total_steps}'s checkpoint and the export with "
        f"step {plan.step}'s weights. To continue that run set `train.max_num_steps` to at least {plan.step} (or "
        f"raise `train.epoch`); for a shorter run {rewind}give it another `train.output_dir`, or start fresh with "
        "`train.resume = false` (this folder's checkpoints then move to checkpoints/retired/). Nothing was written."
    )


def apply_plan(plan: ResumePlan, root: Path, run_dir: Path) -> list[str]:
    """Retire the plan's damaged and abandoned checkpoints and append the resume to `resumes.jsonl` (with the
    allowed config changes it applied); returns notices."""
    notices = []
    for paths, why in ((plan.damaged, "damaged"), (plan.abandoned, "abandoned")):
        folder = retire(paths, root, why)
        if folder is not None:
            notices.append(f"moved {', '.join(p.name for p in paths)} to {folder}")
    if plan.path is not None:
        record = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "checkpoint": str(plan.path),
            "step": plan.step,
            "changed": {k: {"old": v[0], "new": v[1]} for k, v in plan.changes.items()},
        }
        log = run_dir / "resumes.jsonl"
        before = log.read_bytes() if log.is_file() and not log.is_symlink() else b""
        write_file(log, before + (json.dumps(record) + "\n").encode(), fail_at="resume_record")
        for key, (old, new) in plan.changes.items():
            notices.append(f"resume changes `{key}`: {old!r} -> {new!r}")
    return notices
