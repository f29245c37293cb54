"""Cosmos-RL drop-in: lookups over Cosmos-RL's key table (`key_table.py`), its dataset launchers, reward names
and defaults (docs/cosmos-rl.md).

A key in none of the tables of `key_table.py` (and not in sanarl's schema) is still an error with a did-you-mean.
Cosmos-RL's pydantic models ignore unknown keys silently; where its own presets rely on that by accident
(`timestep_fraction`), the note says what Cosmos-RL really ran, and sanarl does what the file says.

Also here, as data with small lookups: Cosmos-RL's dataset launcher names (`PLUGINS`, used by `sanarl/config/dataset_plugins.py`), its
reward-service names (`REWARDS`, used by `sanarl validate`), its defaults where they differ from sanarl's
(`COSMOS_DEFAULTS`) and its per-rank SFT batch (`adapt_sft_batch`). The loader's build hooks (`schema_hooks.py`)
call `treatment`, `known_children`, `is_table`, `map_value` and `check_choice`; `sanarl/config/loader.py` calls
`adapt_sft_batch` and `inferred_type_note`. The tables themselves stay importable from here.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from sanarl.config.cosmos.key_table import (
    ARRAY_TABLES,
    FREE_TABLES,
    NOT_APPLICABLE,
    RENAMED,
    SHADOWED,
    SOURCE,
    UNSET,
    UNSUPPORTED_FORMS,
    UNSUPPORTED_VALUES,
    VALUE_MAPS,
    NotApplicable,
)
from sanarl.config.cosmos.wfm_key_table import WFM_RL_NOT_APPLICABLE, WFM_RL_RENAMED, WFM_RL_SOURCE

__all__ = [
    "ARRAY_TABLES",
    "COSMOS_DEFAULTS",
    "FREE_TABLES",
    "GRPO_HINTS",
    "NOT_APPLICABLE",
    "PLUGINS",
    "PLUGIN_PREFIX",
    "REFUSED_PLUGINS",
    "RENAMED",
    "REWARDS",
    "REWARD_SERVICE_SOURCE",
    "SHADOWED",
    "SOURCE",
    "UNSUPPORTED_FORMS",
    "UNSUPPORTED_VALUES",
    "VALUE_MAPS",
    "WFM_RL_NOT_APPLICABLE",
    "WFM_RL_RENAMED",
    "WFM_RL_SOURCE",
    "NotApplicable",
    "adapt_sft_batch",
    "check_choice",
    "default_differences",
    "inferred_type_note",
    "is_table",
    "known_children",
    "map_value",
    "move_wfm_rl",
    "planned_world_size",
    "plugin_for",
    "report",
    "reward_lines",
    "strip_indices",
    "treatment",
]


def strip_indices(path: str) -> str:
    """`a.b[0].c` -> `a.b.c` (array items share one entry)."""
    return re.sub(r"\[\d+\]", "", path)


def treatment(path: str) -> NotApplicable | None:
    """How the Cosmos-RL key at dotted `path` is treated when sanarl's schema lacks it, or None if unknown."""
    plain = strip_indices(path)
    if plain in NOT_APPLICABLE:
        return NOT_APPLICABLE[plain]
    for key, rule in WFM_RL_NOT_APPLICABLE.items():  # [model.rl] keys, their sub-tables' keys included
        if plain == key or plain.startswith(key + "."):
            return rule
    if plain in SHADOWED:
        return SHADOWED[plain]
    root = plain.split(".")[0]
    if root in FREE_TABLES:
        return NotApplicable(FREE_TABLES[root])
    return None


def known_children(path: str) -> list[str]:
    """Cosmos-RL keys directly under the not-applicable table `path` (empty when `path` is no such table)."""
    plain = strip_indices(path) + "."
    names = {key[len(plain) :].split(".")[0] for key in NOT_APPLICABLE if key.startswith(plain)}
    return sorted(names)


def is_table(path: str) -> bool:
    """Whether the dotted `path` is a not-applicable Cosmos-RL table (all of whose keys are dropped)."""
    return bool(known_children(path)) and strip_indices(path) not in NOT_APPLICABLE


