"""Typed configuration schema, one dataclass per preset section.

Section and key names mirror NVIDIA Cosmos-RL's diffusion recipes so their users recognise them. Every field has a
default; a preset only states what differs. Unknown keys are rejected by the loader (see `loader.py`), except the
Cosmos-RL infrastructure keys listed in `IGNORED_KEYS`, which are accepted and reported as ignored.

Precedence: `--set` overrides > preset file > these defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from sanarl.config.awm_schema import AWMConfig
from sanarl.config.choices import (
    Dtype,
    EmaUpdatePer,
    EvalSolver,
    Logger,
    Optimizer,
    OptimizerImpl,
    SigmaGrid,
    Solver,
    TaskType,
    VaeLatents,
    Weighting,
)
from sanarl.config.ddrl_schema import DDRLConfig
from sanarl.config.dpo_schema import DPOConfig
from sanarl.config.group_rl_schema import (  # noqa: F401 (RolloutConfig re-exported)
    FlowGRPOPolicy,
    GroupDiffusers,
    NFTDiffusers,
    NFTPolicy,
    RolloutConfig,
)
from sanarl.config.guard_schema import (  # noqa: F401 (re-exported)
    GUARD_ACTIONS,
    GUARD_IMAGE_STATS,
    GUARD_WORSE,
    GuardConfig,
    GuardMetricConfig,
)
from sanarl.config.mixgrpo_schema import MixGRPOConfig
from sanarl.config.ranges import Above, AtLeast, Holds, Items, NotBlank, Only, Within
from sanarl.config.reward_schema import RemoteRewardConfig, RewardFnConfig  # noqa: F401 (re-exported)
from sanarl.config.soar_schema import SoarConfig
from sanarl.config.user_components import dotted_names

MAX_SEED = 2**32 - 1
"""The largest `train.seed` (per-step seeds add the step and rank to it; numpy takes 32-bit seeds)."""
MAX_LR = 1.0
"""The largest `train.optm_lr` accepted (inf, nan and absurd values fail validation, not the run)."""
MAX_SAMPLE_STEPS = 1000
"""The most sampling steps accepted: the diffusion schedules train on 1000 timesteps, so more steps add nothing
(and a typo of 100000000 would fill the memory with per-step state hours into a run)."""


@dataclass
class LoraConfig:
    """`[policy.lora]`: present = LoRA on (only the adapters train; the base stays frozen)."""

    r: Annotated[int, AtLeast(1)] = 4
    """LoRA rank."""
    lora_alpha: Annotated[float, Above(0)] = 4.0
    """LoRA scaling numerator (scale = lora_alpha / r)."""
    init_lora_weights: bool | str = "gaussian"
    """peft init: true (kaiming A, zero B), "gaussian", or false (random B; tests only)."""
    target_modules: list[str] = field(default_factory=list)
    """Module name suffixes that receive adapters (diffusers names); empty = the model family's default (SANA:
    attn1/attn2 to_q, to_k, to_v, to_out.0; SD3.5: the joint attention's projections)."""
    lora_names: Annotated[
        list[str],
        Holds(
            lambda names: "default" in names and len(set(names)) == len(names),
            'holds "default", no duplicates',
            '`{key}` = {value!r} must contain "default" (the trained adapter) with no duplicates; set lora_names = '
            '["default"] (SFT) or ["default", "old"] (DiffusionNFT).',
        ),
    ] = field(default_factory=lambda: ["default"])
    """Adapters to create. RL tasks use ["default", "old"]: "default" trains, "old" is the behaviour policy."""
    lora_dropout: Annotated[float, Within(0, 1, high_open=True)] = 0.0
    """Dropout on the LoRA branch."""


