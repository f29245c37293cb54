"""Rollouts for reward-based tasks, with Sol-RL's families (docs/algorithms.md, "DiffusionNFT" and "Sol-RL rollout
families").

For each prompt of the step, K kept samples are produced by the configured family:
  diffusionnft   K seeds with the old adapter at N steps
  naive_scaling  M seeds with the old adapter at N steps, keep K by `rollout.selection`
  compile        M seeds with a torch.compile'd merged copy at N steps, keep K
  naive_quant    M seeds with a quantized (compiled) copy at N steps, keep K (trains on quantized samples)
  sol_rl         M seeds with the quantized preview copy at `preview_step` steps, keep K seeds, regenerate exactly
                 those seeds with the full-precision copy at N steps (the regenerated samples are scored again)
Seeds are explicit (one generator per sample), so a kept seed regenerates its draft exactly. Unscorable drafts
(NaN reward) are kept only when fewer than K drafts of the prompt are scorable. Scoring runs on a
thread pool: prompt p+1 is sampled while prompt p is scored.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sanarl.config.schema import DiffusersConfig, RemoteRewardConfig, RolloutConfig
from sanarl.core.lora import using_adapter
from sanarl.core.selection import select_scorable
from sanarl.methods.group_rl.inference_copy import InferenceCopy, require_lora_for_copy
from sanarl.methods.group_rl.quantize import check_quantization
from sanarl.models.base import Cond, DiffusionAdapter
from sanarl.rewards.combine import RewardFunction, RewardResult
from sanarl.rewards.pool import RewardPool
from sanarl.rewards.remote import RemoteRewardFunction
from sanarl.training.sampling import GenerationSpec, generate_latents


@dataclass
class PromptGroup:
    """One prompt's kept rollout: latents [K, ...], images [K, 3, H, W] (clips [K, 3, T, H, W] for video), rewards
    and seeds."""

    prompt: str
    metadata: dict
    cond: Cond
    seeds: list[int]
    latents: torch.Tensor
    images: torch.Tensor
    reward: RewardResult


def group_seeds(seed: int, step: int, rank: int, prompt_index: int, count: int) -> list[int]:
    """`count` explicit 31-bit sample seeds of (seed, step, rank, prompt), independent of the family."""
    state = np.random.SeedSequence([seed, step, rank, prompt_index]).generate_state(count)
    return [int(v) & 0x7FFFFFFF for v in state]


def reward_function(
    rewards: RemoteRewardConfig, rollout: RolloutConfig, *, remote: bool
) -> RewardFunction | RemoteRewardFunction:
    """The rollout's scorer: the rewards of `[train.train_policy.remote_reward]` in this process, or through the
    reward service with `remote` (`use_remote_reward`; `rollout.reward_deadline_s` as each task's deadline)."""
    if remote:
        return RemoteRewardFunction(rewards, deadline_s=rollout.reward_deadline_s)
    return RewardFunction(rewards)


class Rollouts:
    """Generates and scores prompt groups with the configured family; owns inference copies and the pool."""

    def __init__(
        self,
        rollout: RolloutConfig,
        diffusers: DiffusersConfig,
        reward_fn: RewardFunction | RemoteRewardFunction,
        adapter: DiffusionAdapter,
        *,
        uses_lora: bool,
        compile: bool,
        sampling_adapter: str = "old",
    ) -> None:
        self.rollout_config, self.adapter, self.compile = rollout, adapter, compile
        self.sampling_adapter = sampling_adapter
        """The LoRA adapter that samples (DiffusionNFT: "old"; AWM: "default", the policy itself)."""
        ro = rollout
        self.family = ro.family
        self.k = ro.n_generation
        self.m = ro.num_candidates or self.k
        self.spec = GenerationSpec.from_sample_config(
            diffusers.sample, adapter, diffusers.inference_size, evaluation=False
        )
        self.preview_spec = GenerationSpec(**{**self.spec.__dict__, "num_steps": ro.preview_step})
        if self.family in ("naive_quant", "sol_rl"):
            check_quantization(ro.preview_precision, self.family)
        self.full_copy = self.preview_copy = None
        if self.family in ("compile", "naive_quant", "sol_rl"):
            require_lora_for_copy(uses_lora, self.family)
            self._build_copies()
        # remote: each group is enqueued on the reward service as soon as it is decoded and pulled later
        # (RemoteTask.result); the service's reward names are checked against its /health here.
        self.remote = isinstance(reward_fn, RemoteRewardFunction)
        self.reward_fn = reward_fn
        self.pool = (
            RewardPool(
                self.reward_fn, ro.reward_workers, ro.reward_deadline_s, knob="rollout.reward_deadline_s"
            )
            if ro.reward_workers > 0 and not self.remote
            else None
        )
        self.uncond = adapter.uncond_for(self.spec.guidance_scale)

    # --- inference copies ---------------------------------------------------------------------------------------
    def _build_copies(self) -> None:
        ro, live = self.rollout_config, self.adapter.trainable_module()
        quant = None if ro.preview_precision == "bf16" else ro.preview_precision
        compile_mode = ro.compile_mode if self.compile or self.family != "sol_rl" else None
        if self.family == "compile":
            self.full_copy = InferenceCopy(live, compile_mode=compile_mode)
        elif self.family == "naive_quant":
            self.full_copy = InferenceCopy(
                live, compile_mode=compile_mode, quantize=quant, min_quant_dim=ro.nvfp4_min_dim
            )
        else:
            self.full_copy = InferenceCopy(live, compile_mode=compile_mode)
            self.preview_copy = (
                self.full_copy
                if quant is None
                else InferenceCopy(
                    live, compile_mode=compile_mode, quantize=quant, min_quant_dim=ro.nvfp4_min_dim
                )
            )

    def refresh(self) -> None:
        """After an old-adapter update: copy theta_old into the inference copies."""
        live = self.adapter.trainable_module()
        for copy_ in {id(c): c for c in (self.full_copy, self.preview_copy) if c is not None}.values():
            copy_.refresh(live)

    # --- generation ---------------------------------------------------------------------------------------------
    def _sample(
        self, cond: Cond, seeds: list[int], spec: GenerationSpec, copy_: InferenceCopy | None
    ) -> torch.Tensor:
        """Final latents for seeds, in chunks of rollout.batch_size, with the old policy (adapter or copy)."""
        module = None if copy_ is None else copy_.forward_module
        live = self.adapter.trainable_module()
        lora = copy_ is None and hasattr(live, "peft_config")
        ctx = using_adapter(live, self.sampling_adapter) if lora else nullcontext()
        out, bs = [], self.rollout_config.batch_size
        with ctx, torch.no_grad():
            for i in range(0, len(seeds), bs):
                chunk = seeds[i : i + bs]
                rows = cond.expand_to(1).select([0] * len(chunk)) if len(cond) == 1 else cond
                out.append(
                    generate_latents(
                        self.adapter, rows, chunk, spec, uncond=self.uncond, module=module
                    ).latents
                )
        return torch.cat(out)

    def _score(self, images: torch.Tensor, prompt: str, metadata: dict):
        args = (images, [prompt] * len(images), [metadata] * len(images))
        if self.remote:
            return self.reward_fn.submit(*args)
        if self.pool is None:
            return _Ready(self.reward_fn(*args))
        return self.pool.submit(*args)

    def rollout(
        self, prompts: list[str], metadatas: list[dict], seeds: list[list[int]]
    ) -> tuple[list[PromptGroup], dict]:
        """Kept groups for the prompts (seeds[p] holds M seeds of prompt p) and timing / search metrics."""
        t0 = time.perf_counter()
        first_copy = self.preview_copy if self.family == "sol_rl" else self.full_copy
        first_spec = self.preview_spec if self.family == "sol_rl" else self.spec
        drafts = []
        for prompt, meta, group_seeds_ in zip(prompts, metadatas, seeds, strict=True):
            cond = self.adapter.encode_prompts([prompt])
            latents = self._sample(cond, group_seeds_, first_spec, first_copy)
            images = self.adapter.decode(latents).cpu()
            drafts.append(
                (prompt, meta, cond, group_seeds_, latents, images, self._score(images, prompt, meta))
            )
        results = [d[-1].result() for d in drafts]
        t1 = time.perf_counter()
        groups = [self._keep(d, r) for d, r in zip(drafts, results, strict=True)]
        metrics = {"time_rollout_search": t1 - t0, "rollout_images": float(sum(len(d[3]) for d in drafts))}
        if self.family == "sol_rl":
            metrics["reward_preview_kept_mean"] = kept_mean(groups)  # the kept drafts' preview rewards
            groups = self._regenerate(groups)
            metrics["rollout_images"] += sum(len(g.seeds) for g in groups)
        metrics["time_rollout"] = time.perf_counter() - t0
        return groups, metrics

    def rollout_with(
        self,
        prompts: list[str],
        metadatas: list[dict],
        seeds: list[list[int]],
        sample_fn: Callable[[Cond, list[int]], tuple[torch.Tensor, Any]],
    ) -> tuple[list[PromptGroup], list[Any], dict]:
        """Family-free rollout for on-policy tasks (Flow-GRPO): `sample_fn(cond [1 row], seeds[p])` returns prompt
        p's final latents [K, ...] and anything else it kept (e.g. its SDE trajectory); the groups are decoded and
        scored as in `rollout` (prompt p is scored while p + 1 samples). Returns the groups, each group's extra,
        and timings."""
        t0 = time.perf_counter()
        drafts, extras = [], []
        for prompt, meta, group in zip(prompts, metadatas, seeds, strict=True):
            cond = self.adapter.encode_prompts([prompt])
            latents, extra = sample_fn(cond, group)
            images = self.adapter.decode(latents).cpu()
            drafts.append((prompt, meta, cond, group, latents, images, self._score(images, prompt, meta)))
            extras.append(extra)
        groups = [PromptGroup(*d[:-1], d[-1].result()) for d in drafts]
        images = float(sum(len(g) for g in seeds))
        return groups, extras, {"time_rollout": time.perf_counter() - t0, "rollout_images": images}

    def _keep(self, draft: tuple, result: RewardResult) -> PromptGroup:
        prompt, meta, cond, seeds, latents, images, _ = draft
        if self.m == self.k:
            return PromptGroup(prompt, meta, cond, seeds, latents, images, result)
        total = torch.where(result.nan_mask, torch.full_like(result.total, float("nan")), result.total)
        pick = torch.Generator().manual_seed(int(seeds[0]))  # the random modes: a pure function of the group
        keep = select_scorable(total, self.k, self.rollout_config.selection, generator=pick).tolist()
        kept = RewardResult(
            result.total[keep],
            {k: v[keep] for k, v in result.per_key.items()},
            result.nan_mask[keep],
            result.durations,
        )
        return PromptGroup(prompt, meta, cond, [seeds[i] for i in keep], latents[keep], images[keep], kept)

    def _regenerate(self, groups: list[PromptGroup]) -> list[PromptGroup]:
        """sol_rl stage 2: the kept seeds at full precision and full steps, scored again."""
        fresh = []
        for g in groups:
            latents = self._sample(g.cond, g.seeds, self.spec, self.full_copy)
            images = self.adapter.decode(latents).cpu()
            fresh.append((g, latents, images, self._score(images, g.prompt, g.metadata)))
        return [
            PromptGroup(g.prompt, g.metadata, g.cond, g.seeds, lat, img, fut.result())
            for g, lat, img, fut in fresh
        ]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close(wait=False, cancel_pending=True)


def kept_mean(groups: list[PromptGroup]) -> float:
    """Mean reward of the kept samples that have one (NaN rewards left out; NaN only if none has one)."""
    total = torch.cat([g.reward.total for g in groups])
    finite = total[~torch.cat([g.reward.nan_mask for g in groups]) & torch.isfinite(total)]
    return float(finite.mean()) if len(finite) else float("nan")


class _Ready:
    """A finished result with the future interface (synchronous scoring)."""

    def __init__(self, value: RewardResult) -> None:
        self.value = value

    def result(self) -> RewardResult:
        return self.value