def map_value(path: str, value: Any) -> tuple[Any, str | None]:
    """`value` of honoured key `path` in sanarl's terms, and a note when it was mapped (None otherwise).

    A value Cosmos-RL accepts but sanarl cannot run raises `ValueError` with the reason.
    """
    plain = strip_indices(path)
    form = UNSUPPORTED_FORMS.get(plain)
    if form is not None and isinstance(value, form[0]) and not isinstance(value, bool):
        raise ValueError(f"`{plain}` = {value!r} is {form[1]}.")
    if plain.endswith("dataset.split") and isinstance(value, list):
        if len(value) == 1 and isinstance(value[0], str):
            return value[0], f"`{plain}` = {value!r} is read as {value[0]!r} (one split)."
        raise ValueError(f"`{plain}` = {value!r}: sanarl reads one split per dataset; give one name.")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return value, None
    refused = UNSUPPORTED_VALUES.get(plain, {})
    if value in refused:
        raise ValueError(f"`{plain}` = {value!r} is {refused[value]}.")
    for cosmos_value, (new, why) in VALUE_MAPS.get(plain, {}).items():
        if type(cosmos_value) is type(value) and cosmos_value == value:
            return new, f"`{plain}` = {value!r} is read as {new!r} ({why})."
    return value, None


def check_choice(path: str, value: Any) -> None:
    """Raise ValueError when a not-applicable key has a value Cosmos-RL itself would refuse."""
    rule = treatment(path)
    if rule is not None and rule.choices and value not in rule.choices:
        shown = ", ".join(repr(c) for c in rule.choices)
        raise ValueError(f"`{strip_indices(path)}` = {value!r} is not one of Cosmos-RL's values ({shown}).")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def report(values: dict[str, Any]) -> list[str]:
    """Lines for `validate`: the dropped keys grouped by what sanarl does instead, then a warning for each key whose
    value Cosmos-RL would act on (its `neutral` value differs)."""
    groups: dict[str, list[str]] = {}
    warnings = []
    for path, value in values.items():
        rule = treatment(path) or NotApplicable("")
        groups.setdefault(rule.instead, []).append(f"{path} = {_shown(value)}")
        if rule.neutral is not UNSET and value != rule.neutral:
            warnings.append(
                f"`{path}` = {_shown(value)} asks Cosmos-RL for something sanarl does not do ({rule.instead}); "
                f"sanarl runs as with {rule.neutral!r}."
            )
    lines = [f"not applicable: {', '.join(keys)}. Instead: {instead}." for instead, keys in groups.items()]
    return lines + [f"warning: {w}" for w in warnings]


def planned_world_size(values: dict[str, Any]) -> int:
    """Ranks a preset was written for: Cosmos-RL's policy.parallelism dp_shard_size x dp_replicate_size, else 1.

    `values` are the dropped Cosmos-RL keys with the overrides applied (`LoadedConfig.cosmos`).
    """
    sizes = [values.get(f"policy.parallelism.{k}", 1) for k in ("dp_shard_size", "dp_replicate_size")]
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes):
        return sizes[0] * sizes[1]
    return 1


# --- dataset plugins ------------------------------------------------------------------------------------------

PLUGIN_PREFIX = "cosmos_rl.tools.dataset."
"""Cosmos-RL's dataset launchers are modules under this package (its guide passes them as the positional argument)."""

PLUGINS: dict[str, tuple[str, str]] = {
    "diffusers_dataset": (
        "sanarl.datasets.diffusers_dataset",
        "SFT on a folder of <stem>.json captions with <stem>.jpg/.png images or <stem>.mp4 clips "
        "(train.train_policy.dataset.local_dir), as Cosmos-RL's",
    ),
    "diffusion_nft": (
        "sanarl.datasets.diffusion_nft",
        "RL prompt sets by train.train_policy.dataset.name (pickscore, ocr, geneval, drawbench, dance_grpo_t2v) or "
        "a prompt file in local_dir",
    ),
}
"""Cosmos-RL launcher (last name) -> (sanarl plugin, what it reads)."""

REFUSED_PLUGINS: dict[str, str] = {
    "dummy_diffusers_sft": (
        "Cosmos-RL's random-noise smoke-test data has no sanarl counterpart; for a data-free smoke test use "
        "`sanarl.datasets.shapes` (synthetic captioned images) with a tiny preset such as presets/tiny-shapes-sft.toml"
    ),
    "wfm_rl": (
        "Cosmos-RL's world-foundation-model (Cosmos-Predict2.5) launcher; sanarl does not train Cosmos-Predict "
        "models. For SANA, SANA-Video or SD3.5 use `sanarl.datasets.diffusion_nft` (RL) or "
        "`sanarl.datasets.diffusers_dataset` (SFT)"
    ),
}
"""Cosmos-RL diffusion launchers sanarl cannot stand in for -> why, and what to use."""


