"""DiffusionNFT's side of the NFT pair: the iteration of its `scripts/train_nft_sd3.py` (`main()`'s epoch body),
driven step by step in the script's order with the checkout's own modules:
`diffusers_patch.pipeline_with_logprob.pipeline_with_logprob` (deterministic DPM-Solver++ 2M sampling with the
"old" adapter), `diffusers_patch.train_dreambooth_lora_sd3.encode_prompt`, `stat_tracking.PerPromptStatTracker`,
`ema.EMAModuleWrapper` and `rewards.multi_score` (`jpeg_compressibility`).

The script itself is not run: its `main()` sets up NCCL on `cuda:<LOCAL_RANK>` and DistributedDataParallel, and
needs wandb, ml_collections' config files and a prompt folder. One process here, so no DDP wrapper (its
all-reduces are no-ops at world size 1) and no cross-rank gathers; left out as well: logging (wandb, zero-std
ratios, top-reward means) and evaluation / checkpoints every `eval_freq` / `save_freq` epochs. Set-up and loop
follow the script with the SD3 PickScore config's values (`config/nft.py`): float32 (mixed precision off, so no
GradScaler step), LoRA "default" and "old" (rank, alpha = 2 x rank, gaussian), AdamW, EMA (decay 0.9 every step),
beta 1.0, train.beta (KL) 1e-4, adv_clip_max 5, timestep_fraction 0.99, decay_type 1, global_std, guidance 1.0
(no CFG), per trained level the old (no grad), current and reference (adapter off) forwards, the adaptive-weight
positive / negative losses, gradient accumulation over every micro-batch and level into one optimizer step, and
the old adapter's decay copy at the end. Prompt batches: each prompt repeated `group` times, cut into sampling
batches of `batch` (the script's K-repeat sampler, unshuffled).
"""

from __future__ import annotations

import time
from concurrent import futures
from pathlib import Path

import torch
from _peer_import import import_reference
from _peers import PhaseClock, ReferenceSd3Side, Work, frozen_sd3_pipeline, reference_lora_config

MODULES = [
    "diffusers_patch.pipeline_with_logprob",
    "diffusers_patch.train_dreambooth_lora_sd3",
    "stat_tracking",
    "ema",
    "rewards",
]
BETA, KL_BETA, ADV_CLIP_MAX, TIMESTEP_FRACTION = 1.0, 1e-4, 5.0, 0.99
"""config.beta, config.train.beta, config.train.adv_clip_max, config.train.timestep_fraction (SD3 PickScore)."""


def old_decay(step: int) -> float:
    """`decay_type = 1` of the script's `return_decay`: flat 0, rising 0.001 a step, held at 0.5."""
    return min(step * 0.001, 0.5)


