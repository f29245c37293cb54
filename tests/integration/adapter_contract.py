"""The contract every family's adapter keeps, run over each family's tiny random-init components.

A family's test module subclasses `AdapterContract` with its `FamilyCase` (as diffusers' pipeline tests run shared
tester mixins over `get_dummy_components`), plus the mixins that fit it: `T5Contract` (a T5 text encoder) and
`ImageDataContract` (image training data). What a family's latents are is declared once on its case: the VAE
normalisation (`LatentNorm`: shifted and scaled KL, scaled DC-AE, per-channel Wan), the VAE config values it reads,
and the clip length of a video family. What only one family has (FLUX's packing and embedded guidance, SD3's dual
attention, SANA's text mask, SANA-Video's frame rule) stays in that module. The oracles are diffusers' own: the
pipeline called with its defaults, its VAE and image (video) processor, `from_pretrained` of the export,
`load_lora_weights` of a LoRA export.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from sanarl import api
from sanarl.config.schema import PolicyConfig
from sanarl.errors import ConfigError
from sanarl.methods.config_loading import load_config
from sanarl.models import load_adapter
from sanarl.models.weight_sources import resolve_weights
from sanarl.training.sampling import GenerationSpec, generate_latents
from sanarl.training.tracking import read_metrics

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "tests" / "data" / "presets"
SQUARES = str(ROOT / "tests" / "data" / "plugins" / "squares.py")
SHAPES = "sanarl.datasets.shapes"
SOAR_DATA = ROOT / "sanarl" / "data" / "datasets" / "examples" / "soar"
PROMPTS = ["a red circle left of a blue square", "two green triangles"]
SEEDS = [11, 12, 13]
STEPS = 4
LENGTH = 8
"""Prompt tokens of the tiny text encoders."""


@dataclass(frozen=True)
class LatentNorm:
    """A family's latent normalisation in its VAE's own terms: the oracle of `encode_images` and `decode`."""

    name: str
    encode: Callable[..., torch.Tensor]
    """(vae, x in [-1, 1]) -> normalised latents of the posterior's mode, computed from the VAE's encode output."""
    denormalise: Callable[..., torch.Tensor]
    """(vae, z) -> the latents the VAE decodes (what the pipeline hands `vae.decode`)."""


def _shifted_scaled(vae, x: torch.Tensor) -> torch.Tensor:
    cfg = vae.config
    return (vae.encode(x).latent_dist.mean - cfg.shift_factor) * cfg.scaling_factor


def _scaled(vae, x: torch.Tensor) -> torch.Tensor:
    return vae.encode(x).latent * vae.config.scaling_factor


def _channel_stats(vae) -> tuple[torch.Tensor, torch.Tensor]:
    view = (1, -1, 1, 1, 1)
    return torch.tensor(vae.config.latents_mean).view(view), torch.tensor(vae.config.latents_std).view(view)


def _per_channel(vae, x: torch.Tensor) -> torch.Tensor:
    mean, std = _channel_stats(vae)
    return (vae.encode(x).latent_dist.mode() - mean) / std


def _per_channel_inverse(vae, z: torch.Tensor) -> torch.Tensor:
    mean, std = _channel_stats(vae)
    return z * std + mean


SHIFTED_SCALED = LatentNorm(
    "(mean - shift_factor) * scaling_factor",
    _shifted_scaled,
    lambda vae, z: z / vae.config.scaling_factor + vae.config.shift_factor,
)
"""KL VAEs of SD3 and FLUX: the posterior mean, shifted and scaled."""
SCALED = LatentNorm("latent * scaling_factor", _scaled, lambda vae, z: z / vae.config.scaling_factor)
"""DC-AE (SANA): the deterministic latent, scaled."""
PER_CHANNEL = LatentNorm("(mode - latents_mean_c) / latents_std_c", _per_channel, _per_channel_inverse)
"""Wan VAE (SANA-Video): the posterior mode, normalised per latent channel."""


@dataclass(frozen=True)
class FamilyCase:
    model: str
    """The tiny model (`sanarl-tiny:<name>`)."""
    pipeline: str
    """The diffusers pipeline class the export loads into."""
    grid: str
    """The grid the pipeline samples on with its defaults (`adapter.grid_name()`)."""
    guidance: float
    """A guidance scale that changes the sample."""
    text_encoders: int
    latents: LatentNorm
    vae_config: dict
    """The VAE config values `latents` reads (checked as they are)."""
    shape_64x96: tuple[int, ...]
    """`latent_shape(64, 96)`."""
    size_error: str
    """The message (regex) for a size the model cannot take (`bad_size`)."""
    pipeline_latents: Callable[..., torch.Tensor]
    """(pipeline, prompts, guidance, generators) -> final latents [B, C, ...] of the pipeline's default call."""
    direct_velocity: Callable[..., torch.Tensor]
    """(pipeline, x, s, cond, guidance) -> the pipeline's transformer called directly (its own helpers), unpacked."""
    size_error_type: type[Exception] = ValueError
    bad_size: tuple[int, int] = (36, 32)
    """A height x width the model cannot take."""
    clip_frames: int | None = None
    """Frames of the clips a video family encodes (`train_frames`); None: images [B, 3, H, W]."""
    diffusers: dict = field(default_factory=dict)
    """`policy.diffusers` settings of the family (loading here and overrides of the training presets)."""
    sft_plugin: str = SQUARES
    """The dataset plugin of the SFT runs (its items carry the family's media)."""
    overrides: tuple[str, ...] = ()
    """Overrides that turn the SD3 test presets into this family's."""
    lora_overrides: tuple[str, ...] = ()
    """Extra overrides for the LoRA presets (the family's default targets)."""
    lora_targets: tuple[str, ...] = field(default_factory=tuple)
    """Substrings of trained LoRA parameter names the family's default targets must produce."""
    lora_untouched: tuple[str, ...] = field(default_factory=tuple)
    """Substrings no trained LoRA parameter name may hold (layers outside the default targets)."""
    tolerance: float = 1e-5
    """Of the sampled latents against the pipeline's."""
    decode_atol: float = 1e-6
    """Of decoded media against the pipeline's decode."""

    def media(self, batch: int, size: int = 32) -> torch.Tensor:
        """Random media in [0, 1]: images [B, 3, S, S] or clips [B, 3, T, S, S]."""
        frames = () if self.clip_frames is None else (self.clip_frames,)
        return torch.rand(batch, 3, *frames, size, size)

    def postprocess(self, pipeline, decoded: torch.Tensor) -> torch.Tensor:
        """The pipeline's own postprocessing of VAE output to [0, 1] (clips back to [B, 3, T, H, W])."""
        if self.clip_frames is None:
            return pipeline.image_processor.postprocess(decoded, output_type="pt")
        return pipeline.video_processor.postprocess_video(decoded, output_type="pt").permute(0, 2, 1, 3, 4)

    def policy(self, **diffusers) -> PolicyConfig:
        policy = PolicyConfig(model_name_or_path=self.model)
        policy.diffusers.max_prompt_length = LENGTH
        for key, value in {**self.diffusers, **diffusers}.items():
            setattr(policy.diffusers, key, value)
        return policy

    def train(self, preset: str, out: Path, plugin: str, *extra: str) -> api.TrainOutcome:
        lora = "lora" in preset or "nft" in preset or "grpo" in preset
        overrides = [
            f"train.output_dir={out}",
            f"policy.model_name_or_path={self.model}",
            *(f"policy.diffusers.{key}={json.dumps(value)}" for key, value in self.diffusers.items()),
            *self.overrides,
            *(self.lora_overrides if lora else ()),
            *extra,
        ]
        return api.train(load_config(PRESETS / preset, overrides), plugin)