def plugin_for(spec: str) -> tuple[str, str] | None:
    """(sanarl spec, one-line notice) for a Cosmos-RL dataset launcher name or path; None for other specs.

    Raises ValueError (with the reason and the alternative) for Cosmos-RL launchers sanarl has no counterpart of.
    """
    text = spec.strip().replace("\\", "/")
    match = re.fullmatch(r"(?:\./)?cosmos_rl[./]tools[./]dataset[./](\w+)(?:\.py)?", text)
    if match is None:
        return None
    name = match.group(1)
    if name in PLUGINS:
        target, what = PLUGINS[name]
        return target, f"`{spec.strip()}` is Cosmos-RL's launcher; using sanarl's `{target}` ({what})."
    if name in REFUSED_PLUGINS:
        raise ValueError(f"dataset plugin `{spec.strip()}` is {REFUSED_PLUGINS[name]}.")
    known = ", ".join(f"`{PLUGIN_PREFIX}{n}`" for n in PLUGINS)
    raise ValueError(
        f"dataset plugin `{spec.strip()}` is one of Cosmos-RL's LLM / VLA launchers (sanarl trains diffusion models); "
        f"Cosmos-RL's diffusion launchers {known} map to sanarl's plugins."
    )


# --- rewards --------------------------------------------------------------------------------------------------

REWARD_SERVICE_SOURCE = "reward_service/cosmos_rl_reward/configs/rewards.toml"
"""Where Cosmos-RL's reward-service names were read (same repository and commit as `SOURCE`)."""

REWARDS: dict[str, str] = {
    "pickscore": "pickscore",
    "ocr": "ocr",
    "hpsv2": "hpsv2",
    "image_reward": "imagereward",
    "gen_eval": "geneval",
    "dance_grpo": "dance_grpo",
    "hpsv3": "hpsv3",
    "unified_reward": "unified_reward",
    "cosmos_reason1": "cosmos_reason1",
}
"""Cosmos-RL reward-service `reward_type` -> the sanarl registry name of the same reward (where sanarl has it, the
registry decides; the names are the same except image_reward and gen_eval)."""


def reward_lines(names: list[str], remote: bool, known: list[str]) -> list[str]:
    """Where each reward of a run is scored, for `validate`; raises ValueError naming a reward nobody can score.

    `known` are the sanarl registry's names (`sanarl.rewards.registry.known_rewards()`), so rewards added to the
    registry later become valid without changing this table.
    """
    lines = []
    for name in names:
        sanarl_name = REWARDS.get(name, name)
        if name in known:
            where = (
                f"on the reward service (enable reward_type = {name!r} in its rewards.toml; the run checks its "
                "/health at start)"
                if remote
                else "in-process"
            )
            lines.append(f"reward `{name}`: scored {where}.")
        elif name in REWARDS and sanarl_name in known:
            fix = f'set name = "{sanarl_name}"'
            if remote:
                lines.append(
                    f"warning: reward `{name}` is Cosmos-RL's name; sanarl's reward service calls it "
                    f"`{sanarl_name}` ({fix} for sanarl's service; keep `{name}` only with Cosmos-RL's own service)."
                )
            else:
                raise ValueError(
                    f"reward `{name}` is Cosmos-RL's reward-service name; sanarl's is `{sanarl_name}`: {fix}"
                )
        elif name in REWARDS and remote:
            lines.append(
                f"warning: reward `{name}` is served by Cosmos-RL's reward service (reward_type {name!r}), but sanarl "
                "has no such reward yet, so sanarl's reward service cannot score it: the run stops at start unless "
                "REMOTE_REWARD_* point to a Cosmos-RL reward service with it enabled. Otherwise replace it (e.g. "
                'name = "pickscore", scored frame by frame for videos).'
            )
        elif name in REWARDS:
            raise ValueError(
                f"reward `{name}` is one of Cosmos-RL's reward-service rewards, which sanarl does not have in-process; "
                "score it remotely (train.train_policy.use_remote_reward = true with a Cosmos-RL reward service that "
                'enables it) or replace it (e.g. name = "pickscore")'
            )
        elif remote:
            close = difflib.get_close_matches(name, [*known, *REWARDS], n=1)
            hint = f" (did you mean `{close[0]}`?)" if close else ""
            lines.append(
                f"warning: reward `{name}` is not a sanarl reward{hint}; only a reward service whose `plugins` register "
                "it can score it (the run checks the service's /health at start)."
            )
    return lines


# --- batch semantics ------------------------------------------------------------------------------------------