class DiffusionNftSide(ReferenceSd3Side):
    def __init__(self, checkout: Path, work: Work, model: Path, scratch: Path) -> None:
        from peft import get_peft_model

        self.name, self.work = "DiffusionNFT", work
        self.m, self.patched = import_reference(checkout, "flow_grpo", MODULES, scratch)
        pipe = frozen_sd3_pipeline(model)
        lora = reference_lora_config(work.rank)
        model_ = get_peft_model(pipe.transformer, lora)
        model_.add_adapter("old", lora)
        model_.set_adapter("default")
        self.params = [p for p in model_.parameters() if p.requires_grad]
        model_.set_adapter("old")
        self.old_params = [p for p in model_.parameters() if p.requires_grad]
        model_.set_adapter("default")
        pipe.transformer = self.transformer = model_
        self.pipe, self.device = pipe, torch.device("cpu")
        self.optimizer = torch.optim.AdamW(
            self.params, lr=3e-4, betas=(0.9, 0.999), weight_decay=1e-4, eps=1e-8
        )
        neg, neg_pooled = self._embed([""])
        self.neg, self.neg_pooled = neg.repeat(work.batch, 1, 1), neg_pooled.repeat(work.batch, 1)
        self.tracker = self.m["stat_tracking"].PerPromptStatTracker(True)
        self.clock = PhaseClock()
        score = self.m["rewards"].multi_score(self.device, {"jpeg_compressibility": 1.0})
        self.reward_fn = self.clock.timed_reward(score)
        self.executor = futures.ThreadPoolExecutor(max_workers=8)
        self.ema = self.m["ema"].EMAModuleWrapper(
            self.params, decay=0.9, update_step_interval=1, device=self.device
        )
        self.levels = int(work.steps * TIMESTEP_FRACTION)
        self.batches = work.samples // work.micro
        self.accumulation = (work.samples // work.batch) // work.updates * self.levels
        self.global_step, self.last_info = 0, {}
        for src, dst in zip(self.params, self.old_params, strict=True):
            dst.data.copy_(src.detach().data)

    def _sample(self) -> list[dict]:
        """SAMPLING with the old adapter; each batch's reward goes to the pool as the next batch samples."""
        w, pipe, samples = self.work, self.pipe, []
        pipe.transformer.eval()
        for prompts in self._prompt_batches():
            self.transformer.set_adapter("default")
            embeds, pooled = self._embed(prompts)
            ids = pipe.tokenizer(
                prompts, padding="max_length", max_length=256, truncation=True, return_tensors="pt"
            ).input_ids
            self.transformer.set_adapter("old")
            with torch.no_grad():
                images, latents, _ = self.m["diffusers_patch.pipeline_with_logprob"].pipeline_with_logprob(
                    pipe,
                    prompt_embeds=embeds,
                    pooled_prompt_embeds=pooled,
                    negative_prompt_embeds=self.neg[: len(prompts)],
                    negative_pooled_prompt_embeds=self.neg_pooled[: len(prompts)],
                    num_inference_steps=w.steps,
                    guidance_scale=1.0,
                    output_type="pt",
                    height=w.size,
                    width=w.size,
                    noise_level=w.noise_level,
                    deterministic=True,
                    solver="dpm2",
                    model_type="sd3",
                )
            self.transformer.set_adapter("default")
            latents = torch.stack(latents, dim=1)
            timesteps = pipe.scheduler.timesteps.repeat(len(prompts), 1)
            future = self.executor.submit(
                self.reward_fn, images, prompts, [{}] * len(prompts), only_strict=True
            )
            time.sleep(0)
            samples.append(
                {
                    "prompt_ids": ids,
                    "prompt_embeds": embeds,
                    "pooled_prompt_embeds": pooled,
                    "timesteps": timesteps,
                    "next_timesteps": torch.cat(
                        [timesteps[:, 1:], torch.zeros_like(timesteps[:, :1])], dim=1
                    ),
                    "latents_clean": latents[:, -1],
                    "rewards": future,
                }
            )
        for sample in samples:
            rewards, _ = sample["rewards"].result()
            sample["rewards"] = {k: torch.as_tensor(v).float() for k, v in rewards.items()}
        return samples

    def _advantages(self, samples: list[dict]) -> dict:
        out = {
            k: torch.cat([s[k] for s in samples])
            if not isinstance(samples[0][k], dict)
            else {sk: torch.cat([s[k][sk] for s in samples]) for sk in samples[0][k]}
            for k in samples[0]
        }
        rewards = out.pop("rewards")
        avg = rewards["avg"].unsqueeze(1).repeat(1, self.levels).numpy()
        prompts = self.pipe.tokenizer.batch_decode(out.pop("prompt_ids").numpy(), skip_special_tokens=True)
        adv = self.tracker.update(prompts, avg)
        self.tracker.clear()
        out["advantages"] = torch.from_numpy(adv.reshape(1, len(prompts), -1)[0])
        return out

    def _forward(self, xt, timestep, embeds, pooled) -> torch.Tensor:
        return self.transformer(
            hidden_states=xt, timestep=timestep, encoder_hidden_states=embeds, pooled_projections=pooled,
            return_dict=False,
        )[0]  # fmt: skip

    def _level_loss(self, batch: dict, j: int) -> tuple[torch.Tensor, dict]:
        """One trained level of a micro-batch: the three forwards and the NFT loss with its log terms."""
        x0, timestep = batch["latents_clean"], batch["timesteps"][:, j]
        t = (timestep / 1000.0).view(-1, *([1] * (x0.ndim - 1)))
        xt = (1 - t) * x0 + t * torch.randn_like(x0.float())
        embeds, pooled = batch["prompt_embeds"], batch["pooled_prompt_embeds"]
        self.transformer.set_adapter("old")
        with torch.no_grad():
            old = self._forward(xt, timestep, embeds, pooled).detach()
        self.transformer.set_adapter("default")
        current = self._forward(xt, timestep, embeds, pooled)
        with torch.no_grad(), self.transformer.disable_adapter():
            ref = self._forward(xt, timestep, embeds, pooled)
        self.transformer.set_adapter("default")
        dims = tuple(range(1, x0.ndim))
        adv = torch.clamp(batch["advantages"][:, j], -ADV_CLIP_MAX, ADV_CLIP_MAX)
        r = torch.clamp((adv / ADV_CLIP_MAX) / 2.0 + 0.5, 0, 1)
        terms = {
            "x0_norm": torch.mean(x0**2).detach(),
            "x0_norm_max": torch.max(x0**2).detach(),
            "old_deviate": torch.mean((current - old) ** 2).detach(),
            "old_deviate_max": torch.max((current - old) ** 2).detach(),
        }
        positive = BETA * current + (1 - BETA) * old
        negative = (1.0 + BETA) * old - BETA * current
        losses = []
        for prediction in (positive, negative):
            x0_pred = xt - t * prediction
            with torch.no_grad():
                weight = torch.abs(x0_pred.double() - x0.double()).mean(dim=dims, keepdim=True).clip(min=1e-5)
            losses.append(((x0_pred - x0) ** 2 / weight).mean(dim=dims))
        unweighted = r * losses[0] / BETA + (1.0 - r) * losses[1] / BETA
        policy = (unweighted * ADV_CLIP_MAX).mean()
        kl = ((current - ref) ** 2).mean(dim=dims)
        loss = policy + KL_BETA * torch.mean(kl)
        terms.update(
            policy_loss=policy.detach(),
            unweighted_policy_loss=unweighted.mean().detach(),
            kl_div=torch.mean(kl).detach(),
            total_loss=loss.detach(),
        )
        terms["old_kl_div"] = torch.mean(((old - ref) ** 2).mean(dim=dims)).detach()
        return loss, terms

    def _train(self, samples: dict) -> None:
        """TRAINING: shuffle samples and levels, micro-batches x levels backward, optimizer step and EMA at
        each accumulation boundary; then the old adapter's decay copy."""
        self.transformer.train()
        total, levels = samples["timesteps"].shape
        perm = torch.randperm(total)
        shuffled = {k: v[perm] for k, v in samples.items()}
        perms = torch.stack([torch.randperm(levels) for _ in range(total)])
        for key in ("timesteps", "next_timesteps"):
            shuffled[key] = shuffled[key][torch.arange(total)[:, None], perms]
        size, done, info = total // self.batches, 0, {}
        for b in range(self.batches):
            batch = {k: v[b * size : (b + 1) * size] for k, v in shuffled.items()}
            for j in range(self.levels):
                loss, terms = self._level_loss(batch, j)
                (loss / self.accumulation).backward()
                done += 1
                for k, v in terms.items():
                    info.setdefault(k, []).append(v)
                if done % self.accumulation == 0:
                    torch.nn.utils.clip_grad_norm_(self.transformer.parameters(), 1.0)
                    self.optimizer.step()
                    self.optimizer.zero_grad()
                    self.last_info = {k: torch.mean(torch.stack(v)).item() for k, v in info.items()}
                    info, self.global_step = {}, self.global_step + 1
            if done % self.accumulation == 0:
                self.ema.step(self.params, self.global_step)
        with torch.no_grad():
            decay = old_decay(self.global_step)
            for src, dst in zip(self.params, self.old_params, strict=True):
                dst.data.copy_(dst.detach().data * decay + src.detach().clone().data * (1.0 - decay))

    def iteration(self) -> dict[str, float]:
        return self.clock.iteration(lambda: self._train(self._advantages(self._timed_sample())))
