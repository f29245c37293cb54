"""sanarl's sampling loop vs diffusers' `SanaPipeline.__call__` / `FluxPipeline.__call__` on the same tiny model:
equality and speed.

Both sides integrate the flow ODE with Euler from s = 1 to 0 on the same grid, with the same per-sample seeds,
the same prompt embeddings (computed once by the adapter) and CFG ``v = v_u + w (v_c - v_u)`` with the
uncond = the encoding of "". The pipeline runs with its default grid (its FlowMatchEulerDiscreteScheduler's
`set_timesteps(N)`), which is the adapter's default grid (`sanarl.core.flow.flow_match_euler_grid`).

FLUX (`sanarl-tiny:flux`, guidance-distilled) has no CFG batch: both sides feed the guidance to the transformer's
guidance embedding, the pipeline shifts the grid by its own `calculate_shift` mu (sanarl: `adapter.shift_for`), and
its packed latent tokens are unpacked for the comparison.

Prints, per tiny model: the max abs difference of the final latents (must be < 1e-4) and the wall-clock ratio
sanarl / diffusers (median of interleaved repeats after a warm-up; target <= 1.0).

    python benchmarks/bench_sampler.py [--steps 20] [--batch 8] [--guidance 4.5] [--repeats 15] [--threads 1]
        [--models sanarl-tiny:shapes ...] [--overhead] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from collections.abc import Callable
from dataclasses import dataclass

import _common
import torch

PROMPTS = (
    "a red circle left of a blue square",
    "two green triangles",
    "a yellow square above a purple circle",
    "three small cyan circles",
    "a large orange triangle",
    "a pink square next to a white circle",
    "one black circle",
    "a blue triangle below a red square",
)
SIZE = 32
TOLERANCE = 1e-4


@dataclass
class Case:
    """One comparison: the adapter, its conditioning and the two zero-argument samplers to race."""

    name: str
    sanarl: Callable[[], torch.Tensor]
    diffusers: Callable[[], torch.Tensor]


def stub_transformer(adapter) -> None:
    """Replace the transformer's forward by a trivial `v = 0.5 x` (config and parameters kept), so that timing the
    two loops measures only their own per-step overhead (scheduler, CFG batching, casts, Python)."""

    def forward(hidden_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor]:
        return (0.5 * hidden_states,)

    adapter.transformer.forward = forward


def make_case(model: str, batch: int, steps: int, guidance: float, device: str, stub: bool = False) -> Case:
    """Build both samplers over one loaded tiny model; each returns final latents [B, C, h, w] (float32)."""
    from sanarl.training.sampling import GenerationSpec, generate_latents

    adapter = _common.load_tiny(model, device)
    if stub:
        stub_transformer(adapter)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
    seeds = [1000 + i for i in range(batch)]
    cond = adapter.encode_prompts(prompts)
    uncond = adapter.encode_prompts([""]) if guidance != 1.0 and adapter.cfg_batch else None
    spec = GenerationSpec(
        num_steps=steps,
        guidance_scale=guidance,
        solver="euler",
        eta=0.0,
        shift=adapter.shift_for(SIZE, SIZE),
        height=SIZE,
        width=SIZE,
    )

    def run_sanarl() -> torch.Tensor:
        return generate_latents(adapter, cond, seeds, spec, uncond=uncond).latents

    def run_diffusers() -> torch.Tensor:
        if not adapter.cfg_batch:
            return flux_latents(adapter, cond, seeds, steps, guidance)
        return diffusers_latents(adapter, cond, uncond, seeds, steps, guidance)

    return Case(model, run_sanarl, run_diffusers)


def diffusers_latents(adapter, cond, uncond, seeds: list[int], steps: int, guidance: float) -> torch.Tensor:
    """`SanaPipeline.__call__` on the adapter's own pipeline with precomputed embeddings -> latents [B, C, h, w]."""
    batch = len(seeds)
    extra = {}
    if uncond is not None:
        neg = uncond.expand_to(batch)
        extra = {
            "negative_prompt_embeds": neg.embeds.contiguous(),
            "negative_prompt_attention_mask": neg.mask.contiguous(),
        }
    out = adapter.pipeline(
        prompt_embeds=cond.embeds,
        prompt_attention_mask=cond.mask,
        negative_prompt=None,
        num_inference_steps=steps,
        guidance_scale=guidance,
        height=SIZE,
        width=SIZE,
        generator=[torch.Generator().manual_seed(s) for s in seeds],
        output_type="latent",
        use_resolution_binning=False,
        **extra,
    )
    return out.images


def flux_latents(adapter, cond, seeds: list[int], steps: int, guidance: float) -> torch.Tensor:
    """`FluxPipeline.__call__` (its default sigmas and mu) with precomputed embeddings -> unpacked latents."""
    pipe = adapter.pipeline
    out = pipe(
        prompt_embeds=cond.embeds,
        pooled_prompt_embeds=cond.pooled,
        num_inference_steps=steps,
        guidance_scale=guidance,
        height=SIZE,
        width=SIZE,
        generator=[torch.Generator().manual_seed(s) for s in seeds],
        output_type="latent",
    )
    return pipe._unpack_latents(out.images, SIZE, SIZE, pipe.vae_scale_factor)


def profile(fn: Callable[[], object], label: str, top: int = 18) -> None:
    """cProfile one call and print the functions with the most cumulative time."""
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(top)
    print(f"--- profile: {label} ---")
    print(buf.getvalue())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--guidance", type=float, default=4.5)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", nargs="+", default=[*_common.TINY_MODELS, "sanarl-tiny:flux"])
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (0 = torch's default); see README"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile one call of each sampler")
    parser.add_argument(
        "--overhead",
        action="store_true",
        help="stub the transformer (v = 0.5 x): time the loops' own overhead",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    _common.quiet()
    what = "loop overhead only (stub transformer)" if args.overhead else f"{SIZE}px"
    print(f"sampler: {args.steps} Euler steps, batch {args.batch}, CFG {args.guidance}, {what}")
    print(f"env: {_common.environment()}")
    ok = True
    for model in args.models:
        case = make_case(model, args.batch, args.steps, args.guidance, args.device, stub=args.overhead)
        diff = (case.sanarl() - case.diffusers()).abs().max().item()
        times = _common.interleaved_medians(
            {"sanarl": case.sanarl, "diffusers": case.diffusers}, args.repeats, warmup=2
        )
        ratio = _common.median(times["sanarl"]) / _common.median(times["diffusers"])
        best = min(times["sanarl"]) / min(times["diffusers"])
        verdict = "ok" if diff < TOLERANCE else "MISMATCH"
        print(f"\n[{model}] max |sanarl - diffusers| = {diff:.3e}  ({verdict}, tolerance {TOLERANCE:g})")
        print(_common.describe_times(times))
        print(f"  ratio sanarl / diffusers = {ratio:.3f} median, {best:.3f} best-of  (target <= 1.0)")
        ok &= diff < TOLERANCE
        if args.profile:
            profile(case.sanarl, f"sanarl {model}")
            profile(case.diffusers, f"diffusers {model}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
