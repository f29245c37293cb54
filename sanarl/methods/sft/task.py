"""SFT and LoRA-SFT: flow matching on (image, caption) pairs (docs/algorithms.md, "SFT").

One step:
  1. data: this rank's items of the step (a pure function of seed, step, rank), collated by the plugin;
  2. randomness: u from the timestep density, noise eps, the caption-dropout mask (whole batch at once);
  3. objective per micro-batch: x0 = VAE(media), s = shift(u), x_s = (1 - s) x0 + s eps,
         loss = mean_B( w(s) * mean_CHW (v_theta(x_s, s, c) - (eps - x0))^2 )
     (video: the mean runs over C, T', h, w of the clip latents).
LoRA on or off is decided by `[policy.lora]` alone.
"""

from __future__ import annotations

from typing import TypedDict

import torch

from sanarl.config.schema import Config, DiffusersConfig
from sanarl.core.flow import interpolate, velocity_target
from sanarl.core.timesteps import loss_weight, sample_u, u_to_sigma
from sanarl.errors import DataError
from sanarl.methods.checked_task import ItemTask
from sanarl.methods.sft.config import SFTView, view
from sanarl.training.data_order import split_batch, step_indices
from sanarl.training.protocol import per_rank_batch, run_settings, steps_plan
from sanarl.training.sampling import grid_shift


def draw_flow_matching_noise(
    diff: DiffusersConfig, count: int, latent: tuple[int, ...], rng: torch.Generator
) -> dict[str, torch.Tensor]:
    """Per-sample randomness of a step, drawn for the whole per-rank batch at once so that any micro-batch split
    gives the same numbers, in this order: timestep u [B], noise eps [B, *latent], caption keep mask [B]."""
    u = sample_u(
        diff.weighting_scheme,
        count,
        generator=rng,
        logit_mean=diff.logit_mean,
        logit_std=diff.logit_std,
        mode_scale=diff.mode_scale,
    )
    eps = torch.randn((count, *latent), generator=rng)
    keep = torch.rand(count, generator=rng) >= diff.caption_dropout
    return {"u": u, "eps": eps, "keep_caption": keep}


def draw_vae_noise(adapter, count: int, latent: tuple[int, ...], rng: torch.Generator) -> dict:
    """`{"vae_noise": [B, *latent]}` for an encoder that samples its posterior (`adapter.latent_sampling`), drawn
    after the step's other randomness; `{}` for deterministic encoders (the streams of those runs stay as they are)."""
    if not getattr(adapter, "latent_sampling", False):
        return {}
    return {"vae_noise": torch.randn((count, *latent), generator=rng)}


def encode_media(adapter, media: torch.Tensor, batch: dict) -> torch.Tensor:
    """Latents of a micro-batch's media, drawn with the batch's `vae_noise` when the encoder samples."""
    if "vae_noise" in batch:
        return adapter.encode_images(media, noise=batch["vae_noise"])
    return adapter.encode_images(media)


def media_key(batch: dict, plugin: str) -> str:
    """The batch's training media: "image" ([B, 3, H, W]) or "video" ([B, 3, T, H, W] clips).

    Raises:
        DataError: naming the plugin when its items carry neither.
    """
    for key in ("image", "video"):
        if key in batch:
            return key
    raise DataError(
        f"plugin `{plugin}` returned items without an `image` (or `video`) for SFT; SFT items are "
        '{"prompt": str, "image": FloatTensor[3,H,W] in [0,1]} or {"prompt": str, "video": FloatTensor[3,T,H,W] '
        "in [0,1]} (docs/plugins.md, docs/video.md)."
    )


def latent_shape_of(adapter, media_shape: torch.Size | tuple[int, ...]) -> tuple[int, ...]:
    """Per-sample latent shape of a media batch [B, 3, H, W] or [B, 3, T, H, W] (clips pass their own frame count
    T, so training encodes `train_frames` while generation uses the adapter's default `inference_frames`)."""
    height, width = media_shape[-2:]
    if len(media_shape) == 5:
        return adapter.latent_shape(height, width, frames=media_shape[2])
    return adapter.latent_shape(height, width)


