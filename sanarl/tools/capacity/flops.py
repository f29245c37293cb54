"""FLOPs of one iteration per rank, from the traced forward of the real architecture (torch's FLOP counter on the
meta-device model, simulate.py), and its time on a named accelerator at an assumed utilisation.

Counted: the transformer's forwards (rollout: drafts x steps, x2 rows with CFG; Sol-RL's preview and regeneration;
training: backward = 2 x forward; NFT's old-policy forward and the reference forward with kl_beta) and the reward
models (2 x parameters x 257 tokens per image, a ViT-H/14-sized image encoder). Not counted: text encoders and the
VAE (small next to the transformer at these batch sizes).
"""

from __future__ import annotations

from dataclasses import dataclass

from sanarl.config.schema import Config
from sanarl.methods.registry import method_of
from sanarl.models.meta import components_table
from sanarl.tools.capacity.accelerators import MFU, Accelerator
from sanarl.tools.capacity.memory import Estimate, guided_rows, rollout_counts, trained_work


@dataclass
class Flops:
    rollout: float
    preview: float
    """The low-precision part of the rollout (Sol-RL's quantized preview / naive_quant drafts)."""
    training: float
    rewards: float

    @property
    def total(self) -> float:
        return self.rollout + self.preview + self.training + self.rewards


def per_row(est: Estimate, name: str) -> float:
    return est.traces[name].forward_flops / est.batches[name]


def iteration_flops(cfg: Config, est: Estimate) -> Flops:
    """FLOPs of one optimizer step on one rank."""
    tp = cfg.train.train_policy
    train_row = per_row(est, "train")
    sample = cfg.policy.diffusers.sample
    from sanarl.training.protocol import per_rank_batch, run_settings

    samples = per_rank_batch(run_settings(cfg), est.world)
    rollout = preview = rewards = 0.0
    if method_of(cfg).group_rollouts:
        prompts, m, k = rollout_counts(cfg, est.world)
        guided = guided_rows(cfg, est.arch, 1, sample.guidance_scale)
        step = per_row(est, "rollout") * guided
        ro = cfg.rollout
        quantized = ro.preview_precision != "bf16"
        if ro.family == "sol_rl":
            draft = prompts * m * ro.preview_step * step
            preview, rollout = (draft, 0.0) if quantized else (0.0, draft)
            rollout += prompts * k * sample.num_steps * step
        elif ro.family == "naive_quant" and quantized:
            preview = prompts * m * sample.num_steps * step
        else:
            rollout = prompts * m * sample.num_steps * step
        images = prompts * (m + (k if ro.family == "sol_rl" else 0))
        reward_params = sum(components_table()["rewards"].get(f.name, {"params": 0})["params"]
                            for f in tp.remote_reward.reward_fns)  # fmt: skip
        rewards = images * 2 * reward_params * 257
    training = samples * trained_work(cfg, est.arch).forward_rows() * train_row
    return Flops(rollout, preview, training, rewards)


def iteration_seconds(flops: Flops, gpu: Accelerator, precision: str) -> float:
    """Seconds per iteration at `MFU` of the bf16 peak (the preview at the FP8 / FP4 peak where it runs there)."""
    bf16 = gpu.bf16_tflops * 1e12 * MFU
    low = {"fp8": gpu.fp8_tflops, "e2m1_delayed": gpu.fp8_tflops, "nvfp4": gpu.fp4_tflops}.get(
        precision
    ) or gpu.bf16_tflops
    return (flops.rollout + flops.training + flops.rewards) / bf16 + flops.preview / (low * 1e12 * MFU)
