"""sanarl's side of `bench_references.py`: the sd35m preset of the pair, scaled down to the `Work`, driven
through `Runner.train_step` as `sanarl` runs it (rollout, reward, advantages, micro-batches, forward / backward,
grad clipping, AdamW, EMA, old-policy update), `Work.updates` optimizer steps per iteration."""

from __future__ import annotations

from pathlib import Path

from _peers import MAX_SEQUENCE_LENGTH, PhaseClock, Side, Work

PRESETS = {"grpo": "sd35m-grpo", "nft": "sd35m-nft", "ff-grpo": "sd35m-grpo", "ff-nft": "sd35m-nft"}
"""The pair -> sanarl's preset it scales down."""


def overrides(pair: str, work: Work, model: Path, prompts: Path, out: Path) -> list[str]:
    """The preset overrides that put `work` on the tiny model: float32 everywhere (the references' CPU runs
    autocast nothing with LoRA), no gradient checkpointing (neither reference script turns it on), no validation,
    no checkpoints, the prompt file as the dataset, synchronous scoring in-process."""
    common = [
        f"policy.model_name_or_path={model}",
        f"policy.diffusers.inference_size=[{work.size},{work.size}]",
        f"policy.diffusers.max_prompt_length={MAX_SEQUENCE_LENGTH}",
        f"policy.diffusers.sample.num_steps={work.steps}",
        f"policy.lora.r={work.rank}",
        f"policy.lora.lora_alpha={2 * work.rank}",
        "policy.diffusers.dtype=float32",
        "train.param_dtype=float32",
        "policy.model_gradient_checkpointing=false",
        f"rollout.n_generation={work.group}",
        f"rollout.batch_size={work.batch}",
        "rollout.reward_workers=0",
        f"train.train_batch_per_replica={work.samples}",
        f"train.train_policy.mini_batch={work.micro}",
        f"train.train_policy.optimizer_steps_per_rollout={work.updates}",
        "train.train_policy.dataset.name=",
        f"train.train_policy.dataset.local_dir={prompts}",
        f"train.output_dir={out}",
        "validation.enable=false",
        "train.ckpt.enable_checkpoint=false",
        "train.ckpt.export_safetensors=false",
    ]
    if pair.endswith(
        "grpo"
    ):  # Flow-GRPO-Fast: the SDE window at the start, no KL (flow_grpo's fast configs: beta 0)
        common += [
            f"train.train_policy.sde_window_size={work.window}",
            f"train.train_policy.sde_window_range=[0,{work.window}]",
            "train.train_policy.kl_beta=0",
            f"policy.diffusers.sample.guidance_scale={work.guidance}",
            f"policy.diffusers.sample.noise_level={work.noise_level}",
        ]
    return common


class SanarlSide(Side):
    """The Runner over the task `sanarl.api.train` builds for the pair's preset (dry run: loaded, not trained);
    `extra`: more `KEY=VALUE` overrides after the pair's own (e.g. `train.compile=true`)."""

    def __init__(
        self, pair: str, work: Work, model: Path, prompts: Path, out: Path, extra: tuple[str, ...] = ()
    ) -> None:
        import torch
        from accelerate import Accelerator

        from sanarl import api
        from sanarl.config.presets import resolve_preset_path
        from sanarl.methods.config_loading import load_config
        from sanarl.training.runner import Runner

        self.name, self.patched, self.work = "sanarl", [], work
        self.metrics: list[dict[str, float]] = []
        settings = overrides(pair, work, model, prompts, out) + list(extra)  # `--sanarl-set`, last: they win
        loaded = load_config(resolve_preset_path(PRESETS[pair]), settings)
        loaded.config.train.train_policy.remote_reward.reward_fns[0].name = "jpeg_compressibility"
        task = api.train(loaded, "sanarl.datasets.diffusion_nft", dry_run=True).task
        self.runner = Runner(loaded.config, task, Accelerator(cpu=not torch.cuda.is_available()), out)
        self.clock = PhaseClock()
        rollouts = task.rollouts
        rollouts.reward_fn = self.clock.timed_reward(rollouts.reward_fn)
        rollouts.rollout = self.clock.timed_rollout(rollouts.rollout)
        rollouts.rollout_with = self.clock.timed_rollout(rollouts.rollout_with)

    def iteration(self) -> dict[str, float]:
        """One rollout and its `updates` optimizer steps (steps 0 .. updates - 1: every call samples afresh); their
        metrics (loss, grad_norm, ...) appended to `metrics`."""
        return self.clock.iteration(self._steps)

    def _steps(self) -> None:
        self.metrics += [self.runner.train_step(step) for step in range(self.work.updates)]
