"""The keys of the group-RL methods (DiffusionNFT, Flow-GRPO, DDRL, which adds `[train.train_policy.ddrl]`, and AWM,
which adds `[train.train_policy.awm]`),
one dataclass per method, each with type, default, range and doc at the field.

Cosmos-RL keeps these keys flat in `[train.train_policy]` and `[policy.diffusers]`, and so does every sanarl
preset: `schema.TrainPolicyConfig` and `schema.DiffusersConfig` are composed of these classes (they inherit their
fields), so a key is read and written where Cosmos-RL puts it and declared once, here. A method's config view
(sanarl/methods/<method>/config.py) holds a copy of its class, filled from the flat section. `METHODS` names the
methods that read a class's keys (docs/configuration.md shows them); the others ignore them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, ClassVar

from sanarl.config.choices import (
    AdvMode,
    ImportanceRatio,
    PreviewPrecision,
    RolloutBackend,
    RolloutFamily,
    Selection,
    WeightCopyDecay,
)
from sanarl.config.ranges import Above, AtLeast, Within
from sanarl.config.reward_schema import RewardKeys

GROUP_RL = ("diffusion_nft", "flow_grpo", "ddrl", "awm", "dpo_online", "mixgrpo")
"""The methods that roll out prompt groups and learn from their rewards."""


@dataclass
class GroupPolicy(RewardKeys):
    """The `[train.train_policy]` keys every group-RL method reads (sanarl/methods/group_rl/task_base.py): the reward, the
    KL weight, the advantage clip and its normalisation, the updates per rollout."""

    METHODS: ClassVar[tuple[str, ...]] = GROUP_RL

    kl_beta: Annotated[float, AtLeast(0)] = 0.0
    """Weight of the KL term to the base model."""
    advantage_low: float = -5.0
    """Advantage clip lower bound (Flow-GRPO; DiffusionNFT clips symmetrically and needs -advantage_high)."""
    advantage_high: Annotated[
        float, Above(0, "it is DiffusionNFT's adv_clip_max C; the published value is 5.0")
    ] = 5.0
    """Advantage clip upper bound C."""
    global_std: bool = True
    """Normalise advantages by the std of all rewards of the iteration (true) or of each prompt group (false)."""
    unbiased_std: bool = False
    """That std divides by N - 1 (torch.std, Cosmos-RL's DDRL) instead of N (np.std, Flow-GRPO, DiffusionNFT)."""
    optimizer_steps_per_rollout: Annotated[int, AtLeast(1, "1 = one update per rollout")] = 1
    """Split each rollout's micro-batches over this many optimizer steps (the several gradient updates per
    sampling epoch of both public codebases). Flow-GRPO: steps after the first are off-policy, which is where the
    PPO clip acts. NFT: the old adapter moves once per rollout, after its last step."""


@dataclass
class NFTPolicy(GroupPolicy):
    """The group-RL keys plus DiffusionNFT's advantage transform."""

    METHODS: ClassVar[tuple[str, ...]] = ("diffusion_nft",)

    adv_mode: AdvMode = "all"
    """DiffusionNFT's advantage transform (docs/algorithms.md, "DiffusionNFT")."""


@dataclass
class ClippedPolicy(GroupPolicy):
    """The group-RL keys plus the PPO clip range of the methods with an importance ratio (Flow-GRPO, DDRL's policy
    term, AWM's ratio on its surrogate log-likelihood)."""

    METHODS: ClassVar[tuple[str, ...]] = ("flow_grpo", "ddrl", "awm", "mixgrpo")

    clip_range: Annotated[float, Above(0, "Flow-GRPO uses 1e-4")] = 1e-4
    """PPO clip range on the importance ratio (mean log-prob scale)."""


@dataclass
class FlowGRPOPolicy(ClippedPolicy):
    """The group-RL keys plus Flow-GRPO's (DDRL's policy term reads them too): the PPO clip range, its importance
    ratio and the on-policy self-check, the SDE window (Flow-GRPO-Fast), the group noise, CPS's last step, CFG in
    training."""

    METHODS: ClassVar[tuple[str, ...]] = ("flow_grpo", "ddrl")

    ratio: ImportanceRatio = "plain"
    """The importance ratio the PPO clip acts on: "plain" (Flow-GRPO: exp(logp_theta - logp_old) of each SDE step)
    or "guard" (GRPO-Guard, arXiv 2510.22319: the log-ratio times the step's transition std plus the squared
    mean shift over twice that std, zero-mean at every step; clipped to [1 - clip_range, 1 + clip_range]). "guard"
    needs solver = "flow_sde" (the reference defines it on that step only) and trainer_type = "flow_grpo"."""
    sde_window_size: Annotated[int, AtLeast(0, "0 = every step stochastic")] = 0
    """Flow-GRPO-Fast: stochastic steps per rollout inside a random window (0 = every step stochastic)."""
    sde_window_range: list[int] = field(default_factory=lambda: [0, 10])
    """Flow-GRPO-Fast: [r0, r1), the steps the window lies inside (its start is uniform in [r0, r1 - size])."""
    same_noise_per_group: bool = False
    """One initial noise per prompt group (the samples then differ only by the SDE noise)."""
    cps_train_last_step: bool = False
    """With CPS: also train the deterministic last step to s' = 0, as flow_grpo does when its trained steps reach
    it (timesteps_fraction = 1): its log-prob -(x' - mu)^2 has zero gradient on-policy, but it counts in the
    accumulation divisor (N steps per sample instead of N - 1). Needs kl_beta = 0 (its std is 0)."""
    ratio_warn_tolerance: Annotated[float, AtLeast(0, "Flow-GRPO uses 1e-3")] = 1e-3
    """On-policy self-check: warn when the first micro-batch's |ratio - 1| exceeds this."""
    cfg_in_training: bool = True
    """With guidance_scale != 1 the training forward uses CFG too (uncond branch detached)."""


@dataclass
class GroupDiffusers:
    """The `[policy.diffusers]` key the group-RL methods read: how many rollout levels they train (MixGRPO trains
    its window instead)."""

    METHODS: ClassVar[tuple[str, ...]] = ("diffusion_nft", "flow_grpo", "ddrl")

    timesteps_fraction: Annotated[float, Within(0, 1, low_open=True)] = 0.99
    """Fraction of the rollout grid levels trained per sample. Cosmos-RL's `timestep_fraction` is an alias."""


@dataclass
class NFTDiffusers:
    """The `[policy.diffusers]` keys of DiffusionNFT: its beta and the old adapter's decay."""

    METHODS: ClassVar[tuple[str, ...]] = ("diffusion_nft",)

    nft_beta: Annotated[float, Above(0, "it divides the loss; the published value is 1.0")] = 1.0
    """DiffusionNFT beta (mixing of the trained and old velocities)."""
    weight_copy_decay_type: WeightCopyDecay = 1
    """Old-adapter decay schedule: 0 on-policy, 1 min(0.001 step, 0.5), 2 delayed (0 before step 75, then
    min(0.0075 (step - 75), 0.999)), 3 Sol-RL's custom ramp min(step custom_decay_value / custom_decay_step,
    custom_decay_value)."""
    custom_decay_step: int = 0
    """Decay type 3: optimizer steps over which the decay ramps from 0 up to `custom_decay_value` (> 0; Sol-RL's
    `custom_decay_step`)."""
    custom_decay_value: float = 0.0
    """Decay type 3: the decay it ramps up to and then holds (> 0; Sol-RL's `custom_decay_value`)."""


@dataclass
class RolloutConfig:
    """`[rollout]`: generation of the group-RL methods' prompt groups."""

    METHODS: ClassVar[tuple[str, ...]] = GROUP_RL

    backend: RolloutBackend = "diffusers"
    """Generation engine (only "diffusers": sanarl's own sampling loop on the diffusers model)."""
    n_generation: int = 8
    """Group size K: images per prompt."""
    batch_size: Annotated[int, AtLeast(1)] = 8
    """Images generated per forward pass."""
    family: RolloutFamily = "diffusionnft"
    """Sol-RL rollout family: diffusionnft (K per prompt) | naive_scaling (M drafts, keep K) | compile (M drafts from
    a torch.compile'd merged copy, keep K) | naive_quant (M drafts from a quantized copy, keep K) | sol_rl
    (quantized preview of M drafts at preview_step steps, keep K seeds, regenerate them at full precision)."""
    num_candidates: Annotated[int, AtLeast(0, "0 = n_generation")] = 0
    """M: drafts per prompt for the multi-candidate families (0 = n_generation, i.e. no search)."""
    selection: Selection = "best_worst"
    """How K of M drafts are kept: best_worst | random | mean_deviation | extremes_random (Sol-RL's: argmax and argmin,
    the rest at random) | best_worst_random (best_worst of K // 2, the rest at random). docs/algorithms.md."""
    preview_step: int = 6
    """Sampling steps of the sol_rl preview stage."""
    preview_precision: PreviewPrecision = "fp8"
    """Preview / quantized-copy precision: nvfp4 (Blackwell, transformer-engine NVFP4BlockScaling) | fp8 (sm_89+
    GPUs: transformer-engine, else torch-native FP8) | e2m1_delayed (Sol-RL's recipe, transformer-engine
    DelayedScaling(fp8_format=E2M1, amax_history_len=16), which runs as FP8 E5M2 on sm_89+) | int8 (CPU: dynamic int8
    linear layers) | auto (the best of those the machine has) | bf16 (no quantization: the preview is cheaper by its
    step count only). Backends: sanarl/methods/group_rl/quantize.py."""
    nvfp4_min_dim: int = 2240
    """Linear layers (1x1 convolutions included) whose largest side is <= this stay unquantized; `sanarl validate`
    prints how many layers and what share of the weights the quantized copy replaces."""
    compile_mode: str = "max-autotune-no-cudagraphs"
    """torch.compile mode of the inference copy (compile / naive_quant / sol_rl families)."""
    reward_workers: Annotated[int, AtLeast(0, "0 = score synchronously")] = 1
    """Threads scoring rewards while the next prompt group is sampled (0 = score synchronously)."""
    reward_deadline_s: Annotated[float, Above(0)] = 600.0
    """A reward call taking longer than this fails the step with a message (no silent hang)."""
