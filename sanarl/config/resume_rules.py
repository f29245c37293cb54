"""Which config keys a resumed run may change (docs/reliability.md, "Resuming with another config").

A checkpoint records the config and plugin of the run that wrote it. A resume compares them key by key with the
config it is given: a change of a key in `RESUME_MAY_CHANGE` (run length, checkpointing, validation cadence,
validation and its reward-hacking guard, the user's run components, logging, speed and memory settings that leave
the maths alone) is applied and recorded; any other change (model, LoRA shape, method, optimizer, learning rate,
batch, data, rewards, the plugin) is refused, because the checkpoint's optimizer and schedule state would silently
keep the old values, or the weights would continue on other data. A rewind (`train.resume = <path>`) starts a new
timeline from that checkpoint and may also change the
keys in `BRANCH_MAY_CHANGE`.
"""

from __future__ import annotations

from typing import Any

RESUME_MAY_CHANGE = frozenset(
    {
        "train.output_dir",
        "train.resume",
        "train.epoch",
        "train.max_num_steps",
        "train.max_wall_minutes",
        "train.compile",
        "train.components",
        "train.ckpt",
        "validation",
        "logging",
        "policy.model_gradient_checkpointing",
        "policy.diffusers.offload",
        "policy.diffusers.sample.eval_num_steps",
        "policy.diffusers.sample.eval_solver",
        "policy.diffusers.sample.eval_noise_level",
        "rollout.compile_mode",
        "rollout.reward_workers",
        "rollout.reward_deadline_s",
    }
)
"""Key paths (a section path covers every key below it) whose change a resume applies."""

BRANCH_MAY_CHANGE = frozenset({"train.seed"})
"""Further key paths a rewind to an explicit checkpoint (`train.resume = <path>`) may change."""

PLUGIN_KEY = "plugin"
"""The name under which the plugin's change is reported (it is not a config key)."""


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key path -> value of a nested dict (lists and scalars are leaves)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else key))
    return out


def may_change(key: str, branch: bool) -> bool:
    """Whether a resume (`branch`: a rewind to an explicit checkpoint) may change `key`."""
    allowed = RESUME_MAY_CHANGE | BRANCH_MAY_CHANGE if branch else RESUME_MAY_CHANGE
    parts = key.split(".")
    return any(".".join(parts[:n]) in allowed for n in range(1, len(parts) + 1))


def config_changes(
    old: dict[str, Any], new: dict[str, Any], branch: bool
) -> tuple[dict[str, tuple[Any, Any]], dict[str, tuple[Any, Any]]]:
    """(allowed, refused): key -> (old value, new value) for every key that differs between two configs as
    `config_to_dict` gives them (with `PLUGIN_KEY` for the plugin when both hold it)."""
    missing = "<absent>"
    a, b = flatten(old), flatten(new)
    allowed: dict[str, tuple[Any, Any]] = {}
    refused: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(a) | set(b)):
        before, after = a.get(key, missing), b.get(key, missing)
        if before == after:
            continue
        (allowed if key != PLUGIN_KEY and may_change(key, branch) else refused)[key] = (before, after)
    return allowed, refused