def finite_records(out: Path, steps: int) -> list[dict]:
    """The run's metrics: one record per step, finite losses, nonzero gradients."""
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in records)
    return records


def moved(initial: dict, module: torch.nn.Module) -> float:
    """The fraction of `initial`'s tensors that training changed."""
    trained = {k: v.cpu() for k, v in module.state_dict().items()}
    return sum(not torch.equal(initial[k], trained[k]) for k in initial) / len(initial)


def text_encoders(adapter) -> list[torch.nn.Module]:
    """The pipeline's text encoders (`text_encoder`, `text_encoder_2`, ...)."""
    parts = adapter.pipeline.components.items()
    return [m for name, m in parts if name.startswith("text_encoder") and m is not None]


def assert_same_cond(ours, theirs, **tolerance) -> None:
    """Every tensor of two Conds equal (within `tolerance`, else exactly); absent ones absent in both."""
    for name in ("embeds", "mask", "pooled"):
        a, b = getattr(ours, name), getattr(theirs, name)
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a.float(), b.float(), **(tolerance or {"atol": 0, "rtol": 0}))


def sample_sanarl(adapter, guidance: float) -> torch.Tensor:
    spec = GenerationSpec(STEPS, guidance, "euler", 0.0, adapter.shift_for(32, 32), 32, 32)
    cond = adapter.encode_prompts([PROMPTS[0]] * len(SEEDS))
    return generate_latents(adapter, cond, SEEDS, spec).latents


