"""Cosmos-RL's config keys as data: how sanarl treats each key of Cosmos-RL's config schema (docs/cosmos-rl.md).

Every key that Cosmos-RL's config models define (cosmos_rl/policy/config/__init__.py of nvidia-cosmos/cosmos-rl,
at the commit in `SOURCE`) is one of:

- honoured: a field of `sanarl.config.schema` with the same name and meaning (not listed here);
- renamed: Cosmos-RL's key is read as a sanarl key (`RENAMED`), with a note;
- not applicable: accepted, dropped, and reported by `sanarl validate` with what sanarl does instead
  (`NOT_APPLICABLE`); its value is kept in `LoadedConfig.cosmos` (the planner reads the parallelism from there).

Values of honoured keys that Cosmos-RL spells differently are mapped with a note (`VALUE_MAPS`); values and
forms sanarl cannot run are refused with the reason (`UNSUPPORTED_VALUES`, `UNSUPPORTED_FORMS`). The lookups over
these tables are in `drop_in.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SOURCE = {
    "repository": "nvidia-cosmos/cosmos-rl",
    "path": "cosmos_rl/policy/config/__init__.py",
    "commit": "89f2e5b5c817d99a240f1194ce37239ceb6f058a",
}
"""Where the key list below was read."""

UNSET = object()
"""`NotApplicable.neutral` of a key without a neutral value."""


@dataclass(frozen=True)
class NotApplicable:
    """A Cosmos-RL key sanarl accepts and drops."""

    instead: str
    """What sanarl does instead (shown by `validate`)."""
    neutral: Any = UNSET
    """The value with which dropping the key changes nothing; any other value adds a warning note."""
    choices: tuple[Any, ...] = ()
    """Values Cosmos-RL itself accepts; others are errors, as in Cosmos-RL."""


# --- not applicable keys, grouped by the reason ---------------------------------------------------------------

_CONTROLLER = (
    "sanarl has no controller, Redis or replica processes: one `sanarl` (or `accelerate launch -m sanarl`) "
    "command runs rollout and training in the same processes (what Cosmos-RL calls colocated)"
)
_PARALLEL = (
    "sanarl runs data-parallel through accelerate (DDP, or FSDP with an accelerate config; docs/multi-gpu.md); "
    "`sanarl validate` plans for dp_shard_size x dp_replicate_size ranks"
)
_FSDP = "FSDP settings come from the accelerate config of the launch (docs/multi-gpu.md)"
_LLM = "an LLM / VLM setting of Cosmos-RL; sanarl trains diffusion models only"
_DATALOADER = (
    "sanarl's data order is a pure function of (train.seed, step, rank), so resumes continue exactly"
)
_WEIGHT_SYNC = (
    "sanarl's rollouts read the trained weights in place (DiffusionNFT's behaviour policy is the `old` LoRA "
    "adapter), so there is nothing to synchronise and nothing runs stale"
)
_PROFILER = "sanarl has no built-in profiler; run under `nsys` or `torch.profiler` yourself"
_DISTILL = "sanarl has no distillation task"
_VLA = "sanarl has no VLA (robot policy) task"
_UPLOAD = "sanarl writes checkpoints and exports under train.output_dir only; upload them yourself"
_QUANT_TRAIN = (
    "sanarl trains in train.param_dtype; quantization is for rollout copies only (rollout.family / "
    "rollout.preview_precision)"
)
_SCHEDULE = "sanarl's learning rate: linear warmup over train.optm_warmup_steps from 0, then constant"
_SEED = "randomness comes from train.seed (rollout noise included: a function of seed, step and rank)"


def _group(section: str, keys: str, instead: str, **neutral: Any) -> dict[str, NotApplicable]:
    """`section.key` -> NotApplicable(instead) for each space-separated key; `neutral` gives per-key neutral values."""
    out = {}
    for key in keys.split():
        path = f"{section}.{key}" if section else key
        out[path] = NotApplicable(instead, neutral.get(key, UNSET))
    return out


def _parallelism(section: str) -> dict[str, NotApplicable]:
    keys = (
        "n_init_replicas tp_size cp_size ep_size dp_shard_size pp_size pp_dynamic_shape pp_micro_batch_size "
        "dp_replicate_size pp_schedule pp_layers_per_stage"
    )
    return _group(section, keys, _PARALLEL)


NOT_APPLICABLE: dict[str, NotApplicable] = {
    **_group("", "redis eth_ips", _CONTROLLER),
    "mode": NotApplicable(_CONTROLLER, choices=("disaggregated", "colocated", "colocated_separated")),
    # [train]
    **_group(
        "train",
        "fsdp_reduce_dtype fsdp_offload fsdp_reshard_after_forward async_tp_enabled activation_offload",
        _FSDP,
        fsdp_offload=False,
        async_tp_enabled=False,
        activation_offload=False,
    ),
    **_group(
        "train",
        "master_dtype",
        "trained parameters and optimizer state stay in float32; train.param_dtype is the autocast dtype",
        master_dtype="float32",
    ),
    **_group(
        "train",
        "transfer_dtype logprob_dtype",
        "there is no policy-to-rollout transfer; log-probabilities (Flow-GRPO) are computed in float32",
    ),
    **_group("train", "sync_weight_interval coalesce_weight_sync", _WEIGHT_SYNC, sync_weight_interval=1),
    **_group(
        "train",
        "non_text sequence_packing fa_version",
        _LLM + " (non_text marks multimodal inputs, which diffusion always is)",
    ),
    **_group(
        "train", "local_dataset force_use_hf", "datasets come from the plugin given on the command line"
    ),
    **_group(
        "train",
        "timestamp",
        "runs write to train.output_dir itself (no timestamped sub-folder), so `train.resume = true` finds them",
    ),
    **_group(
        "train",
        "deterministic",
        "sanarl's data order and noise are seeded functions of (seed, step, rank); kernels keep torch's defaults",
        deterministic=False,
    ),
    **_group(
        "train",
        "save_ckpt_at_exit signal_to_handle",
        "checkpoints are written every train.ckpt.save_freq steps and at the end; an interrupted run resumes "
        "from the last one with `--set train.resume=true`",
    ),
    **_group(
        "train",
        "optm_warmup_start_factor optm_decay_ratio optm_decay_type optm_min_lr_factor",
        _SCHEDULE,
        optm_warmup_start_factor=0.0,
        optm_min_lr_factor=0.0,
    ),
    **_group("train.fp8", "enable_fp8 fp8_recipe quant_recipe", _QUANT_TRAIN, enable_fp8=False),
    **_group("train.fp4", "enable_fp4 fp4_recipe quant_recipe", _QUANT_TRAIN, enable_fp4=False),
    # [train.ckpt]
    "train.ckpt.save_mode": NotApplicable(
        "checkpoints are saved synchronously (written to a temporary folder, then renamed), so a crash never "
        "leaves a half-written one",
        choices=("async", "sync"),
    ),
    **_group(
        "train.ckpt",
        "save_freq_in_epoch",
        "checkpoints follow train.ckpt.save_freq (optimizer steps) only",
        save_freq_in_epoch=0,
    ),
    **_group("train.ckpt", "upload_hf hf_repo_name upload_s3 s3_bucket s3_prefix", _UPLOAD, upload_hf=False),
    # [train.train_policy]
    **_group(
        "train.train_policy",
        "dataloader_shuffle dataloader_seed dataloader_batch_size enable_dataset_cache dataloader_num_workers "
        "dataloader_prefetch_factor dataloader_drop_last data_dispatch_as_rank_in_mesh dataloader_broadcast "
        "balance_dp_token enable_dp_load_balancing load_balanced_pool_size load_balanced_max_tokens_for_batch "
        "load_balanced_batching_strategy load_balanced_batches_per_optimizer_step",
        _DATALOADER,
    ),
    **_group(
        "train.train_policy",
        "conversation_column_name system_prompt variant prompt_column_name response_column_name reward_function "
        "filter_reward_metric group_reward_calculation temperature epsilon_low epsilon_high positive_nll_coef "
        "lower_bound_ratio loss_type unbiased_loss_max_tokens unbiased_advantage algo unbiased_kl_estimate "
        "off_policy_masking_delta aipo_rho entropy_coeff max_token_len_per_mini_batch min_filter_prefix_tokens "
        "use_decoupled_loss behav_imp_weight_cap rollout_as_token_ids collect_rollout_logprobs "
        "use_rollout_logprobs_for_loss",
        _LLM + "; diffusion rewards are [[train.train_policy.remote_reward.reward_fns]]",
    ),
    **_group(
        "train.train_policy.overlong_reward",
        "enable_overlong_penalty buffer_length penalty_factor",
        _LLM,
    ),
    **_group(
        "train.train_policy",
        "bypass_reward",
        "every RL step is scored by the configured rewards",
        bypass_reward=False,
    ),
    **_group(
        "train.train_policy",
        "mu_iterations batch_size_per_optimize",
        "gradient updates per rollout are train.train_policy.optimizer_steps_per_rollout",
        mu_iterations=1,
    ),
    **_group(
        "train.train_policy",
        "allowed_outdated_steps on_policy uncentralized_training outdated_rollout_fetch_batch_size "
        "max_inflight_steps max_retry_for_on_policy",
        _WEIGHT_SYNC,
    ),
    **_group(
        "train.train_policy",
        "reference_reset_interval reset_optimizer_with_reference",
        "the KL reference (train.train_policy.kl_beta) is the frozen base model throughout",
    ),
    **_group(
        "train.train_policy.remote_reward",
        "batch_size",
        "each prompt group (rollout.n_generation images) is one reward request; the service batches requests "
        "itself ([workers] batch_images)",
    ),
    # [rollout]
    **_parallelism("rollout.parallelism"),
    **_group(
        "rollout",
        "enforce_eager include_stop_str_in_output gpu_memory_utilization enable_chunked_prefill "
        "max_response_length n_generation_to_batch quantization vllm_use_flashinfer async_r2r_sync "
        "broadcast_all_params",
        _LLM + " (the vLLM / TensorRT-LLM rollout engines)",
    ),
    **_group(
        "rollout.sampling_config",
        "temperature top_p top_k repetition_penalty use_flashinfer",
        _LLM + "; diffusion sampling is [policy.diffusers.sample]",
    ),
    **_group(
        "rollout.multi_turn_config",
        "enable enable_tools enable_thinking custom_chat_template_path max_assistant_turns add_generation_prompt "
        "continue_final_message",
        _LLM,
    ),
    **_group("rollout", "seed", _SEED),
    **_group(
        "rollout",
        "mode prefetch_rollout prefetch_queue_maxsize",
        "rewards of one prompt group are scored while the next group is sampled (rollout.reward_workers)",
    ),
    **_group("rollout.async_config", "max_concurrent_requests", "see rollout.reward_workers"),
    # [policy]
    **_parallelism("policy.parallelism"),
    **_group(
        "policy",
        "model_max_length enable_liger_kernel enable_liger_cross_entropy enable_liger_fused_cross_entropy "
        "aux_loss_coeff",
        _LLM,
    ),
    **_group(
        "policy",
        "model_safetensor_path",
        "weights load from policy.model_name_or_path (a hub id or a local diffusers pipeline folder)",
    ),
    **_group(
        "policy",
        "trainable_map freeze_pattern trainable_pattern",
        "[policy.lora] present trains the LoRA adapters only, absent trains the whole transformer; the text "
        "encoder and VAE are always frozen",
    ),
    **_group(
        "policy.diffusers",
        "train_flow_shift",
        "the timestep shift is the model scheduler's (policy.diffusers.sample.flow_shift overrides it)",
    ),
    **_group(
        "policy.diffusers.tokenizer",
        "chunk_duration load_mean_std compile_encode temporal_window",
        "a Cosmos-Predict video tokenizer setting; SANA, SANA-Video and SD3.5 use their diffusers VAE",
    ),
    **_group(
        "policy.diffusers.lora",
        "r lora_names lora_path lora_alpha lora_dropout target_modules primary_adapter use_rslora modules_to_save "
        "alpha_pattern r_pattern init_lora_weights",
        "Cosmos-RL declares this table but its trainers read [policy.lora]; so does sanarl: move the table there",
    ),
    **_group(
        "policy.lora",
        "lora_path primary_adapter",
        "adapters start fresh (init_lora_weights); `train.resume` restores them, and `old` is DiffusionNFT's "
        "behaviour policy",
    ),
    **_group(
        "policy.lora",
        "use_rslora modules_to_save alpha_pattern r_pattern",
        "LoRA scale is lora_alpha / r for every adapted module; only the adapters train",
        use_rslora=False,
    ),
    **_group(
        "policy.diffusers.sample",
        "global_std",
        "declared by Cosmos-RL but unused by it; the advantage normaliser is train.train_policy.global_std",
    ),
    # [logging]
    **_group(
        "logging", "group_name report_mfu", "trackers get logging.project_name and experiment_name only"
    ),
    # [validation]
    **_group(
        "validation",
        "temperature top_p top_k repetition_penalty max_response_length",
        _LLM,
    ),
    **_group(
        "validation",
        "n_generation",
        "validation draws validation.num_samples images, one per prompt",
    ),
    **_group(
        "validation",
        "reward_function use_remote_reward",
        "validation scores validation.held_out_rewards in-process (reward-hacking guard)",
    ),
    **_group(
        "validation.remote_reward",
        "scale reward_clip_min reward_clip_max batch_size",
        "validation scores validation.held_out_rewards in-process (reward-hacking guard)",
    ),
    **_group(
        "validation.remote_reward.reward_fns",
        "name weight score_key clip_min clip_max",
        "validation scores validation.held_out_rewards in-process (reward-hacking guard)",
    ),
    **_group("train.train_policy.dataset", "revision test_size", "splits are files of the dataset plugin"),
    **_group("validation.dataset", "revision test_size", "splits are files of the dataset plugin"),
    # [profiler], [distillation], [vla]
    **_group("profiler", "enable_profiler enable_nsys", _PROFILER, enable_profiler=False, enable_nsys=False),
    **_group(
        "profiler.sub_profiler_config",
        "do_profile active_steps warmup_steps wait_steps rank_filter record_shape profile_memory with_stack "
        "with_modules",
        _PROFILER,
    ),
    **_group("distillation", "enable", _DISTILL, enable=False),
    **_parallelism("distillation.parallelism"),
    **_group(
        "distillation",
        "model_name_or_path model_revision compile master_dtype param_dtype logprob_dtype fsdp_reduce_dtype "
        "fsdp_offload fsdp_reshard_after_forward batch_size_per_replica max_token_len_per_mini_batch "
        "sequence_packing mini_batch seed kl_penalty_coef kl_discount_factor include_prompt top_k jsd_beta "
        "trainer_token_ids_from_teacher rollout_top_k_recompute",
        _DISTILL,
    ),
    **_group(
        "vla",
        "vla_type num_envs use_proprio proprio_dim num_images_in_input training_chunk_size save_video continuous "
        "trace_verbosity unnorm_key max_steps use_subprocess",
        _VLA,
    ),
}
"""Cosmos-RL key (dotted; array items without their index) -> how sanarl treats it."""

FREE_TABLES: dict[str, str] = {
    "custom": "free-form settings of Cosmos-RL's custom launch scripts; sanarl plugins read the typed config",
}
"""Cosmos-RL tables of any keys (`Dict[str, Any]`); accepted whole and reported."""

ARRAY_TABLES: frozenset[str] = frozenset({"validation.remote_reward.reward_fns"})
"""Not-applicable arrays of tables (`[[...]]`)."""

RENAMED: dict[str, tuple[str, str]] = {
    "policy.diffusers.timestep_fraction": (
        "policy.diffusers.timesteps_fraction",
        "Cosmos-RL's own NFT presets misspell this key, and its config silently drops unknown keys, so Cosmos-RL "
        "trained on every timestep (its default timesteps_fraction = 1.0); sanarl does what the file says. To "
        "reproduce Cosmos-RL's runs set timesteps_fraction = 1.0",
    ),
    "rollout.n_generation_mini_batch": (
        "rollout.batch_size",
        "both are the number of images per sampling forward pass (Cosmos-RL's own rollout.batch_size counts "
        "prompts per rollout request, which sanarl does not need)",
    ),
    "logging.log_interval": ("logging.log_freq", "console / tracker logging every N steps"),
}
"""Cosmos-RL key -> (sanarl key, why / what differs). Both given is an error, except for `SHADOWED` keys."""

SHADOWED: dict[str, NotApplicable] = {
    "rollout.batch_size": NotApplicable(
        "with rollout.n_generation_mini_batch also set, this is Cosmos-RL's rollout.batch_size: prompts per "
        "rollout request, which sanarl does not need (sanarl's rollout.batch_size, images per forward pass, is "
        "then n_generation_mini_batch)"
    ),
}
"""sanarl keys that are also Cosmos-RL keys with another meaning, and a `RENAMED` key maps onto them: with both
given, the renamed key wins and this one is dropped as Cosmos-RL's."""