def adapt_sft_batch(cfg: Any, values: dict[str, Any]) -> str | None:
    """Cosmos-RL's SFT reads `train.train_batch_per_replica` per data-parallel rank (its GRPO reads it per replica;
    Cosmos-RL's own worker code notes the inconsistency), sanarl's is the global batch of one optimizer step. For a
    plain SFT config that declares Cosmos-RL's `[policy.parallelism]`, scale it by the declared ranks so the recipe
    keeps its global batch on any number of machines. Returns the note, or None when nothing changed."""
    tp = cfg.train.train_policy
    declared = any(key.startswith("policy.parallelism.") for key in values)
    ranks = planned_world_size(values)
    if not declared or tp.type != "sft" or tp.trainer_type != "" or ranks == 1:
        return None
    per_rank = cfg.train.train_batch_per_replica
    cfg.train.train_batch_per_replica = per_rank * ranks
    return (
        f"`train.train_batch_per_replica` = {per_rank} is per data-parallel rank in Cosmos-RL's SFT, and "
        f"[policy.parallelism] declares {ranks} ranks: sanarl reads it as the global batch {per_rank * ranks} "
        f"(sanarl's train_batch_per_replica is the batch of one optimizer step over all ranks; with "
        "`--set policy.parallelism.dp_shard_size=1` it stays as written)."
    )


# --- defaults -------------------------------------------------------------------------------------------------

COSMOS_DEFAULTS: dict[str, Any] = {
    "policy.model_gradient_checkpointing": True,
    "policy.diffusers.offload": True,
    "policy.diffusers.timesteps_fraction": 1.0,
    "policy.diffusers.weight_copy_decay_type": 0,
    "policy.diffusers.sample.num_steps": 40,
    "policy.diffusers.sample.eval_num_steps": 40,
    "policy.diffusers.sample.guidance_scale": 4.5,
    "policy.diffusers.sample.noise_level": 1.0,
    "policy.diffusers.sample.deterministic_sampling": False,
    "policy.diffusers.sample.solver": "dpm2",
    "policy.lora.r": 8,
    "policy.lora.lora_alpha": 8.0,
    "policy.lora.init_lora_weights": True,
    "rollout.n_generation": 16,
    "train.optm_lr": 1e-6,
    "train.optm_warmup_steps": 20,
    "train.epsilon": 1e-6,
    "train.ema_decay": 0.9999,
    "train.param_dtype": "bfloat16",
    "train.compile": True,
    "train.ckpt.enable_checkpoint": False,
    "train.ckpt.save_freq": 20,
    "train.ckpt.max_keep": 5,
    "train.train_policy.remote_reward.reward_clip_min": -5.0,
    "train.train_policy.remote_reward.reward_clip_max": 5.0,
    "train.train_policy.remote_reward.reward_fns.clip_min": -5.0,
    "train.train_policy.remote_reward.reward_fns.clip_max": 5.0,
    "validation.freq": 20,
    # not a Cosmos-RL key: its SANA text_embedding encodes prompts without the complex human instruction
    "policy.diffusers.complex_human_instruction": False,
}
"""Cosmos-RL's defaults (`SOURCE`) where they differ from sanarl's and change what a run does."""

_SANA_ONLY = ("policy.diffusers.complex_human_instruction",)

_RL_ONLY = (
    "rollout.",
    "train.train_policy.remote_reward.",
    "policy.diffusers.timesteps_fraction",
    "policy.diffusers.weight_copy_decay_type",
)


def _get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def default_differences(cfg: Any, given: set[str]) -> list[str]:
    """`key = sanarl value (Cosmos-RL's default: X)` for each key of `COSMOS_DEFAULTS` that the run does not set
    (`given`: the keys the file and overrides set) and whose sanarl default differs; RL keys only for RL runs, LoRA
    keys only with LoRA, reward clips per reward entry."""
    rl = cfg.train.train_policy.type == "grpo"
    out = []
    for path, cosmos in COSMOS_DEFAULTS.items():
        if (path.startswith(_RL_ONLY) and not rl) or (
            path.startswith("policy.lora.") and cfg.policy.lora is None
        ):
            continue
        if path in _SANA_ONLY and "sana" not in cfg.policy.model_name_or_path.lower():
            continue
        if ".reward_fns." in path:
            attr = path.rpartition(".")[2]
            fns = cfg.train.train_policy.remote_reward.reward_fns
            values = [
                (f"{path.rpartition('.')[0]}[{i}].{attr}", getattr(fn, attr)) for i, fn in enumerate(fns)
            ]
        else:
            values = [(path, _get(cfg, path))]
        out += [f"{p} = {v!r} (Cosmos-RL's: {cosmos!r})" for p, v in values if p not in given and v != cosmos]
    return out