class AdapterContract:
    """Contract tests over `case`'s tiny components (a subclass sets `case`)."""

    case: FamilyCase

    @pytest.fixture(scope="class")
    def adapter(self):
        adapter = load_adapter(self.case.policy())
        adapter.transformer.eval()
        return adapter

    # --- sampling ---------------------------------------------------------------------------------------------
    @pytest.mark.parametrize("guided", [False, True], ids=["w1", "guided"])
    def test_final_latents_match_the_pipeline_called_with_its_defaults(self, adapter, guided):
        guidance = self.case.guidance if guided else 1.0
        generators = [torch.Generator().manual_seed(s) for s in SEEDS]
        theirs = self.case.pipeline_latents(adapter.pipeline, [PROMPTS[0]] * len(SEEDS), guidance, generators)
        ours = sample_sanarl(adapter, guidance)
        assert adapter.grid_name() == self.case.grid
        assert ours.shape == theirs.shape == (len(SEEDS), *adapter.latent_shape(32, 32))
        assert (ours - theirs).abs().max().item() < self.case.tolerance
        assert (ours[1] - ours[0]).abs().max().item() > 1e-2  # different seeds, different samples

    def test_guidance_changes_the_sample(self, adapter):
        change = (sample_sanarl(adapter, self.case.guidance) - sample_sanarl(adapter, 1.0)).abs().max()
        assert change.item() > 100 * self.case.tolerance

    # --- latents ----------------------------------------------------------------------------------------------
    def test_latents_are_the_familys_normalisation_of_the_vae_output(self, adapter):
        vae, norm = adapter.vae, self.case.latents
        assert {key: vae.config[key] for key in self.case.vae_config} == self.case.vae_config
        media = self.case.media(2)
        z = adapter.encode_images(media)
        torch.testing.assert_close(z, norm.encode(vae, 2 * media - 1))
        assert torch.equal(adapter.encode_images(media), z)  # without noise: the mode, deterministic
        # decode undoes the normalisation and maps [-1, 1] -> [0, 1], as the pipeline's decode + postprocess
        pipe_media = self.case.postprocess(adapter.pipeline, vae.decode(norm.denormalise(vae, z)).sample)
        assert pipe_media.shape == media.shape
        torch.testing.assert_close(adapter.decode(z), pipe_media, atol=self.case.decode_atol, rtol=0)

    def test_latent_shape_and_sizes_the_model_cannot_take(self, adapter):
        assert adapter.latent_shape(64, 96) == self.case.shape_64x96
        with pytest.raises(self.case.size_error_type, match=self.case.size_error):
            adapter.latent_shape(*self.case.bad_size)

    # --- loading ----------------------------------------------------------------------------------------------
    def test_bfloat16_frozen_parts_with_float32_master_weights(self, adapter):
        half = load_adapter(self.case.policy(dtype="bfloat16"))
        assert [m.dtype for m in text_encoders(half)] == [torch.bfloat16] * self.case.text_encoders
        assert half.vae.dtype == torch.bfloat16
        full = adapter.transformer.state_dict()
        for k, v in half.transformer.state_dict().items():  # read straight into float32: bit-identical
            assert v.dtype == torch.float32 and torch.equal(v, full[k]), k
        assert_same_cond(half.encode_prompts(PROMPTS), adapter.encode_prompts(PROMPTS), atol=0.05, rtol=0.05)

    def test_offload_keeps_the_frozen_parts_on_cpu_with_the_same_numbers(self, adapter):
        off = load_adapter(self.case.policy(offload=True))
        assert off.offload and len(text_encoders(off)) == self.case.text_encoders
        assert_same_cond(off.encode_prompts(PROMPTS), adapter.encode_prompts(PROMPTS))
        media = self.case.media(1)
        assert torch.equal(off.encode_images(media), adapter.encode_images(media))
        assert all(next(m.parameters()).device.type == "cpu" for m in [off.vae, *text_encoders(off)])

    # --- training and export ----------------------------------------------------------------------------------
    def test_sft_step_trains_the_transformer_and_exports_a_pipeline(self, tmp_path, adapter):
        import diffusers

        initial = adapter.transformer.state_dict()  # the same tiny weights, never trained
        outcome = self.case.train(
            "sd3-sft.toml", tmp_path, self.case.sft_plugin,
            "validation.enable=true", "validation.num_samples=2", "validation.batch_size=2",
            "policy.diffusers.sample.eval_num_steps=2",
            f"policy.diffusers.sample.guidance_scale={self.case.guidance}",
        )  # fmt: skip
        finite_records(tmp_path, 1)
        suffix = ".png" if self.case.clip_frames is None else ".mp4"  # a decoded grid, or the clips
        assert [p.name for p in (tmp_path / "samples").glob(f"*{suffix}")] == [f"step_00000001{suffix}"]
        trained = outcome.task.adapter.transformer
        assert moved(initial, trained) >= 0.9
        reloaded = getattr(diffusers, self.case.pipeline).from_pretrained(str(tmp_path / "export"))
        for k, v in reloaded.transformer.state_dict().items():
            assert torch.equal(v, trained.state_dict()[k].cpu()), k

    def test_lora_sft_export_loads_with_load_lora_weights(self, tmp_path, adapter):
        import diffusers

        outcome = self.case.train("sd3-sft-lora.toml", tmp_path, self.case.sft_plugin)
        finite_records(tmp_path, 1)
        trained = outcome.task.adapter
        names = [k for k, _ in outcome.task.trainable_parameters()]
        assert all(any(target in k for k in names) for target in self.case.lora_targets), names
        assert not any(other in k for k in names for other in self.case.lora_untouched), names
        pipe = getattr(diffusers, self.case.pipeline).from_pretrained(str(resolve_weights(self.case.model)))
        pipe.load_lora_weights(str(tmp_path / "export"))
        # the run used its accelerator's device (cuda when present); the comparison runs on CPU
        cond = trained.encode_prompts(PROMPTS).to("cpu")
        x, s = torch.randn(2, *adapter.latent_shape(32, 32)), torch.tensor([0.4, 0.8])
        guidance = getattr(trained, "guidance", 1.0)  # a guidance-distilled family embeds its scale
        theirs = self.case.direct_velocity(pipe, x, s, cond, guidance)
        with torch.no_grad():
            ours = trained.velocity(x.to(trained.device), s.to(trained.device), cond.to(trained.device)).cpu()
            base = adapter.velocity(x, s, cond)
        assert (ours - base).abs().max() > 1e-4  # the step moved the LoRA weights off zero
        torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)


