"""The contract every image family's adapter keeps, run over each family's tiny random-init components.

A family's test module subclasses `AdapterContract` with its `FamilyCase` (as diffusers' pipeline tests run shared
tester mixins over `get_dummy_components`); what only one family has (FLUX's packing and embedded guidance, SD3's
dual attention, SANA's text mask) stays in that module. The oracles are diffusers' own: the pipeline called with
its defaults, its VAE and image processor, `from_pretrained` of the export, `load_lora_weights` of a LoRA export.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from sanarl import api
from sanarl.config.schema import PolicyConfig
from sanarl.errors import ConfigError
from sanarl.methods.loading import load_config
from sanarl.models import load_adapter
from sanarl.models.loading import resolve_weights
from sanarl.training.sampling import GenerationSpec, generate_latents
from sanarl.training.tracking import read_metrics

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "tests" / "data" / "presets"
SQUARES = str(ROOT / "tests" / "data" / "plugins" / "squares.py")
SOAR_DATA = ROOT / "sanarl" / "data" / "datasets" / "examples" / "soar"
PROMPTS = ["a red circle left of a blue square", "two green triangles"]
SEEDS = [11, 12, 13]
STEPS = 4
LENGTH = 8
"""Prompt tokens of the tiny text encoders."""


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
    vae_shift: float
    vae_scale: float
    shape_64x96: tuple[int, ...]
    """`latent_shape(64, 96)`."""
    size_error: str
    """The message (regex) for a size the model cannot take (36 x 32)."""
    pipeline_latents: Callable[..., torch.Tensor]
    """(pipeline, prompts, guidance, generators) -> final latents [B, C, h, w] of the pipeline's default call."""
    direct_velocity: Callable[..., torch.Tensor]
    """(pipeline, x, s, cond, guidance) -> the pipeline's transformer called directly (its own helpers), unpacked."""
    overrides: tuple[str, ...] = ()
    """Overrides that turn the SD3 test presets into this family's."""
    lora_overrides: tuple[str, ...] = ()
    """Extra overrides for the LoRA presets (the family's default targets)."""
    lora_targets: tuple[str, ...] = field(default_factory=tuple)
    """Substrings of trained LoRA parameter names the family's default targets must produce."""
    lora_untouched: tuple[str, ...] = field(default_factory=tuple)
    """Substrings no trained LoRA parameter name may hold (layers outside the default targets)."""
    tolerance: float = 1e-5

    def policy(self, **diffusers) -> PolicyConfig:
        policy = PolicyConfig(model_name_or_path=self.model)
        policy.diffusers.max_prompt_length = LENGTH
        for key, value in diffusers.items():
            setattr(policy.diffusers, key, value)
        return policy

    def train(self, preset: str, out: Path, plugin: str, *extra: str) -> api.TrainOutcome:
        lora = "lora" in preset or "nft" in preset or "grpo" in preset
        overrides = [
            f"train.output_dir={out}",
            f"policy.model_name_or_path={self.model}",
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
    def test_latents_are_the_vae_mode_shifted_and_scaled(self, adapter):
        vae, shift, scale = adapter.vae, self.case.vae_shift, self.case.vae_scale
        assert (vae.config.shift_factor, vae.config.scaling_factor) == (shift, scale)
        images = torch.rand(2, 3, 32, 32)
        dist = vae.encode(2 * images - 1).latent_dist
        z = adapter.encode_images(images)
        torch.testing.assert_close(z, (dist.mean - shift) * scale)
        assert torch.equal(adapter.encode_images(images), z)  # without noise: the mode, deterministic
        # decode undoes the normalisation and maps [-1, 1] -> [0, 1], as the pipeline's decode + postprocess
        pipe_images = adapter.pipeline.image_processor.postprocess(
            vae.decode(z / scale + shift).sample, output_type="pt"
        )
        torch.testing.assert_close(adapter.decode(z), pipe_images, atol=1e-6, rtol=0)

    def test_latent_shape_and_sizes_the_model_cannot_take(self, adapter):
        assert adapter.latent_shape(64, 96) == self.case.shape_64x96
        with pytest.raises(ValueError, match=self.case.size_error):
            adapter.latent_shape(36, 32)

    # --- loading ----------------------------------------------------------------------------------------------
    def test_t5_length_beyond_512_is_a_config_error(self):
        with pytest.raises(ConfigError, match="max_prompt_length = 600"):
            load_adapter(self.case.policy(max_prompt_length=600))

    def test_bfloat16_frozen_parts_with_float32_master_weights(self, adapter):
        half = load_adapter(self.case.policy(dtype="bfloat16"))
        assert [m.dtype for m in half.text_encoders] == [torch.bfloat16] * self.case.text_encoders
        assert half.vae.dtype == torch.bfloat16
        full = adapter.transformer.state_dict()
        for (
            k,
            v,
        ) in half.transformer.state_dict().items():  # read straight into float32: bit-identical weights
            assert v.dtype == torch.float32 and torch.equal(v, full[k]), k
        cond = half.encode_prompts(PROMPTS)
        torch.testing.assert_close(
            cond.pooled.float(), adapter.encode_prompts(PROMPTS).pooled, atol=0.05, rtol=0.05
        )

    # --- training and export ----------------------------------------------------------------------------------
    def test_sft_step_trains_the_transformer_and_exports_a_pipeline(self, tmp_path, adapter):
        import diffusers

        initial = adapter.transformer.state_dict()  # the same tiny weights, never trained
        outcome = self.case.train(
            "sd3-sft.toml", tmp_path, SQUARES,
            "validation.enable=true", "validation.num_samples=2", "validation.batch_size=2",
            "policy.diffusers.sample.eval_num_steps=2",
            f"policy.diffusers.sample.guidance_scale={self.case.guidance}",
        )  # fmt: skip
        finite_records(tmp_path, 1)
        assert [p.name for p in (tmp_path / "samples").glob("*.png")] == ["step_00000001.png"]  # decoded grid
        trained = outcome.task.adapter.transformer
        assert moved(initial, trained) >= 0.9
        reloaded = getattr(diffusers, self.case.pipeline).from_pretrained(str(tmp_path / "export"))
        for k, v in reloaded.transformer.state_dict().items():
            assert torch.equal(v, trained.state_dict()[k].cpu()), k

    def test_lora_sft_export_loads_with_load_lora_weights(self, tmp_path, adapter):
        import diffusers

        outcome = self.case.train("sd3-sft-lora.toml", tmp_path, SQUARES)
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
