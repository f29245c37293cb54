"""A run's validations: the grid of samples every `validation.freq` steps, their held-out rewards, and what the
run's components make of them (sanarl/training/component_hooks.py).

Validations come every `validation.freq` steps, after each of `validation.early_steps` (first grids before the
first `freq`), at the end of the run, and after the final checkpoint of a run stopped by SIGINT / SIGTERM (its
last weights as a grid; the runner calls `sample`).

The samples come from the evaluation sampler (a noise-free ODE, or flow_sde at `eval_noise_level` with its noise
from each sample's seed: docs/algorithms.md "Evaluation sampler") with the
EMA weights when the EMA is on, on the first `validation.num_samples` validation prompts with seeds `train.seed +
i`. Rank 0 saves the grid under `samples/`, scores it with `validation.held_out_rewards` (rewards the run does not
train on) and logs `heldout/<reward>/<key>`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from sanarl.config.schema import Config
from sanarl.core.media import save_media
from sanarl.rewards.held_out import score_images
from sanarl.rewards.summary import describe
from sanarl.training.component_hooks import RunComponent
from sanarl.training.distributed import is_fsdp
from sanarl.training.protocol import Task
from sanarl.training.sampling import GenerationSpec, generate_images
from sanarl.training.tracking import MetricsLogger
from sanarl.training.train_state import TrainState


class Validation:
    """`[validation]` of a run over `state`'s weights; `held_out_rewards()` builds (once) the held-out rewards."""

    def __init__(
        self,
        cfg: Config,
        state: TrainState,
        run_dir: Path,
        components: Sequence[RunComponent],
        held_out_rewards: Callable[[], dict],
    ) -> None:
        self.cfg, self.state, self.acc, self.run_dir = cfg, state, state.acc, run_dir
        self.task: Task = state.task
        self.components = components
        self.held_out_rewards = held_out_rewards

    def due(self, done: int, total: int) -> bool:
        """A validation after step `done` (`validation.freq` and `validation.early_steps`; the run's end validates
        the last step)."""
        val = self.cfg.validation
        return val.enable and (done % val.freq == 0 or done in val.early_steps) and done < total

    def run(self, step: int, logger: MetricsLogger) -> bool:
        """Validate at `step`, then every component's `after_validation` (all of them run); whether any asks the
        run to stop."""
        self.sample(step, logger)
        stops = [component.after_validation(step, logger) for component in self.components]
        return any(stops)

    @torch.no_grad()
    def sample(self, step: int, logger: MetricsLogger) -> Path | None:
        """Sample the validation grid and save it (rank 0). Without FSDP only rank 0 samples, with the plain
        module (a DDP forward would wait for the other ranks); under FSDP every rank samples (each forward gathers
        the shards) and rank 0 saves."""
        val, fsdp, adapter = self.cfg.validation, is_fsdp(self.acc), self.task.adapter
        if not (fsdp or self.acc.is_main_process):
            return None
        prompts = self.task.validation_prompts(val.num_samples)
        spec = GenerationSpec.from_sample_config(
            self.cfg.policy.diffusers.sample,
            adapter,
            self.cfg.policy.diffusers.inference_size,
            evaluation=True,
        )
        seeds = [self.cfg.train.seed + i for i in range(len(prompts))]
        module, forward = adapter.trainable_module(), adapter.forward_module
        adapter.forward_module = forward if fsdp else None
        module.eval()
        try:
            with self.state.ema_weights():
                images = generate_images(adapter, prompts, seeds, spec, batch_size=val.batch_size)
        finally:
            module.train()
            adapter.forward_module = forward
        if not self.acc.is_main_process:
            return None
        ema = " (EMA weights)" if self.state.ema is not None else ""
        path = save_media(
            images,
            prompts,
            self.run_dir / "samples" / f"step_{step:08d}",
            title=f"step {step}: validation samples{ema}",
        )
        logger.log_media(step, "samples", path)
        logged = self._log_held_out_rewards(step, logger, images, prompts)
        for component in self.components:
            component.observe(step, images, prompts, logged)
        return path

    def _log_held_out_rewards(self, step: int, logger: MetricsLogger, images, prompts: list[str]) -> dict:
        """Score the samples with `validation.held_out_rewards` and log their means as `heldout/<reward>/<key>`,
        with the components' own metrics of the samples (the guard's image statistics `heldout/image/<stat>`).
        Returns what was logged."""
        logged: dict[str, float] = {}
        if self.cfg.validation.held_out_rewards:
            metadata = self.task.validation_metadata(len(prompts))
            scores = score_images(images, prompts, metadata, self.held_out_rewards())
            logged = {f"heldout/{key}": describe(values)["mean"] for key, values in scores.items()}
        for component in self.components:
            logged.update(component.validation_metrics(images))
        if logged:
            logger.log(step, logged)
        return logged