@dataclass
class SampleConfig:
    """`[policy.diffusers.sample]`: how images are generated (rollout, validation, eval)."""

    num_steps: Annotated[int, Within(1, MAX_SAMPLE_STEPS, hint="the 1000 timesteps models train on")] = 20
    """Sampling steps for rollouts (RL) and training-time samples."""
    eval_num_steps: Annotated[int, Within(1, MAX_SAMPLE_STEPS, hint="the 1000 timesteps models train on")] = (
        20
    )
    """Sampling steps for validation and `sanarl eval`."""
    guidance_scale: Annotated[float, AtLeast(0)] = 1.0
    """Classifier-free guidance weight w (v = v_u + w (v_c - v_u)); 1.0 = CFG off (one forward per step)."""
    noise_level: Annotated[float, AtLeast(0)] = 0.0
    """eta of the SDE / CPS samplers (0 = deterministic ODE)."""
    solver: Solver = "euler"
    """The sampling solver: dpm2 is DPM-Solver++ 2M on x0; flow_sde and cps are stochastic (with log-probabilities)."""
    deterministic_sampling: bool = True
    """Use the ODE solver for rollouts even if `solver` is stochastic (NFT)."""
    flow_shift: Annotated[float | None, Above(0)] = None
    """Shift k of the sigma grid; None = the model's scheduler value."""
    integer_timesteps: bool = False
    """Sampling (rollouts, the Sol-RL preview, validation, eval) feeds the model the integer timestep
    trunc(1000 s), as DiffusionNFT's and Sol-RL's SD3 sampler do; training forwards keep the float 1000 s. The
    steps themselves use the float grid. False: the float 1000 s everywhere (the diffusers pipelines, flow_grpo)."""
    sigma_grid: SigmaGrid | None = None
    """The sampling grid (rollouts, trained NFT levels, Flow-GRPO steps, validation, eval): flow_match_euler |
    dpm_flow | linspace | uniform (unshifted linspace(1, 0, N + 1), `flow_shift` unused: Sol-RL's SANA
    sampler); None = the one the family's diffusers pipeline samples on by default (SD3.5, SANA,
    SANA-Video: their scheduler's `set_timesteps(N)` grid; FLUX: linspace)."""
    # --- evaluation sampler ---
    eval_solver: EvalSolver | None = None
    """Solver of validation, the held-out reward guard and `sanarl eval`: euler | dpm2 (noise-free ODEs) | flow_sde
    (the stochastic step at `eval_noise_level`, as Sol-RL evaluates SANA); None = `solver` when it is an ODE solver,
    else euler."""
    eval_noise_level: Annotated[float, AtLeast(0)] = 0.0
    """eta of the evaluation's flow_sde step (`eval_solver = "flow_sde"` only; Sol-RL's SANA evaluation: 0.7)."""


@dataclass
class DiffusersKeys:
    """The `[policy.diffusers]` keys every method reads."""

    is_video: bool = False
    """Video model (SANA-Video) instead of image."""
    offload: bool = False
    """Keep the text encoder and VAE on CPU between uses."""
    max_prompt_length: Annotated[int, AtLeast(1)] = 300
    """Text-encoder token budget; the same in training, rollout and eval."""
    inference_size: Annotated[
        list[int], Items(2, Above(0), "[height, width] with two positive integers", "[1024, 1024]")
    ] = field(default_factory=lambda: [1024, 1024])
    """[H, W] of generated and training images."""
    train_frames: int = 41
    """Frames per training clip (video); 41 is Cosmos-RL's default, which its SANA-Video recipes keep."""
    inference_frames: int = 41
    """Frames per generated clip (video); 41 as Cosmos-RL."""
    weighting_scheme: Weighting = "logit_normal"
    """Timestep density for SFT."""
    logit_mean: float = 0.0
    """Mean of the logit-normal density."""
    logit_std: Annotated[float, Above(0)] = 1.0
    """Std of the logit-normal density."""
    mode_scale: float = 1.29
    """m of the `mode` density."""
    dtype: Dtype = "float32"
    """Weights dtype of the frozen parts (text encoder, VAE, frozen base)."""
    frozen_base_float32: bool = False
    """LoRA runs: hold the frozen transformer in float32 too, instead of `dtype` (only the LoRA parameters are float32
    by default, as diffusers' LoRA scripts do). Full fine-tunes always train float32 master weights."""
    complex_human_instruction: bool = True
    """SANA: prepend the pipeline's complex human instruction to prompts, as SANA's own inference does
    (tiny word-level models set false)."""
    caption_dropout: Annotated[float, Within(0, 1)] = 0.0
    """Probability of replacing a training caption by the empty prompt, encoded as CFG's unconditional branch
    encodes it (enables CFG after SFT)."""
    vae_latents: VaeLatents = "sample"
    """Training latents of a VAE with a posterior (SD3, FLUX): "sample" draws z = mean + std eps with eps from the step's
    seeded generator, as the references; "mode" takes the posterior mean (a deterministic encoding)."""


