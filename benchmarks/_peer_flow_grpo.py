"""flow_grpo's side of the Flow-GRPO-Fast pair: the iteration of its `scripts/train_sd3_fast.py` (`main()`'s
`while True` body), driven step by step in the script's order with the checkout's own modules:
`diffusers_patch.sd3_pipeline_with_logprob_fast.pipeline_with_logprob` (SDE window sampling),
`diffusers_patch.sd3_sde_with_logprob.sde_step_with_logprob` (trained log-probs),
`diffusers_patch.train_dreambooth_lora_sd3.encode_prompt`, `stat_tracking.PerPromptStatTracker`,
`ema.EMAModuleWrapper` and `rewards.multi_score` (`jpeg_compressibility`).

The script itself is not run: its `main()` needs wandb, ml_collections' config files and a prompt folder, and its
per-iteration work outside the loop below is logging (wandb images and scalars, zero-std ratios) and evaluation
every `eval_freq` epochs, which are left out. Set-up follows the script: the pipeline in float32 (`from_pretrained`
without a dtype), LoRA (rank, alpha = 2 x rank, gaussian) through peft, `Accelerator(mixed_precision="no")` with
its gradient accumulation of `gradient_accumulation_steps x num_train_timesteps` backward passes, AdamW, EMA
(decay 0.9 every 8 steps), a thread pool scoring each sampling batch while the next samples. Prompt batches: each
prompt repeated `group` times, cut into sampling batches of `batch` (the script's K-repeat sampler, unshuffled).
"""

from __future__ import annotations

import contextlib
import time
from concurrent import futures
from pathlib import Path

import torch
from _peer_import import import_reference
from _peers import PhaseClock, ReferenceSd3Side, Work, frozen_sd3_pipeline, reference_lora_config

MODULES = [
    "diffusers_patch.sd3_pipeline_with_logprob_fast",
    "diffusers_patch.sd3_sde_with_logprob",
    "diffusers_patch.train_dreambooth_lora_sd3",
    "stat_tracking",
    "ema",
    "rewards",
]
CLIP_RANGE = 1e-5
ADV_CLIP_MAX = 5.0
"""flow_grpo's fast SD3 configs: train.clip_range, train.adv_clip_max (beta = 0: no KL forward)."""


