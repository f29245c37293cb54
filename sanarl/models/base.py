"""The model seam: one small interface every family adapter implements.

Runners and tasks only talk to `DiffusionAdapter`; timestep scaling, text masks, pooled embeddings, latent
normalisation and CFG batching live inside the family adapters (sana.py, ...). Conventions (docs/algorithms.md,
"Conventions"): images are float [B, 3, H, W] in [0, 1]; `velocity(x_s, s, cond)` predicts `eps - x0` at noise
level `s` in [0, 1].
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sanarl.config.schema import PolicyConfig
from sanarl.core.flow import grid, model_timestep
from sanarl.core.samplers import cfg_velocity
from sanarl.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""`policy.diffusers.dtype` / `train.param_dtype` names -> torch dtypes."""


def transformer_dtype(policy: PolicyConfig) -> torch.dtype:
    """The dtype the transformer is held in: float32 master weights when all of it trains (no `[policy.lora]`, or
    `frozen_base_float32`), else the frozen base stays in `policy.diffusers.dtype` (the LoRA weights are float32)."""
    if policy.lora is None or policy.diffusers.frozen_base_float32:
        return torch.float32
    return DTYPES[policy.diffusers.dtype]


@dataclass
class Cond:
    """Prompt conditioning of a batch. embeds [B, L, D]; mask [B, L] (1 = token); pooled [B, P] or None."""

    embeds: torch.Tensor
    mask: torch.Tensor | None = None
    pooled: torch.Tensor | None = None

    def _map(self, fn) -> Cond:
        return replace(self, **{f.name: fn(getattr(self, f.name)) for f in fields(self)})

    def __len__(self) -> int:
        return self.embeds.shape[0]

    def select(self, index: torch.Tensor | slice | list[int]) -> Cond:
        """Rows `index` of every tensor."""
        return self._map(lambda t: None if t is None else t[index])

    def repeat_interleave(self, k: int) -> Cond:
        """Each row repeated k times in place: [a, b] -> [a]*k + [b]*k."""
        return self._map(lambda t: None if t is None else t.repeat_interleave(k, dim=0))

    def expand_to(self, batch: int) -> Cond:
        """A one-row Cond broadcast to `batch` rows."""
        if len(self) == batch:
            return self
        if len(self) != 1:
            raise ValueError(f"cannot expand a Cond of {len(self)} rows to {batch}")
        return self._map(lambda t: None if t is None else t.expand(batch, *t.shape[1:]))

    def to(self, device: torch.device | str) -> Cond:
        return self._map(lambda t: None if t is None else t.to(device))

    @staticmethod
    def cat(conds: list[Cond]) -> Cond:
        """Concatenate along the batch dimension."""
        first = conds[0]
        out = {}
        for f in fields(first):
            parts = [getattr(c, f.name) for c in conds]
            out[f.name] = None if parts[0] is None else torch.cat(parts, dim=0)
        return Cond(**out)


_RESHAPED_SIGMAS = (
    "use_karras_sigmas",
    "use_exponential_sigmas",
    "use_beta_sigmas",
    "shift_terminal",
    "invert_sigmas",
)
"""Scheduler options that reshape the default grid beyond what sanarl's grids reproduce."""


def scheduler_grid(scheduler: Any) -> str | None:
    """The name of the sanarl grid (`sanarl.core.flow.SIGMA_GRIDS`) equal to `scheduler.set_timesteps(N)` without
    sigmas, as a pipeline called with its defaults uses it; None when sanarl has none for this scheduler."""
    cfg = scheduler.config
    if any(cfg.get(key, None) for key in _RESHAPED_SIGMAS) or cfg.get("use_dynamic_shifting", False):
        return None
    kind = type(scheduler).__name__
    if kind == "FlowMatchEulerDiscreteScheduler":
        return "flow_match_euler"
    if kind == "DPMSolverMultistepScheduler" and cfg.get("use_flow_sigmas", False):
        return "dpm_flow"
    return None


def posterior_latents(dist: Any, noise: torch.Tensor | None, sampling: bool) -> torch.Tensor:
    """A VAE posterior's draw `mean + std noise` (float32) when `sampling` and `noise` is given, else its mean
    (SD3 and FLUX training latents, as the references' `latent_dist.sample()` with the caller's seeded noise)."""
    z = dist.mean.float()
    if noise is not None and sampling:
        z = z + dist.std.float() * noise.to(z.device, torch.float32)
    return z