@dataclass
class DiffusersConfig(NFTDiffusers, GroupDiffusers, DiffusersKeys):
    """`[policy.diffusers]`: diffusion-specific model and objective settings (DiffusionNFT's and the group-RL
    methods' keys are declared in group_rl_schema.py)."""

    sample: SampleConfig = field(default_factory=SampleConfig)


@dataclass
class PolicyConfig:
    """`[policy]`: which model to post-train."""

    model_name_or_path: Annotated[
        str, NotBlank('set a hub id, a local pipeline dir or "sanarl-tiny:shapes"')
    ] = "sanarl-tiny:shapes"
    """Hub id or local diffusers pipeline dir. `sanarl-tiny:<name>` builds a tiny random-init model locally."""
    is_diffusers: Annotated[bool, Only(True)] = True
    """The model is a diffusers pipeline (the only kind supported)."""
    model_gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""
    model_revision: str | None = None
    """Hub revision of the weights."""
    lora: LoraConfig | None = None
    """LoRA settings; None (no `[policy.lora]` table) = full fine-tune."""
    diffusers: DiffusersConfig = field(default_factory=DiffusersConfig)


@dataclass
class DatasetConfig:
    """`[train.train_policy.dataset]` / `[validation.dataset]`: what the plugin loads."""

    name: str = ""
    """Dataset name understood by the plugin (e.g. a prompt-set name)."""
    subset: str = ""
    """Subset understood by the plugin."""
    split: str = "train"
    """Split: train | test | ..."""
    local_dir: str = ""
    """Local directory or file with the data."""
    size: int | None = None
    """Number of items for generated datasets (None = plugin default)."""


@dataclass
class TaskKeys:
    """The `[train.train_policy]` keys that choose the task, for every method."""

    type: TaskType = "sft"
    """The task; grpo is Cosmos-RL's name for all reward-based RL."""
    trainer_type: str = ""
    """The method of the task type: for grpo diffusion_nft | flow_grpo | ddrl | awm | dpo | mixgrpo; for sft "" (plain SFT) | soar | dpo (the method
    registry's table, sanarl/methods/registry.py)."""
    mini_batch: Annotated[int, AtLeast(1)] = 1
    """Micro-batch size per forward/backward pass."""