class T5Contract:
    """Families with a T5 text encoder (SD3, FLUX)."""

    case: FamilyCase

    def test_t5_length_beyond_512_is_a_config_error(self):
        with pytest.raises(ConfigError, match="max_prompt_length = 600"):
            load_adapter(self.case.policy(max_prompt_length=600))


class ImageDataContract:
    """Families trained on images (SOAR's data is images); mixed into an `AdapterContract`, whose `adapter` it uses."""

    case: FamilyCase

    def test_soar_steps_read_the_shipped_example_data(self, tmp_path, adapter):
        initial = adapter.transformer.state_dict()
        outcome = self.case.train(
            "sd3-soar.toml",
            tmp_path,
            "sanarl.datasets.soar_jsonl",
            f"train.train_policy.dataset.local_dir={SOAR_DATA}",
        )
        dataset = outcome.task.train_dataset
        assert sorted(dataset.buckets) == [(64, 64), (64, 96)] and len(dataset) == 6
        assert (
            outcome.task.steps_per_epoch() == 2
        )  # one batch of 2 per bucket; the third row of each sits out
        for r in finite_records(tmp_path, 2):
            assert r["loss_main"] > 0 and r["loss_aux"] >= 0
            active = 2 * (1 - r["boundary_fraction"])  # of the batch of 2
            # points x (paths x active samples + the ODE path of the boundary samples, as HY-SOAR)
            assert r["num_aux_points"] == pytest.approx(2 * (2 * active + (2 - active)))
        assert moved(initial, outcome.task.adapter.transformer) >= 0.9