class DiffusionAdapter(ABC):
    """Base class of family adapters.

    Subclasses set `transformer`, `pipeline` (the loaded diffusers pipeline, components shared) and implement
    `encode_prompts`, `_forward` (the raw model call), `encode_images`, `decode`, `latent_shape`.
    `forward_module` is what training calls (the transformer, or its DDP wrapper once the runner prepared it).
    """

    family: str = ""
    pipeline_cls: type | None = None
    default_lora_targets: tuple[str, ...] = ()

    transformer: nn.Module
    pipeline: object
    device: torch.device
    default_shift: float = 1.0
    pipeline_grid: str | None = None
    """The grid the family's pipeline samples on when called with its defaults (`sanarl.core.flow.SIGMA_GRIDS`);
    None when sanarl cannot reproduce its scheduler's (then `sample.sigma_grid` must be set)."""
    num_train_timesteps: int = 1000
    integer_timesteps: bool = False
    """Set while sampling with `sample.integer_timesteps` (`truncated_timesteps`): `model_time` is trunc(1000 s)."""
    cfg_batch: bool = True
    """Guidance runs an unconditional batch (CFG); False for guidance-distilled families (FLUX.1-dev), whose
    `guided_velocity` embeds the guidance scale instead, so no caller needs to encode the empty prompt."""

    def __init__(self) -> None:
        self.forward_module: nn.Module | None = None
        self._empty_prompt: Cond | None = None

    def _bind(self, pipeline: Any, policy: PolicyConfig, device: torch.device) -> None:
        """The set-up every family shares: the pipeline with its transformer and VAE, the device, the prompt token
        budget, offloading, the scheduler's default shift (`flow_shift`, else `shift`, else 1) and its own grid
        (the pipeline's default when called without sigmas)."""
        self.pipeline, self.transformer, self.vae = pipeline, pipeline.transformer, pipeline.vae
        self.device = device
        self.max_prompt_length = policy.diffusers.max_prompt_length
        self.offload = policy.diffusers.offload
        sched = pipeline.scheduler.config
        self.default_shift = float(sched.get("flow_shift", None) or sched.get("shift", 1.0) or 1.0)
        self.num_train_timesteps = int(sched.get("num_train_timesteps", 1000))
        self.pipeline_grid = scheduler_grid(pipeline.scheduler)

    @classmethod
    def load(cls, directory: Path, policy: PolicyConfig, device: torch.device) -> DiffusionAdapter:
        """Load `pipeline_cls` from a local directory: the frozen text encoder and VAE in `policy.diffusers.dtype`
        (kept on CPU with `offload`), the transformer on `device` read straight into `transformer_dtype(policy)`
        (float32 master weights for a full fine-tune, with no round trip through the frozen dtype; the frozen dtype
        under LoRA)."""
        dtypes = {"default": DTYPES[policy.diffusers.dtype], "transformer": transformer_dtype(policy)}
        pipe = cls.pipeline_cls.from_pretrained(str(directory), dtype=dtypes)
        pipe.set_progress_bar_config(disable=True)
        pipe.transformer.to(device)
        if not policy.diffusers.offload:
            pipe.vae.to(device)
            pipe.text_encoder.to(device)
        for module in (pipe.vae, pipe.text_encoder):
            module.requires_grad_(False).eval()
        return cls(pipe, policy, device)

    # --- family-specific ----------------------------------------------------------------------------------------
    @abstractmethod
    def encode_prompts(self, prompts: list[str]) -> Cond:
        """prompts -> Cond (no grad; the text encoder is frozen)."""

    def encode_negative_prompts(self, prompts: list[str]) -> Cond:
        """Negative (unconditional) prompts -> Cond, as the family's pipeline encodes its `negative_prompt`; the
        same as `encode_prompts` unless the pipeline encodes the two differently (SANA: no complex instruction)."""
        return self.encode_prompts(prompts)

    @abstractmethod
    def _forward(self, module: nn.Module, x: torch.Tensor, s: torch.Tensor, cond: Cond) -> torch.Tensor:
        """The raw model call with the family's timestep scaling and conditioning."""

    latent_sampling: bool = False
    """True when `encode_images` draws from the encoder's posterior (SD3 with `vae_latents = "sample"`): training
    tasks then pass `noise=` (standard normal, the latents' shape) from their seeded generator."""

    @abstractmethod
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """images [B,3,H,W] in [0,1] -> latents (the family's normalisation applied)."""

    @abstractmethod
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """latents -> images [B,3,H,W] in [0,1]."""

    @abstractmethod
    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        """Per-sample latent shape (C, h, w) for an image of height x width."""

    # --- shared -------------------------------------------------------------------------------------------------
    def velocity(
        self, x: torch.Tensor, s: torch.Tensor, cond: Cond, module: nn.Module | None = None
    ) -> torch.Tensor:
        """v_theta(x_s, s, c): x [B, ...], s [B] (or scalar) in [0, 1] -> float32 velocity like x.

        `module` runs another copy of the transformer (an inference copy); default: the trained one."""
        s, module = self._call_inputs(x, s, module)
        return self._forward(module, x, s, cond.expand_to(x.shape[0])).float()

    def _call_inputs(
        self, x: torch.Tensor, s: torch.Tensor, module: nn.Module | None
    ) -> tuple[torch.Tensor, nn.Module]:
        """s as a float32 [B] tensor on x's device, and the module to run (default: the trained one)."""
        s = torch.as_tensor(s, device=x.device, dtype=torch.float32)
        if s.ndim == 0:
            s = s.expand(x.shape[0])
        if module is None:
            module = self.forward_module if self.forward_module is not None else self.transformer
        return s, module

    def shift_for(self, height: int, width: int) -> float:
        """The grid shift for images of height x width when `sample.flow_shift` is unset: the scheduler's fixed
        shift here; families whose pipeline shifts by resolution (FLUX) override it."""
        return self.default_shift

    def model_time(self, s: torch.Tensor) -> torch.Tensor:
        """The model timestep 1000 s of levels s (float32), truncated to an integer while `integer_timesteps` is set
        (DiffusionNFT's and Sol-RL's SD3 sampler cast the float32 1000 s to a long)."""
        t = model_timestep(s)
        return torch.trunc(t) if self.integer_timesteps else t

    @contextmanager
    def truncated_timesteps(self, enabled: bool) -> Iterator[None]:
        """Within the block the model sees `model_time(s)` truncated (when `enabled`); restored afterwards."""
        before, self.integer_timesteps = self.integer_timesteps, bool(enabled)
        try:
            yield
        finally:
            self.integer_timesteps = before

    def grid_name(self, requested: str | None = None) -> str:
        """`requested` (`sample.sigma_grid`), else the pipeline's default grid.

        Raises:
            ConfigError: when neither is known (a scheduler whose grid sanarl does not reproduce)."""
        name = requested or self.pipeline_grid
        if name is None:
            kind = type(getattr(self.pipeline, "scheduler", None)).__name__
            raise ConfigError(
                f"sanarl does not reproduce the default grid of this model's scheduler ({kind}); set "
                "`policy.diffusers.sample.sigma_grid` to flow_match_euler, dpm_flow or linspace."
            )
        return name

    def sigmas(
        self,
        num_steps: int,
        shift: float,
        grid_name: str | None = None,
        *,
        device: torch.device | str | None = None,
    ) -> torch.Tensor:
        """The [N + 1] sampling grid (rollouts, trained levels, eval): `grid_name`, else the pipeline's own."""
        name = self.grid_name(grid_name)
        return grid(name, num_steps, shift, num_train_timesteps=self.num_train_timesteps, device=device)

    def empty_prompt(self) -> Cond:
        """The empty prompt, encoded as the pipeline encodes its negative prompt: CFG's unconditional branch and a
        dropped training caption. Encoded once per adapter (the text encoders are frozen)."""
        if self._empty_prompt is None:
            self._empty_prompt = self.encode_negative_prompts([""])
        return self._empty_prompt

    def uncond_for(self, guidance_scale: float) -> Cond | None:
        """The empty prompt's cond where guidance at `guidance_scale` runs an unconditional branch (a CFG family,
        w != 1), else None."""
        if guidance_scale == 1.0 or not self.cfg_batch:
            return None
        return self.empty_prompt()

    def training_guidance(self, guidance_scale: float, cfg_in_training: bool) -> float:
        """The guidance a trained forward runs at, for rollouts at `guidance_scale`: theirs with `cfg_in_training`,
        else 1 (no CFG batch). A guidance-distilled family (`cfg_batch` False) always embeds the rollout's guidance,
        a model input like the prompt."""
        return guidance_scale if cfg_in_training or not self.cfg_batch else 1.0

    def encode_captions(self, prompts: list[str], keep: list[bool]) -> Cond:
        """Training captions under caption dropout: a kept caption encoded as a prompt, a dropped one as
        `empty_prompt`, the unconditional branch the model is later sampled with."""
        kept = [p for p, k in zip(prompts, keep, strict=True) if k]
        if not kept:
            return self.empty_prompt().expand_to(len(prompts))
        cond = self.encode_prompts(kept)
        if len(kept) == len(prompts):
            return cond
        rows, at = [], 0
        for k in keep:
            rows.append(at if k else len(kept))
            at += k
        return Cond.cat([cond, self.empty_prompt()]).select(rows)

    def guided_velocity(
        self,
        x: torch.Tensor,
        s: torch.Tensor,
        cond: Cond,
        uncond: Cond | None,
        guidance_scale: float,
        module: nn.Module | None = None,
    ) -> torch.Tensor:
        """CFG velocity v_u + w (v_c - v_u), batching both branches in one forward; w == 1 -> v_c only.

        A guidance-distilled family (`cfg_batch` False) runs one forward with w in its guidance embedding
        (`_embedded_forward`) and does not use `uncond`."""
        if not self.cfg_batch:
            s, module = self._call_inputs(x, s, module)
            return self._embedded_forward(module, x, s, cond.expand_to(x.shape[0]), guidance_scale).float()
        if uncond is None or guidance_scale == 1.0:
            return self.velocity(x, s, cond, module)
        batch = x.shape[0]
        s = torch.as_tensor(s, device=x.device, dtype=torch.float32).expand(batch)
        both = Cond.cat([uncond.expand_to(batch), cond.expand_to(batch)])
        v = self.velocity(torch.cat([x, x]), torch.cat([s, s]), both, module)
        v_u, v_c = v.chunk(2)
        return cfg_velocity(v_u, v_c, guidance_scale)

    def _embedded_forward(
        self, module: nn.Module, x: torch.Tensor, s: torch.Tensor, cond: Cond, guidance: float
    ) -> torch.Tensor:
        """The raw model call with `guidance` in the model's guidance embedding (families with `cfg_batch` False)."""
        raise NotImplementedError(f"{type(self).__name__} runs CFG batches; it has no embedded guidance")

    @contextmanager
    def resident(self, module: nn.Module) -> Iterator[None]:
        """With `policy.diffusers.offload`, frozen parts live on CPU and visit the device only while used."""
        if not getattr(self, "offload", False):
            yield
            return
        module.to(self.device)
        try:
            yield
        finally:
            module.to("cpu")

    def trainable_module(self) -> nn.Module:
        """The module whose parameters post-training changes."""
        return self.transformer

    def save_pipeline(self, directory: str | Path) -> None:
        """Write a diffusers pipeline directory (`DiffusionPipeline.from_pretrained(dir)` loads it)."""
        self.pipeline.save_pretrained(str(directory))

    def save_lora(self, directory: str | Path, state_dict: dict[str, torch.Tensor]) -> None:
        """Write a diffusers-loadable LoRA file (`pipe.load_lora_weights(dir)`) with the "default" adapter's peft
        config as metadata, so loading restores its `lora_alpha / r` scale (without it diffusers assumes alpha = r)."""
        config = getattr(self.trainable_module(), "peft_config", {}).get("default")
        metadata = None
        if (
            config is not None
        ):  # peft keeps target_modules as a set: sorted, identical runs give identical files
            metadata = {
                k: sorted(v) if isinstance(v, set | frozenset) else v for k, v in config.to_dict().items()
            }
        self.pipeline_cls.save_lora_weights(
            str(directory), transformer_lora_layers=state_dict, transformer_lora_adapter_metadata=metadata
        )
        for file in sorted(Path(directory).glob("*.safetensors")):
            sort_safetensors_metadata(file)


def sort_safetensors_metadata(path: Path) -> None:
    """Rewrite the header of safetensors file `path` with its `__metadata__` entries in sorted order, the tensor
    bytes untouched. The Rust writer keeps that mapping in a hash map whose order changes from process to process,
    so two identical runs would otherwise write different bytes."""
    import json
    import struct

    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    if not isinstance(header.get("__metadata__"), dict):
        return
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned, as the writer pads it
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + length :])
