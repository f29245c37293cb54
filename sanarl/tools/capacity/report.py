"""The memory plan as `sanarl validate` prints it: terms by phase, compute per iteration, and a verdict with the
options that would make a run fit (each re-estimated)."""

from __future__ import annotations

import copy
from collections.abc import Callable

from sanarl.config.schema import Config
from sanarl.tools.capacity.accelerators import MFU, Accelerator
from sanarl.tools.capacity.flops import iteration_flops, iteration_seconds
from sanarl.tools.capacity.memory import Estimate, estimate

GIB = 2**30


def gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f}"


def breakdown(est: Estimate) -> list[str]:
    """One line per term, its GiB in each phase ("-" where the phase does not hold it)."""
    names = [p.name for p in est.phases]
    labels = list(dict.fromkeys(t.label for p in est.phases for t in p.terms if t.nbytes > 0))
    width = max(len(label) for label in labels)
    lines = [f"  {'per rank, GiB':<{width}}  " + "  ".join(f"{n:>10}" for n in names)]
    for label in labels:
        cells = []
        for phase in est.phases:
            found = [t.nbytes for t in phase.terms if t.label == label]
            cells.append(f"{gib(found[0]):>10}" if found else f"{'-':>10}")
        lines.append(f"  {label:<{width}}  " + "  ".join(cells))
    lines.append(f"  {'total':<{width}}  " + "  ".join(f"{gib(p.total):>10}" for p in est.phases))
    return lines


def summary(cfg: Config, est: Estimate, gpu: Accelerator | None) -> list[str]:
    p = est.params
    mode = "FSDP (one unit per block)" if est.fsdp else "DDP"
    lines = [
        f"memory plan: {est.arch.name} on {est.world} rank(s), {mode}; architecture from {est.arch.source}",
        f"  transformer {p['transformer'] / 1e9:.3f}B parameters, trainable {p['trainable'] / 1e6:.2f}M"
        + (f" (LoRA r={cfg.policy.lora.r}, {p['lora'] / 1e6:.2f}M per adapter)" if cfg.policy.lora else "")
        + f", quantizable by the preview rule {p['quantized'] / 1e6:.0f}M",
        *breakdown(est),
    ]
    ckpt = cfg.policy.model_gradient_checkpointing
    on, off = (est.traces["train"], est.traces.get("train_other", est.traces["train"]))[:: 1 if ckpt else -1]
    lines.append(f"  activations of one micro-batch ({est.batches['train']} rows): {gib(off.peak)} GiB without "
                 f"gradient checkpointing, {gib(on.peak)} GiB with")  # fmt: skip
    if est.kernels == "cpu":
        lines.append(
            "  CPU kernels: activations include oneDNN's transient copy of each bfloat16 convolution weight"
        )
    flops = iteration_flops(cfg, est)
    lines.append(f"compute per iteration and rank: rollout {flops.rollout / 1e15:.2f} PFLOP, quantized preview "
                 f"{flops.preview / 1e15:.2f}, training {flops.training / 1e15:.2f}, rewards {flops.rewards / 1e15:.2f}"
                 f" (total {flops.total / 1e15:.2f} PFLOP)")  # fmt: skip
    if gpu is not None:
        seconds = iteration_seconds(flops, gpu, cfg.rollout.preview_precision)
        lines.append(f"time per iteration on {est.world} x {gpu.name}: about {seconds / 60:.1f} min (assumes "
                     f"{MFU:.0%} of the dense bf16 peak {gpu.bf16_tflops:g} TFLOP/s, the preview at its precision's "
                     "peak; text encoders and VAE not counted)")  # fmt: skip
    return lines


def _set(cfg: Config, path: str, value) -> Config:
    new = copy.deepcopy(cfg)
    *parents, leaf = path.split(".")
    target = new
    for part in parents:
        target = getattr(target, part)
    setattr(target, leaf, value)
    return new


def options(cfg: Config, est: Estimate) -> list[tuple[str, Callable[[], Estimate]]]:
    """(what to change, its re-estimate) for the changes that lower the peak."""
    from sanarl.training.protocol import per_rank_batch, run_settings

    def rerun(new: Config, fsdp: bool = est.fsdp) -> Callable[..., Estimate]:
        return lambda both=True: estimate(new, est.world, fsdp, both_checkpointing=both, kernels=est.kernels)

    found = []
    if not cfg.policy.model_gradient_checkpointing:
        new = _set(cfg, "policy.model_gradient_checkpointing", True)
        found.append(("`--set policy.model_gradient_checkpointing=true`", rerun(new)))
    if not est.fsdp and est.world > 1:
        found.append(("launch with FSDP (`accelerate launch --config_file sanarl/data/accelerate/fsdp_8gpu.yaml`)",
                      rerun(cfg, fsdp=True)))  # fmt: skip
    mb = cfg.train.train_policy.mini_batch
    per_rank = per_rank_batch(run_settings(cfg), est.world)
    smaller = [d for d in range(mb - 1, 0, -1) if per_rank % d == 0]
    if smaller:
        new_mb = smaller[len(smaller) // 2] if len(smaller) > 2 else smaller[-1]
        new = _set(cfg, "train.train_policy.mini_batch", new_mb)
        found.append((f"`--set train.train_policy.mini_batch={new_mb}`", rerun(new)))
    if cfg.policy.diffusers.dtype == "float32":
        new = _set(cfg, "policy.diffusers.dtype", "bfloat16")
        found.append(("`--set policy.diffusers.dtype=bfloat16` (frozen weights)", rerun(new)))
    if not cfg.policy.diffusers.offload:
        new = _set(cfg, "policy.diffusers.offload", True)
        found.append(("`--set policy.diffusers.offload=true` (text encoder and VAE on the CPU)", rerun(new)))
    m = cfg.rollout.num_candidates
    if m > cfg.rollout.n_generation:
        fewer = max(cfg.rollout.n_generation, m // 2)
        new = _set(cfg, "rollout.num_candidates", fewer)
        found.append((f"`--set rollout.num_candidates={fewer}` (fewer drafts)", rerun(new)))
    return found


def verdict(cfg: Config, est: Estimate, capacity: float, where: str) -> tuple[bool, list[str]]:
    """(fits, lines): the peak phase against `capacity` bytes; when it does not fit, the largest term and every
    option with its new peak."""
    peak = est.peak
    if peak.total <= capacity:
        return True, [f"[bold green]fits[/]: peak {gib(peak.total)} GiB per rank ({peak.name}) of {gib(capacity)} "
                      f"GiB on {where}"]  # fmt: skip
    largest = max(peak.terms, key=lambda t: t.nbytes)
    lines = [f"[bold red]does not fit[/]: peak {gib(peak.total)} GiB per rank ({peak.name}) > {gib(capacity)} GiB on "
             f"{where}; largest term: {largest.label} {gib(largest.nbytes)} GiB (`{largest.key}`)"]  # fmt: skip
    for label, rerun in options(cfg, est):
        new = rerun().peak
        mark = "fits" if new.total <= capacity else "still over"
        lines.append(f"  {label}: peak {gib(new.total)} GiB ({new.name}), {mark}")
    return False, lines