@dataclass
class TrainPolicyConfig(FlowGRPOPolicy, NFTPolicy, TaskKeys):
    """`[train.train_policy]`: the task. Cosmos-RL's flat section: the group-RL methods' keys are declared in
    group_rl_schema.py (`GroupPolicy`, `NFTPolicy`, `FlowGRPOPolicy`), SOAR's, DDRL's and DPO's in their own sections."""

    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    soar: SoarConfig = field(default_factory=SoarConfig)
    ddrl: DDRLConfig = field(default_factory=DDRLConfig)
    awm: AWMConfig = field(default_factory=AWMConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    mixgrpo: MixGRPOConfig = field(default_factory=MixGRPOConfig)


@dataclass
class CkptConfig:
    """`[train.ckpt]`: checkpointing and export."""

    enable_checkpoint: bool = True
    """Write training checkpoints (atomic `checkpoints/step_N/`); false = none, so no resume."""
    save_freq: Annotated[int, AtLeast(1)] = 100
    """Save every N optimizer steps (and at the end)."""
    max_keep: Annotated[int, AtLeast(0)] = 3
    """Keep the N newest checkpoints (0 = keep all)."""
    save_every_minutes: Annotated[float | None, Above(0.0)] = None
    """Also save once this many wall minutes of the loop passed since the last save (curves over time)."""
    export_safetensors: bool = True
    """Export the final model (LoRA file or pipeline dir) at the end of the run."""


@dataclass
class TrainConfig:
    """`[train]`: optimisation and run control."""

    epoch: Annotated[int, AtLeast(1)] = 1
    """Passes over the training set (RL: over the prompt set); `max_num_steps` and `max_wall_minutes` stop earlier."""
    seed: Annotated[int, Within(0, MAX_SEED, hint="the generators' seed range")] = 42
    """Seed of data order, initial noise and every random draw; (seed, step, rank) fix a step exactly."""
    train_batch_per_replica: Annotated[int, AtLeast(1)] = 1
    """Samples per optimizer step on each rank (= mini_batch x accumulation steps)."""
    output_dir: Annotated[str, NotBlank('set a run directory, e.g. "./outputs/run"')] = "./outputs/run"
    """Run directory (config.toml, metrics, samples, checkpoints, export); relative to the current directory."""
    resume: bool | str = False
    """false, true (newest checkpoint in output_dir) or a checkpoint path."""
    optm_name: Optimizer = "AdamW"
    """The torch optimizer."""
    optm_lr: Annotated[
        float,
        Within(0, MAX_LR, low_open=True, hint="a larger one diverges at once; typical values: 1e-5 to 1e-3"),
    ] = 1e-4
    """Peak learning rate (after the linear warm-up; constant afterwards)."""
    optm_impl: OptimizerImpl = "foreach"
    """torch optimizer implementation."""
    optm_weight_decay: Annotated[float, AtLeast(0)] = 0.01
    """Decoupled weight decay of AdamW (L2 for Adam / SGD)."""
    optm_betas: Annotated[
        list[float], Items(2, Within(0, 1, high_open=True), "two numbers in [0, 1)", "[0.9, 0.999]")
    ] = field(default_factory=lambda: [0.9, 0.999])
    """[beta1, beta2] of Adam / AdamW."""
    optm_grad_norm_clip: Annotated[float, AtLeast(0)] = 1.0
    """Max global grad norm (0 = no clipping)."""
    optm_warmup_steps: Annotated[int, AtLeast(0)] = 0
    """Linear learning-rate warm-up over this many optimizer steps (0 = none), then constant."""
    epsilon: Annotated[float, Above(0)] = 1e-8
    """AdamW epsilon."""
    ema_enable: bool = False
    """Keep an EMA of the trained weights (float32); validation, eval and the export use it."""
    ema_decay: Annotated[float, Within(0, 1, high_open=True)] = 0.9
    """EMA decay cap; the decay warms up as min(ema_decay, (1 + k) / (10 + k)) at update k."""
    ema_update_step_interval: Annotated[int, AtLeast(1)] = 1
    """Update the EMA every N optimizer steps."""
    ema_update_per: EmaUpdatePer = "optimizer_step"
    """optimizer_step: one EMA update after each optimizer step; sample_batch: flow_grpo's train_sd3.py pattern, one
    after every sample batch at the optimizer steps done so far (k sample batches per step: k updates each)."""
    param_dtype: Dtype = "float32"
    """Mixed precision of the trained model."""
    compile: bool = False
    """torch.compile the trained transformer's forward: training's calls, and the rollout's when it samples with the
    policy itself (Sol-RL's inference copies are compiled with `rollout.compile_mode`). Numbers move at rounding
    level against eager."""
    max_num_steps: Annotated[int | None, AtLeast(1)] = None
    """Stop after this many optimizer steps (None = run all epochs)."""
    max_wall_minutes: Annotated[float | None, Above(0.0)] = None
    """Stop after the optimizer step that crosses this wall-clock budget (minutes since start, resumes included
    from their restart; None = no limit); the run then checkpoints and exports as at a normal end."""
    components: Annotated[
        list[str],
        Holds(
            dotted_names,
            "dotted module names",
            "`{key}` = {value!r} must list dotted module names (e.g. `my_pkg.my_component`), one per component.",
        ),
    ] = field(default_factory=list)
    """Run components of your own (docs/architecture.md, "Run components"): dotted module names, each defining
    `build_component(cfg, run, run_dir)` that returns a RunComponent or None; they run after sanarl's own (the
    reward-hacking guard), in this order. Each module is imported and checked when the config loads."""
    train_policy: TrainPolicyConfig = field(default_factory=TrainPolicyConfig)
    ckpt: CkptConfig = field(default_factory=CkptConfig)


@dataclass
class ValidationConfig:
    """`[validation]`: periodic sample images."""

    enable: bool = False
    """Generate validation samples (and the held-out rewards) every `freq` steps."""
    freq: Annotated[int, AtLeast(1)] = 100
    """Validate every N optimizer steps (and at the end)."""
    early_steps: Annotated[
        list[int],
        Holds(
            lambda steps: all(step >= 1 for step in steps),
            "steps >= 1",
            "`{key}` = {value!r} must list optimizer steps >= 1, e.g. [50, 100].",
        ),
    ] = field(default_factory=list)
    """Also validate after these steps: early grids before the first `freq` (e.g. [50, 100])."""
    val_before_train: bool = False
    """Also validate once before the first step (the base model's samples)."""
    batch_size: Annotated[int, AtLeast(1)] = 8
    """Prompts generated per forward batch during validation."""
    num_samples: Annotated[int, AtLeast(1)] = 16
    """Images per validation round (saved as a grid)."""
    held_out_rewards: list[str] = field(default_factory=list)
    """Reward-hacking guard: rewards scored on the validation samples every `freq` steps and logged as
    `heldout/<reward>/<key>` (pick rewards the run does not train on; their metadata must come with the prompts)."""
    dataset: DatasetConfig = field(default_factory=lambda: DatasetConfig(split="test"))
    guard: GuardConfig = field(default_factory=GuardConfig)
    """The reward-hacking alarm on these validations (`[validation.guard]`)."""


@dataclass
class LoggingConfig:
    """`[logging]`."""

    logger: list[Logger] = field(default_factory=lambda: ["console"])
    """Where the metrics go (any of the values)."""
    project_name: str = "sanarl"
    """Tracker project (wandb project, tensorboard run folder's parent)."""
    experiment_name: str = ""
    """Tracker run name ("" = the output directory's name)."""
    log_freq: Annotated[int, AtLeast(1)] = 1
    """The console reports progress every N steps: step, loss, reward, step time, ETA (a bar on a terminal, a plain
    line when stdout is a file); metrics.jsonl, tensorboard and wandb get every step."""
    multi_modal_log_interval: int = 10
    """RL: save a rollout grid (prompt and reward under each image) every N steps (0 = never)."""


@dataclass
class Config:
    """A whole preset."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


IGNORED_KEYS: tuple[str, ...] = (
    "redis",
    "mode",
    "train.fsdp_offload",
    "train.fsdp_reshard_after_forward",
    "train.async_tp_enabled",
    "train.non_text",
    "train.train_policy.uncentralized_training",
)
"""Keys (dotted paths) that only configure Cosmos-RL's own controller; accepted, reported as ignored. The whole of
Cosmos-RL's schema is covered by `sanarl.config.cosmos.drop_in` (every key it defines, with what sanarl does instead)."""

ALIASES: dict[str, str] = {"policy.diffusers.timestep_fraction": "policy.diffusers.timesteps_fraction"}
"""Accepted spellings -> canonical key (Cosmos-RL's presets use the misspelt one)."""
