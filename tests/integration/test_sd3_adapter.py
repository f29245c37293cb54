"""The SD3.5 adapter on the tiny random-init SD3.5-Medium (`sanarl-tiny:sd3`) and SD3.5-Large (`sanarl-tiny:sd35l`)
shapes: oracles are diffusers' own
`StableDiffusion3Pipeline` (encode_prompt, __call__, VAE) and hand computations; then every task runs one step on it
through `sanarl.api.train` with no family-specific code, and its exports load back into diffusers.

Sampler oracle as in test_sampler_matches_diffusers.py: the pipeline called with its own defaults (no `sigmas`: its
scheduler's `set_timesteps(N)` grid, which shifts the already shifted table ends a second time), fed the same prompt
text, the same per-sample seeds, CFG against "" (pipeline: guidance_scale > 1), `output_type="latent"`; and once with
explicit `sigmas = linspace(1, 1/N, N)` against sanarl's `sample.sigma_grid = "linspace"`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import adapter_contract as contract
import numpy as np
import pytest
import torch
from adapter_contract import LENGTH, PRESETS, PROMPTS, SEEDS, SHAPES, STEPS, finite_records

from sanarl import api
from sanarl.config.schema import PolicyConfig
from sanarl.methods.config_loading import load_config
from sanarl.models import load_adapter
from sanarl.training.sampling import GenerationSpec, generate_latents

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread", "no_metrics_plot")]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "data"))
from rollout_families import FAMILIES, check_family_run, record_compiles  # noqa: E402


@pytest.fixture(scope="module", params=["sd3", "sd35l"], ids=["medium", "large"])
def tiny(request) -> str:
    """The tiny model name: Medium-shaped (dual attention in block 0) or Large-shaped (no dual attention)."""
    return request.param


@pytest.fixture(scope="module")
def sd3(tiny):
    policy = PolicyConfig(model_name_or_path=f"sanarl-tiny:{tiny}")
    policy.diffusers.max_prompt_length = LENGTH
    adapter = load_adapter(policy)
    adapter.transformer.eval()
    return adapter


def _pipeline_latents(pipe, prompts: list[str], guidance: float, generators) -> torch.Tensor:
    """`StableDiffusion3Pipeline.__call__` with its defaults."""
    return pipe(
        prompt=prompts, num_inference_steps=STEPS, guidance_scale=guidance, height=32, width=32,
        max_sequence_length=LENGTH, generator=generators, output_type="latent",
    ).images  # fmt: skip


def _direct_velocity(pipe, x, s, cond, guidance: float) -> torch.Tensor:
    """The MMDiT called directly at timestep 1000 s with the pooled projections."""
    return pipe.transformer(
        hidden_states=x,
        encoder_hidden_states=cond.embeds,
        pooled_projections=cond.pooled,
        timestep=1000 * s,
        return_dict=False,
    )[0]


def _case(tiny: str) -> contract.FamilyCase:
    return contract.FamilyCase(
        model=f"sanarl-tiny:{tiny}", pipeline="StableDiffusion3Pipeline", grid="flow_match_euler", guidance=4.5,
        text_encoders=3, latents=contract.SHIFTED_SCALED,
        vae_config={"shift_factor": 0.0609, "scaling_factor": 1.5305}, shape_64x96=(4, 16, 24),
        size_error="not divisible by 8 \\(VAE factor 4 x patch size 2\\)",
        pipeline_latents=_pipeline_latents, direct_velocity=_direct_velocity,
        lora_targets=(".attn.add_q_proj.lora_A",),
    )  # fmt: skip


class TestMediumContract(contract.AdapterContract, contract.T5Contract, contract.ImageDataContract):
    case = _case("sd3")


class TestLargeContract(contract.AdapterContract, contract.T5Contract, contract.ImageDataContract):
    case = _case("sd35l")


def test_dual_attention_only_in_the_medium_shape(sd3, tiny):
    """SD3.5-Medium's block 0 has a second, image-only attention; SD3.5-Large has none. The LoRA targets (joint
    attention of both streams) and the sampler are the same for both."""
    attn2 = [n for n, _ in sd3.transformer.named_modules() if n.endswith(".attn2")]
    assert tuple(sd3.transformer.config.dual_attention_layers) == ((0,) if tiny == "sd3" else ())
    assert attn2 == (["transformer_blocks.0.attn2"] if tiny == "sd3" else [])


# --- prompts ------------------------------------------------------------------------------------------------------
def test_encode_prompts_is_the_pipelines_encode_prompt(sd3):
    cond = sd3.encode_prompts(PROMPTS)
    embeds, _, pooled, _ = sd3.pipeline.encode_prompt(
        PROMPTS, None, None, do_classifier_free_guidance=False, max_sequence_length=LENGTH
    )
    assert cond.mask is None
    assert cond.embeds.shape == (2, 16 + LENGTH, 32) and cond.pooled.shape == (2, 32)
    assert torch.equal(cond.embeds, embeds) and torch.equal(cond.pooled, pooled)


def test_prompt_embeddings_by_hand(sd3):
    """CLIP-L / CLIP-G penultimate states side by side, then T5 of max_prompt_length tokens; pooled = both CLIPs'
    projected features at their end-of-text token."""
    pipe = sd3.pipeline
    prompt = [PROMPTS[1]]  # three words
    cond = sd3.encode_prompts(prompt)
    clip = []
    pooled = []
    for tok, enc in ((pipe.tokenizer, pipe.text_encoder), (pipe.tokenizer_2, pipe.text_encoder_2)):
        ids = tok(prompt, padding="max_length", max_length=16, return_tensors="pt").input_ids
        assert ids[0, [0, 4, 5]].tolist() == [tok.bos_token_id, tok.eos_token_id, tok.pad_token_id]
        out = enc(ids, output_hidden_states=True)
        clip.append(out.hidden_states[-2])
        pooled.append(out.text_embeds)
    ids3 = pipe.tokenizer_3(prompt, padding="max_length", max_length=LENGTH, truncation=True).input_ids
    assert (
        ids3[0][3:] == [pipe.tokenizer_3.eos_token_id] + [pipe.tokenizer_3.pad_token_id] * 4
    )  # padded to LENGTH
    t5 = pipe.text_encoder_3(torch.tensor(ids3))[0]
    torch.testing.assert_close(cond.embeds[:, :16], torch.cat(clip, dim=-1))  # 16 + 16 = T5's 32 wide
    torch.testing.assert_close(cond.embeds[:, 16:], t5)
    torch.testing.assert_close(cond.pooled, torch.cat(pooled, dim=-1))


# --- the model call and sampling ----------------------------------------------------------------------------------
def test_velocity_is_the_mmdit_at_timestep_1000_s_with_pooled_projections(sd3):
    cond = sd3.encode_prompts(PROMPTS)
    x = torch.randn(2, *sd3.latent_shape(32, 32))
    s = torch.tensor([0.3, 0.9])
    direct = sd3.transformer(
        hidden_states=x,
        encoder_hidden_states=cond.embeds,
        pooled_projections=cond.pooled,
        timestep=torch.tensor([300.0, 900.0]),
        return_dict=False,
    )[0]
    assert torch.equal(sd3.velocity(x, s, cond), direct)
    other = sd3.velocity(x, s, type(cond)(cond.embeds, None, torch.zeros_like(cond.pooled)))
    assert (other - direct).abs().max() > 1e-3  # the pooled embedding is really used


def _sanarl(adapter, guidance: float, grid: str | None = None) -> torch.Tensor:
    spec = GenerationSpec(STEPS, guidance, "euler", 0.0, adapter.default_shift, 32, 32, grid)
    cond = adapter.encode_prompts([PROMPTS[0]] * len(SEEDS))
    return generate_latents(adapter, cond, SEEDS, spec).latents


def _diffusers(adapter, guidance: float, **explicit) -> torch.Tensor:
    """`StableDiffusion3Pipeline.__call__` with its defaults (plus `explicit` arguments)."""
    return adapter.pipeline(
        prompt=[PROMPTS[0]] * len(SEEDS),
        num_inference_steps=STEPS,
        guidance_scale=guidance,
        height=32,
        width=32,
        max_sequence_length=LENGTH,
        generator=[torch.Generator().manual_seed(s) for s in SEEDS],
        output_type="latent",
        **explicit,
    ).images


def test_explicit_linspace_sigmas_match_the_linspace_grid(sd3):
    linspace = list(np.linspace(1.0, 1.0 / STEPS, STEPS))
    ours, theirs = _sanarl(sd3, 1.0, "linspace"), _diffusers(sd3, 1.0, sigmas=linspace)
    assert (ours - theirs).abs().max().item() < 1e-5
    assert (ours - _sanarl(sd3, 1.0)).abs().max().item() > 1e-3  # the two grids really differ


def test_integer_timesteps_while_sampling_and_the_float_in_training(sd3):
    """`sample.integer_timesteps`: the MMDiT sees DiffusionNFT's `torch.full(.., sigma * 1000, dtype=long)` at every
    sampling step (Euler on the float grid, re-derived below), and the float 1000 s in a training forward."""
    from sanarl.core.samplers import initial_noise

    seen: list[torch.Tensor] = []
    hook = sd3.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["timestep"].clone()), with_kwargs=True
    )
    cond = sd3.encode_prompts([PROMPTS[0]] * len(SEEDS))
    spec = GenerationSpec(STEPS, 1.0, "euler", 0.0, 3.0, 32, 32, integer_timesteps=True)
    try:
        ours = generate_latents(sd3, cond, SEEDS, spec).latents
        sampled, seen[:] = list(seen), []
        s = torch.tensor([0.6789] * len(SEEDS))
        sd3.velocity(torch.randn(3, 4, 8, 8), s, cond)
        trained = seen[0]
    finally:
        hook.remove()
    sigmas = _pipeline_grid(sd3, STEPS).float()
    x, _ = initial_noise((4, 8, 8), SEEDS)
    for i, sigma in enumerate(sigmas[:-1]):
        t = torch.full([len(SEEDS)], sigma * 1000, dtype=torch.long)
        assert torch.equal(sampled[i], t.float())
        v = sd3.transformer(
            hidden_states=x,
            timestep=t,
            encoder_hidden_states=cond.embeds,
            pooled_projections=cond.pooled,
            return_dict=False,
        )[0]
        x = x + v * (sigmas[i + 1] - sigma)
    torch.testing.assert_close(ours, x, atol=1e-6, rtol=0)
    assert torch.equal(trained, 1000.0 * s) and trained[0].item() != int(trained[0].item())
    assert not sd3.integer_timesteps  # restored after sampling
    assert (ours - _sanarl(sd3, 1.0)).abs().max().item() > 1e-6  # the float timesteps really differ


# --- every task on SD3 --------------------------------------------------------------------------------------------
def _train(preset: str, out: Path, plugin: str, tiny: str, *extra: str) -> api.TrainOutcome:
    overrides = [f"train.output_dir={out}", f"policy.model_name_or_path=sanarl-tiny:{tiny}", *extra]
    loaded = load_config(PRESETS / preset, overrides)
    return api.train(loaded, plugin)


def test_nft_iteration_trains_the_default_adapter(tmp_path, tiny):
    from sanarl.core.lora import adapter_parameters

    outcome = _train("sd3-nft.toml", tmp_path, SHAPES, tiny)
    finite_records(tmp_path, 1)
    lora_b = {
        k: v
        for k, v in adapter_parameters(outcome.task.adapter.transformer, "default").items()
        if "lora_B" in k
    }
    still = sorted(k for k, v in lora_b.items() if v.abs().max() == 0)
    # every adapter moved but one: the last MMDiT block drops its text stream (context_pre_only), so its text
    # queries reach no output and get exactly zero gradient
    assert len(lora_b) == 15 and still == ["transformer_blocks.1.attn.add_q_proj.lora_B.default.weight"]
    # rollout, preview and trained levels all on the pipeline's grid: set_timesteps(N) of the model's scheduler
    task = outcome.task
    grid = _pipeline_grid(task.adapter, task.rollouts.spec.num_steps)
    for spec in (task.rollouts.spec, task.rollouts.preview_spec):
        assert spec.grid == "flow_match_euler"
    assert torch.equal(task.rollouts.spec.sigmas(task.adapter).cpu(), grid)
    n = sum(len(g.seeds) for g in task.last_groups)
    batches = task._training_batches(
        task.last_groups, torch.zeros(n), torch.ones(n, dtype=torch.bool), _rng()
    )
    trained = {float(t) for b in batches for t in b["t"]}
    assert trained <= {float(v) for v in grid[:-1]} and len(trained) > 1


def _pipeline_grid(adapter, steps: int) -> torch.Tensor:
    """The sigmas the model's own scheduler sets for `steps` (the pipeline's default call)."""
    sched = type(adapter.pipeline.scheduler).from_config(adapter.pipeline.scheduler.config)
    sched.set_timesteps(steps)
    return sched.sigmas


def _rng() -> torch.Generator:
    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "diffusionnft"])
def test_nft_rollout_families_on_the_large_shape(tmp_path, monkeypatch, family):
    """Every search family trains on the SD3.5-Large shape (the plain family is the test above, on both shapes)."""
    compiled = record_compiles(monkeypatch)
    outcome = _train("sd3-nft.toml", tmp_path, SHAPES, "sd35l", *FAMILIES[family])
    check_family_run(outcome, finite_records(tmp_path, 1), compiled)


def test_flow_grpo_iteration_with_cfg(tmp_path, tiny):
    outcome = _train("sd3-grpo.toml", tmp_path, SHAPES, tiny)
    task = outcome.task  # rollout steps and re-evaluated log-probs on the pipeline's grid
    assert torch.equal(task.sigmas.cpu(), _pipeline_grid(task.adapter, task.spec.num_steps))
    from sanarl.core.lora import adapter_parameters

    finite_records(tmp_path, 1)
    default = adapter_parameters(outcome.task.adapter.transformer, "default")
    assert any(v.abs().max() > 0 for k, v in default.items() if "lora_B" in k)


def _soar_step_mmdit_inputs(sd3, monkeypatch, u: torch.Tensor, steps: int) -> tuple[dict, list[dict]]:
    """One SOAR micro-batch of 4 on the tiny MMDiT (2 paths x 3 points, CFG 4.5) with the drawn u replaced by `u`;
    returns the batch and the keyword inputs (hidden_states, timestep) of every transformer call of its objective."""
    from types import SimpleNamespace

    import sanarl.methods.sft.task as sft_task
    from sanarl.config.schema import Config
    from sanarl.methods.soar.task import SOARTask

    monkeypatch.setattr(sft_task, "sample_u", lambda *args, **kwargs: u.clone())
    cfg = Config()
    cfg.train.train_batch_per_replica = cfg.train.train_policy.mini_batch = 4
    cfg.train.train_policy.trainer_type = "soar"
    soar = cfg.train.train_policy.soar
    soar.num_rollout_paths, soar.trajectory_length, soar.num_sampling_steps = 2, 3, steps
    soar.cfg_scale_sampling = 4.5
    gen = torch.Generator().manual_seed(0)
    items = [{"prompt": p, "image": torch.rand(3, 32, 32, generator=gen)} for p in PROMPTS * 2]
    task = SOARTask(cfg, sd3, SimpleNamespace(__name__="soar_items", get_dataset=lambda cfg: items))
    batch = task.micro_batches(0, torch.Generator().manual_seed(1))[0]
    calls = []

    def record(module, args, kwargs):
        calls.append({k: kwargs[k].detach().clone() for k in ("hidden_states", "timestep")})

    handle = sd3.transformer.register_forward_pre_hook(record, with_kwargs=True)
    try:
        task.objective(batch, torch.Generator())
    finally:
        handle.remove()
    return batch, calls


def _cfg_velocity(sd3, prompts: list[str], x: torch.Tensor, timestep: torch.Tensor, w: float) -> torch.Tensor:
    """v_u + w (v_c - v_u) straight from the MMDiT at the given timesteps, "" as the unconditional prompt."""
    cond, uncond = sd3.encode_prompts(prompts), sd3.encode_prompts([""] * len(prompts))
    with torch.no_grad():
        v_c, v_u = (
            sd3.transformer(
                hidden_states=x,
                timestep=timestep,
                encoder_hidden_states=c.embeds,
                pooled_projections=c.pooled,
                return_dict=False,
            )[0]
            for c in (cond, uncond)
        )
    return v_u + w * (v_c - v_u)


def test_soar_step_feeds_the_mmdit_hy_soars_scheduler_timesteps(sd3, monkeypatch):
    """HY-SOAR on SD3.5 (docs/algorithms.md, "SOAR"), re-derived on a fresh FlowMatchEulerDiscreteScheduler of the
    model's own config (1000 train timesteps, no set_timesteps): k = trunc((1 - u) 1000) clamped to [0, 999]; the
    main row and both CFG branches of the rollout get `timesteps[k]` (already 1000 sigmas[k]: no second x1000, not
    an index, not the unshifted sigma, not 1000 shift(u)) and z_s0 = (1 - sigmas[k]) z0 + sigmas[k] z1; each aux
    row gets `timesteps[k']`, k' = trunc((1 - t') 1000), t' = 1 - i / 1000 in float32, i = the first table entry
    <= s', while its ODE point is re-noised at s' itself: z' = (1 - a)(z_s0 + v_cfg (s1 - s0)) + a z1,
    a = (s' - s1) / (1 - s1), s1 = sigmas[trunc((1 - max(u - 1/N, 0)) 1000)]."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    # u > 0.999 reads sigma 1 (timestep 1000); the last sample sits at the t1 = 0 boundary (ODE path only)
    u, steps, count, points = torch.tensor([0.99962, 0.6180339, 0.41234567, 0.1234567]), 4, 4, 3
    batch, calls = _soar_step_mmdit_inputs(sd3, monkeypatch, u, steps)
    assert len(calls) == 2  # one CFG forward (uncond + cond rows), one forward over the main and aux rows
    rollout, trained = calls
    sched = FlowMatchEulerDiscreteScheduler.from_config(sd3.pipeline.scheduler.config)
    size = len(sched.timesteps)
    assert size == 1000 and sched.config.shift == 3.0

    def index(t: torch.Tensor) -> torch.Tensor:
        return ((1.0 - t) * size).long().clamp(0, size - 1)

    k0, k1 = index(u), index((u - 1.0 / steps).clamp(min=0.0))
    sigma0, sigma1, ts0 = sched.sigmas[k0], sched.sigmas[k1], sched.timesteps[k0]
    assert ts0[0] == 1000.0 and (ts0 - 1000.0 * 3.0 * u / (1.0 + 2.0 * u)).abs().min() > 0.1
    z0 = sd3.encode_images(batch["image"], noise=batch["vae_noise"])
    z1 = batch["noise"]
    z_s0 = (1.0 - sigma0.view(-1, 1, 1, 1)) * z0 + sigma0.view(-1, 1, 1, 1) * z1
    assert rollout["timestep"].dtype == torch.float32
    assert torch.equal(rollout["timestep"], torch.cat([ts0, ts0]))
    assert torch.equal(trained["timestep"][:count], ts0)
    torch.testing.assert_close(rollout["hidden_states"], torch.cat([z_s0, z_s0]), rtol=0, atol=1e-6)
    torch.testing.assert_close(trained["hidden_states"][:count], z_s0, rtol=0, atol=1e-6)
    # aux rows, ordered (path, point, sample): path 0 from every sample, path 1 from those off the boundary
    rows = {0: [0, 1, 2, 3], 1: [0, 1, 2]}
    order = [(m, p, b) for m in (0, 1) for p in range(points) for b in rows[m]]
    s_prime = torch.stack([batch["s_prime"][b, m, p] for m, p, b in order])
    first_below = (sched.sigmas[None, :] > s_prime[:, None]).sum(1).clamp(max=size - 1)
    t_prime = 1.0 - first_below.float() / size
    assert torch.equal(trained["timestep"][count:], sched.timesteps[index(t_prime)])
    assert not torch.equal(trained["timestep"][count:], 1000.0 * s_prime)  # the table level, not s' itself
    # the ODE path's points: one Euler step with the rollout's CFG velocity, then re-noised toward z1 at s'
    z1p = z_s0 + _cfg_velocity(sd3, batch["prompt"], z_s0, ts0, 4.5) * (sigma1 - sigma0).view(-1, 1, 1, 1)
    ode = [(p, b) for m, p, b in order if m == 0]
    a = torch.stack([(batch["s_prime"][b, 0, p] - sigma1[b]) / (1.0 - sigma1[b]) for p, b in ode])
    expected = torch.stack([(1.0 - a[j]) * z1p[b] + a[j] * z1[b] for j, (_, b) in enumerate(ode)])
    torch.testing.assert_close(
        trained["hidden_states"][count : count + len(ode)], expected, rtol=0, atol=1e-5
    )


def test_training_latents_sample_the_posterior_with_the_given_noise(sd3, tiny):
    """As the references: z = (mean + std eps - shift) * scale, eps from the caller's seeded generator;
    `vae_latents = "mode"` (or no noise) gives the mean."""
    from sanarl.methods.sft.task import draw_vae_noise, encode_media

    images = torch.rand(2, 3, 32, 32)
    dist = sd3.vae.encode(2 * images - 1).latent_dist
    assert sd3.latent_sampling  # the default, vae_latents = "sample"
    drawn = draw_vae_noise(sd3, 2, sd3.latent_shape(32, 32), torch.Generator().manual_seed(0))
    eps = drawn["vae_noise"]
    z = encode_media(sd3, images, drawn)
    torch.testing.assert_close(z, (dist.mean + dist.std * eps - 0.0609) * 1.5305)
    assert torch.equal(encode_media(sd3, images, drawn), z)  # a pure function of the noise
    assert not torch.allclose(z, sd3.encode_images(images))
    policy = PolicyConfig(model_name_or_path=f"sanarl-tiny:{tiny}")
    policy.diffusers.max_prompt_length = LENGTH
    policy.diffusers.vae_latents = "mode"
    mode = load_adapter(policy)
    assert draw_vae_noise(mode, 2, mode.latent_shape(32, 32), torch.Generator()) == {}
    torch.testing.assert_close(mode.encode_images(images, noise=eps), (dist.mean - 0.0609) * 1.5305)