class FlowGrpoSide(ReferenceSd3Side):
    def __init__(self, checkout: Path, work: Work, model: Path, scratch: Path) -> None:
        from accelerate import Accelerator
        from peft import get_peft_model

        self.name, self.work = "flow_grpo", work
        self.m, self.patched = import_reference(checkout, "flow_grpo", MODULES, scratch)
        pipe = frozen_sd3_pipeline(model)
        lora = reference_lora_config(work.rank)
        pipe.transformer = get_peft_model(pipe.transformer, lora)
        self.pipe, self.device = pipe, torch.device("cpu")
        self.params = [p for p in pipe.transformer.parameters() if p.requires_grad]
        self.ema = self.m["ema"].EMAModuleWrapper(
            self.params, decay=0.9, update_step_interval=8, device=self.device
        )
        optimizer = torch.optim.AdamW(self.params, lr=3e-4, betas=(0.9, 0.999), weight_decay=1e-4, eps=1e-8)
        self.clock = PhaseClock()
        score = self.m["rewards"].multi_score(self.device, {"jpeg_compressibility": 1.0})
        self.reward_fn = self.clock.timed_reward(score)
        self.batches = work.samples // work.batch
        self.accumulation = self.batches // work.updates
        self.acc = Accelerator(
            cpu=True, mixed_precision="no", gradient_accumulation_steps=self.accumulation * work.window
        )
        self.transformer, self.optimizer = self.acc.prepare(pipe.transformer, optimizer)
        neg, neg_pooled = self._embed([""])
        self.neg, self.neg_pooled = neg.repeat(work.batch, 1, 1), neg_pooled.repeat(work.batch, 1)
        self.tracker = self.m["stat_tracking"].PerPromptStatTracker(True)  # the fast configs: global_std
        self.executor = futures.ThreadPoolExecutor(max_workers=8)
        self.global_step, self.last_info = 0, {}

    def _sample(self) -> list[dict]:
        """SAMPLING: each batch encoded, sampled with the SDE window, its reward submitted to the pool."""
        w, pipe, samples = self.work, self.pipe, []
        pipe.transformer.eval()
        for prompts in self._prompt_batches():
            embeds, pooled = self._embed(prompts)
            ids = pipe.tokenizer(
                prompts, padding="max_length", max_length=256, truncation=True, return_tensors="pt"
            ).input_ids
            with torch.no_grad():
                images, latents, log_probs, timesteps = self.m[
                    "diffusers_patch.sd3_pipeline_with_logprob_fast"
                ].pipeline_with_logprob(
                    pipe,
                    prompt_embeds=embeds,
                    pooled_prompt_embeds=pooled,
                    negative_prompt_embeds=self.neg,
                    negative_pooled_prompt_embeds=self.neg_pooled,
                    num_inference_steps=w.steps,
                    guidance_scale=w.guidance,
                    output_type="pt",
                    height=w.size,
                    width=w.size,
                    noise_level=w.noise_level,
                    generator=None,
                    sde_window_size=w.window,
                    sde_window_range=(0, w.window),
                    sde_type="sde",
                )
            latents = torch.stack(latents, dim=1)
            future = self.executor.submit(
                self.reward_fn, images, prompts, [{}] * len(prompts), only_strict=True
            )
            time.sleep(0)
            samples.append(
                {
                    "prompt_ids": ids,
                    "prompt_embeds": embeds,
                    "pooled_prompt_embeds": pooled,
                    "timesteps": torch.stack(timesteps).unsqueeze(0).repeat(len(prompts), 1),
                    "latents": latents[:, :-1],
                    "next_latents": latents[:, 1:],
                    "log_probs": torch.stack(log_probs, dim=1),
                    "rewards": future,
                }
            )
        for sample in samples:
            rewards, _ = sample["rewards"].result()
            sample["rewards"] = {k: torch.as_tensor(v).float() for k, v in rewards.items()}
        return samples

    def _advantages(self, samples: list[dict]) -> dict:
        """Collate, per-prompt advantages (the decoded prompt ids), drop all-zero-advantage samples."""
        out = {
            k: torch.cat([s[k] for s in samples])
            if not isinstance(samples[0][k], dict)
            else {sk: torch.cat([s[k][sk] for s in samples]) for sk in samples[0][k]}
            for k in samples[0]
        }
        rewards = out.pop("rewards")
        avg = self.acc.gather(rewards["avg"].unsqueeze(1).repeat(1, self.work.window)).numpy()
        prompts = self.pipe.tokenizer.batch_decode(
            self.acc.gather(out.pop("prompt_ids")).numpy(), skip_special_tokens=True
        )
        adv = self.tracker.update(prompts, avg)
        self.tracker.clear()
        out["advantages"] = torch.as_tensor(adv).reshape(self.acc.num_processes, -1, adv.shape[-1])[0]
        mask = out["advantages"].abs().sum(dim=1) != 0
        true_count = mask.sum()
        if true_count % self.batches != 0 or true_count == 0:
            false_idx = torch.where(~mask)[0]
            need = self.batches - (true_count % self.batches)
            if len(false_idx) >= need:
                mask[false_idx[torch.randperm(len(false_idx))[:need]]] = True
        return {k: v[mask] for k, v in out.items()}

    def _log_prob(self, sample: dict, j: int, embeds: torch.Tensor, pooled: torch.Tensor):
        """The script's `compute_log_prob` with `train.cfg`: both CFG branches in one forward."""
        latents = sample["latents"][:, j]
        pred = self.transformer(
            hidden_states=torch.cat([latents] * 2),
            timestep=torch.cat([sample["timesteps"][:, j]] * 2),
            encoder_hidden_states=embeds,
            pooled_projections=pooled,
            return_dict=False,
        )[0]
        uncond, text = pred.chunk(2)
        pred = uncond + self.work.guidance * (text - uncond)
        return self.m["diffusers_patch.sd3_sde_with_logprob"].sde_step_with_logprob(
            self.pipe.scheduler,
            pred.float(),
            sample["timesteps"][:, j],
            latents.float(),
            prev_sample=sample["next_latents"][:, j].float(),
            noise_level=self.work.noise_level,
            sde_type="sde",
        )

    def _train_level(self, sample: dict, j: int, embeds, pooled, info: dict) -> None:
        with self.acc.accumulate(self.transformer), contextlib.nullcontext():  # LoRA: the script's autocast
            _, log_prob, _, _ = self._log_prob(sample, j, embeds, pooled)
            adv = torch.clamp(sample["advantages"][:, j], -ADV_CLIP_MAX, ADV_CLIP_MAX)
            ratio = torch.exp(log_prob - sample["log_probs"][:, j])
            unclipped = -adv * ratio
            clipped = -adv * torch.clamp(ratio, 1.0 - CLIP_RANGE, 1.0 + CLIP_RANGE)
            loss = torch.mean(torch.maximum(unclipped, clipped))
            info["approx_kl"].append(0.5 * torch.mean((log_prob - sample["log_probs"][:, j]) ** 2))
            info["clipfrac"].append(torch.mean((torch.abs(ratio - 1.0) > CLIP_RANGE).float()))
            info["policy_loss"].append(loss)
            info["loss"].append(loss)
            self.acc.backward(loss)
            if self.acc.sync_gradients:
                self.acc.clip_grad_norm_(self.transformer.parameters(), 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad()
        if self.acc.sync_gradients:  # the script's per-update log record (it then goes to wandb)
            self.last_info = {k: torch.mean(torch.stack(v)) for k, v in info.items()}
            info.clear()
            self.global_step += 1

    def _train(self, samples: dict) -> None:
        """TRAINING: one inner epoch over `batches` micro-batches, every window level, EMA after each batch."""
        from collections import defaultdict

        total = samples["timesteps"].shape[0]
        batched = {k: v.reshape(-1, total // self.batches, *v.shape[1:]) for k, v in samples.items()}
        batched = [dict(zip(batched, x, strict=True)) for x in zip(*batched.values(), strict=True)]
        self.pipe.transformer.train()
        info = defaultdict(list)
        for sample in batched:
            n = len(sample["prompt_embeds"])
            embeds = torch.cat([self.neg[:n], sample["prompt_embeds"]])
            pooled = torch.cat([self.neg_pooled[:n], sample["pooled_prompt_embeds"]])
            for j in range(self.work.window):
                self._train_level(sample, j, embeds, pooled, info)
            self.ema.step(self.params, self.global_step)

    def iteration(self) -> dict[str, float]:
        return self.clock.iteration(lambda: self._train(self._advantages(self._timed_sample())))