GRPO_HINTS = ("temperature", "epsilon_low", "epsilon_high", "kl_beta", "use_remote_reward")
"""`[train.train_policy]` keys from which Cosmos-RL infers `type = "grpo"` when the type is not given."""


def inferred_type_note(given: set[str], values: dict[str, Any]) -> str | None:
    """A note when `train.train_policy.type` is left out but Cosmos-RL would infer "grpo" from the other keys."""
    if "train.train_policy.type" in given:
        return None
    present = {key.rpartition(".")[2] for key in [*given, *values] if key.startswith("train.train_policy.")}
    hints = [key for key in GRPO_HINTS if key in present]
    if not hints:
        return None
    return (
        f"`train.train_policy.type` is not set, so sanarl trains SFT (its default); Cosmos-RL would infer "
        f'type = "grpo" from {", ".join(hints)}. Set train.train_policy.type to say which.'
    )


def move_wfm_rl(data: dict[str, Any]) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """The root TOML table with Cosmos-RL's `[model.rl]` (its world-model RL config, DDRL's keys) read into sanarl's
    keys (`WFM_RL_RENAMED`; `guidance` g becomes the scale 1 + g); returns (table, notes, dropped keys -> values).

    Keys without a meaning here (`WFM_RL_NOT_APPLICABLE`) are dropped; an unknown `[model.rl]` key, a key given both
    ways, or other `[model]` keys raise ValueError naming them. Without a `[model.rl]` table `data` is returned as is.
    """
    model = data.get("model")
    if not isinstance(model, dict) or "rl" not in model:
        return data, [], {}
    if set(model) != {"rl"}:
        extra = ", ".join(f"model.{k}" for k in sorted(set(model) - {"rl"}))
        raise ValueError(
            f"`{extra}`: of Cosmos-RL's world-model [model] table sanarl reads only [model.rl] (DDRL's keys); "
            "set the model with policy.model_name_or_path and remove the other [model] keys."
        )
    out = {k: v for k, v in data.items() if k != "model"}
    notes: list[str] = []
    dropped: dict[str, Any] = {}
    for path, value in _flatten("model.rl", model["rl"]):
        if path in WFM_RL_RENAMED:
            target, what = WFM_RL_RENAMED[path]
            if (
                path == "model.rl.guidance"
                and isinstance(value, (int, float))
                and not isinstance(value, bool)
            ):
                value = 1.0 + value
            _place(out, target, value, path)
            notes.append(
                f"`{path}` is read as `{target}` = {value!r} ({what}; Cosmos-RL's world-model RL key)."
            )
        elif treatment(path) is not None:
            dropped[path] = value
        else:
            known = [
                *(k.rpartition(".")[2] for k in WFM_RL_RENAMED),
                *(k.rpartition(".")[2] for k in WFM_RL_NOT_APPLICABLE),
            ]
            close = difflib.get_close_matches(path.rpartition(".")[2], known, n=1, cutoff=0.6)
            hint = f"; did you mean `{close[0]}`?" if close else ""
            raise ValueError(
                f"unknown key `{path}`{hint} (Cosmos-RL's [model.rl] keys: {', '.join(sorted(set(known)))}). Fix its "
                "spelling or remove it."
            )
    return out, notes, dropped


def _flatten(prefix: str, table: Any) -> list[tuple[str, Any]]:
    """(dotted path, value) of every leaf of `table`; a not-applicable sub-table stays one leaf."""
    if not isinstance(table, dict) or prefix in WFM_RL_NOT_APPLICABLE:
        return [(prefix, table)]
    return [item for key, value in table.items() for item in _flatten(f"{prefix}.{key}", value)]


def _place(data: dict[str, Any], dotted: str, value: Any, source: str) -> None:
    """Set `dotted` in the nested table `data`; ValueError when the file already sets it."""
    *parents, key = dotted.split(".")
    table = data
    for part in parents:
        table = table.setdefault(part, {})
        if not isinstance(table, dict):
            raise ValueError(f"`{source}` maps to `{dotted}`, but `{part}` is not a table in this file.")
    if key in table:
        raise ValueError(
            f"both `{source}` and `{dotted}` are set; they are the same setting (`{source}` is Cosmos-RL's "
            f"world-model spelling). Keep only `{dotted}`."
        )
    table[key] = value