VALUE_MAPS: dict[str, dict[Any, tuple[Any, str]]] = {
    "rollout.backend": {
        "diffusion_nft_rollout": (
            "diffusers",
            "Cosmos-RL's diffusion rollout; sanarl's is its own sampling loop",
        ),
    },
    "train.train_policy.trainer_type": {
        "sft": ("", "plain SFT"),
        "diffusers_sft": ("", "plain SFT"),
    },
    "train.ema_update_step_interval": {0: (1, "Cosmos-RL's 0 means every step")},
    "train.ckpt.max_keep": {-1: (0, "both mean keep every checkpoint")},
    "logging.experiment_name": {
        "None": (
            "",
            'Cosmos-RL\'s presets write the string "None", which names the tracker run "None"; read as unset',
        ),
    },
}
"""Honoured key -> {Cosmos-RL value: (sanarl value, why)}."""

UNSUPPORTED_VALUES: dict[str, dict[Any, str]] = {
    "rollout.backend": {
        name: 'an LLM rollout engine; set rollout.backend = "diffusers" (or Cosmos-RL\'s "diffusion_nft_rollout")'
        for name in ("vllm", "vllm_async", "trtllm")
    },
}
"""Honoured key -> {Cosmos-RL value sanarl refuses: why}."""


UNSUPPORTED_FORMS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "train.optm_lr": ((list, dict), "per-optimizer or per-module learning rates; sanarl takes one number"),
    "train.optm_impl": (list, "one implementation per optimizer; sanarl takes one name"),
    "train.optm_warmup_steps": (
        float,
        "a fraction of the total steps (Cosmos-RL's float form); sanarl takes a step count: set an integer",
    ),
    "policy.lora.target_modules": (
        str,
        "one string (Cosmos-RL's form for 'all-linear'); sanarl takes a list of module name suffixes (leave the "
        "key out for the model family's attention projections)",
    ),
}
"""Honoured key -> (Python type of a Cosmos-RL value form sanarl does not take, what that form means)."""
