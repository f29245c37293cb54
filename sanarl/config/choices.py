"""The allowed values of the config's choice fields, declared once as `typing.Literal` types.

The schemas (`schema.py`, `reward_service/config.py`) annotate their fields with these; the config engine
(`engine.py`) checks a value against the Literal of its field when a file is read, when `--set` changes it and in
`check_config`. Code that needs the list of values reads it off the type: `typing.get_args(Solver)`.
"""

from __future__ import annotations

from typing import Literal

# --- the task ---------------------------------------------------------------------------------------------------
TaskType = Literal["sft", "grpo"]
"""`train.train_policy.type`: sft, or grpo (Cosmos-RL's name for all reward-based RL). Its `trainer_type` values
are the method registry's (sanarl/methods/registry.py), checked by `checks.check_task`."""
AdvMode = Literal["all", "positive_only", "negative_only", "one_only", "binary"]
"""DiffusionNFT's advantage transform."""

# --- sampling and the objective ---------------------------------------------------------------------------------
Solver = Literal["euler", "dpm2", "flow_sde", "cps"]
"""Sampling solvers: two ODE solvers (euler, DPM-Solver++ 2M on x0) and two stochastic ones."""
EvalSolver = Literal["euler", "dpm2", "flow_sde"]
"""Evaluation solvers: the two ODE solvers, or the flow-SDE step at `eval_noise_level` (Sol-RL's SANA evaluation)."""
"""The deterministic solvers (evaluation always samples with one)."""
SigmaGrid = Literal["flow_match_euler", "dpm_flow", "linspace", "uniform"]
"""Sampling grids (`sanarl.core.flow.SIGMA_GRIDS`): FlowMatchEulerDiscreteScheduler's and DPMSolverMultistepScheduler's
(flow sigmas) own `set_timesteps(N)` grids, the explicit `linspace(1, 1/N, N)` that FluxPipeline passes, and the
unshifted `linspace(1, 0, N + 1)` of Sol-RL's SANA sampler."""
Weighting = Literal["logit_normal", "mode", "uniform", "sigma_sqrt", "cosmap"]
"""SFT timestep densities."""
Dtype = Literal["float32", "bfloat16", "float16"]
EmaUpdatePer = Literal["optimizer_step", "sample_batch"]
"""When the EMA takes its updates: after each optimizer step, or after each sample batch (flow_grpo's scripts)."""
"""Weight / autocast dtypes."""
VaeLatents = Literal["sample", "mode"]
"""Training latents of a VAE with a posterior: a seeded draw, or its mean."""
WeightCopyDecay = Literal[0, 1, 2, 3]
"""DiffusionNFT's old-adapter decay schedules: 0 on-policy, 1 min(0.001 step, 0.5), 2 delayed; 3 Sol-RL's custom ramp."""
SoarRolloutType = Literal["simple", "sde", "flow_sde", "cps"]
"""SOAR's step of its stochastic paths."""
LevelGrid = Literal["scheduler_table", "continuous"]
"""SOAR: how s0 and s1 are read off u and t1."""
DataSource = Literal["dataset", "synthetic"]
"""DDRL: where the data of its flow-matching term come from."""
DataWeighting = Literal["edm", "uniform"]
"""DDRL: the per-level weight of its data term (edm: Cosmos-RL's, s^2 + (1 - s)^2 on the velocity; uniform: 1)."""
AwmWeighting = Literal["uniform", "t", "t2", "huber", "ghuber"]
"""AWM: the weighting of its flow-matching log-likelihood surrogate (sanarl.core.awm_loss.AWM_WEIGHTINGS)."""
AwmLossType = Literal["exp_first", "sum_first"]
"""AWM: the importance ratio per (level, sample) (exp_first) or per sample over its levels' mean (sum_first)."""
AwmTimeType = Literal["discrete", "discrete_wo_init", "discrete_with_init"]
"""AWM: how the trained grid steps are drawn (sanarl.core.awm_loss.AWM_STEP_SCHEMES)."""
AwmKLWeight = Literal["uniform", "elbo"]
"""AWM: the weight of its velocity KL terms (elbo: 1 / (2 std(s)^2))."""
AwmEmaDecayType = Literal["linear", "constant"]
"""AWM: the schedule of the decay of the EMA copy its `ema_beta` term pulls towards."""
ImportanceRatio = Literal["plain", "guard"]
"""Flow-GRPO: the importance ratio its PPO clip acts on (plain: the SDE step's log-prob ratio; guard: GRPO-Guard's
normalised ratio, docs/algorithms.md "GRPO-Guard")."""
MixTailSolver = Literal["euler", "dpm2"]
"""MixGRPO: the ODE solver after the SDE window (euler; dpm2 = DPM-Solver++(2M), MixGRPO-Flash)."""

# --- rollouts ---------------------------------------------------------------------------------------------------
RolloutBackend = Literal["diffusers"]
"""Generation engine: sanarl's own sampling loop on the diffusers model."""
RolloutFamily = Literal["diffusionnft", "naive_scaling", "compile", "naive_quant", "sol_rl"]
"""Sol-RL rollout families."""
Selection = Literal["best_worst", "random", "mean_deviation", "extremes_random", "best_worst_random"]
"""How K of M drafts are kept."""
PreviewPrecision = Literal["nvfp4", "fp8", "e2m1_delayed", "int8", "auto", "bf16"]
"""Precision of the preview / quantized rollout copy."""

# --- rewards, optimisation, logging -----------------------------------------------------------------------------
VideoReduction = Literal["mean", "min", "max", "median"]
"""How per-frame scores of a clip become one score (trainer and reward service)."""
Optimizer = Literal["AdamW", "Adam", "SGD"]
"""`train.optm_name`."""
OptimizerImpl = Literal["foreach", "fused", "for-loop"]
"""`train.optm_impl`: torch's multi-tensor, fused or per-parameter optimizer step."""
Logger = Literal["console", "wandb", "tensorboard"]
"""Entries of `logging.logger`."""
GuardWorse = Literal["higher", "lower"]
"""`worse` of a guard metric: the direction in which it worsens."""
GuardAction = Literal["log", "stop"]
"""What the reward-hacking guard does when it fires."""
GuardRollback = Literal["best", "last_clean"]
"""Which kept validation a stopped run exports: the alarm metric's best, or the newest within every margin."""

# --- the reward service -----------------------------------------------------------------------------------------
Fsync = Literal["always", "everysec", "no"]
"""redis-server's appendfsync policy."""
LogLevel = Literal["debug", "info", "warning", "error"]
"""Log level of the reward service and its workers."""