class SFTBatch(TypedDict, total=False):
    """One SFT micro-batch: the plugin's collated items plus the step's randomness (`image` or `video`)."""

    prompt: list[str]
    image: torch.Tensor
    """[B, 3, H, W] in [0, 1] (or `video` [B, 3, T, H, W])."""
    video: torch.Tensor
    u: torch.Tensor
    """[B] timestep draws, mapped to sigmas by the shift."""
    eps: torch.Tensor
    """[B, *latent] noise."""
    keep_caption: torch.Tensor
    """[B] bool: False drops the caption (caption dropout)."""
    vae_noise: torch.Tensor
    """[B, *latent] posterior noise of a sampling VAE encoder (only then)."""


class SFTTask(ItemTask):
    """Supervised flow-matching fine-tune on the plugin's `{"prompt", "image"}` (or `{"prompt", "video"}`) items."""

    view: SFTView
    """The sections SFT reads (its config.py)."""
    method_view = staticmethod(view)

    def shift(self, media: torch.Tensor) -> float:
        """The grid shift for this batch's image size: `sample.flow_shift`, else the model's own for that size."""
        return grid_shift(self.adapter, self.view.diffusers.sample.flow_shift, *media.shape[-2:])

    def steps_per_epoch(self) -> int:
        return max(1, len(self.train_dataset) // self.run.batch_per_replica)

    def micro_batches(self, step: int, rng: torch.Generator) -> list[SFTBatch]:
        # 1. this rank's items of the step
        idx = step_indices(
            len(self.train_dataset),
            self.run.seed,
            step,
            rank=self.rank,
            world=self.world,
            per_rank=self.per_rank_batch(),
        )
        batch = self.collate([self.train_dataset[i] for i in idx])
        key = media_key(batch, self.plugin.__name__)
        latent = latent_shape_of(self.adapter, batch[key].shape)
        # 2. the whole batch's randomness at once, so any micro-batch split gives the same numbers
        batch.update(draw_flow_matching_noise(self.view.diffusers, len(idx), latent, rng))
        batch.update(draw_vae_noise(self.adapter, len(idx), latent, rng))
        return split_batch(batch, self.run.mini_batch)

    def objective(self, batch: SFTBatch, rng: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        """3. The weighted flow-matching loss of one micro-batch."""
        adapter, diff = self.adapter, self.view.diffusers
        media = batch[media_key(batch, self.plugin.__name__)]
        x0 = encode_media(adapter, media, batch)
        cond = adapter.encode_captions(batch["prompt"], batch["keep_caption"].tolist())
        s = u_to_sigma(batch["u"], self.shift(media)).to(x0.device)
        eps = batch["eps"].to(x0.device)
        v = adapter.velocity(interpolate(x0, eps, s), s, cond)
        per_sample = (v - velocity_target(x0, eps)).pow(2).flatten(1).mean(1)
        loss = (loss_weight(diff.weighting_scheme, s) * per_sample).mean()
        return loss, {"loss": loss.item(), "sigma_mean": s.mean().item()}

    @staticmethod
    def describe(cfg: Config, dataset_size: int, world: int) -> list[tuple[str, str]]:
        """The batch arithmetic, without loading a model (used by `sanarl validate`)."""
        run = run_settings(cfg)
        bpr, mb = run.batch_per_replica, run.mini_batch
        per_rank = per_rank_batch(run, world)
        per_epoch = max(1, dataset_size // bpr)
        return [
            ("dataset items", str(dataset_size)),
            ("batch per step", f"{bpr} (train_batch_per_replica) / {world} rank(s) = {per_rank} per rank"),
            ("micro-batches", f"{per_rank} / mini_batch {mb} = {per_rank // mb} per rank per step"),
            ("steps", steps_plan(run, per_epoch)),
        ]
