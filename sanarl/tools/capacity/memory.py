"""Peak memory per rank of a preset, phase by phase (rollout, training, validation), without weights.

Parameter terms come from the real transformer built on the meta device (sanarl/models/meta.py), with the run's LoRA
adapters injected by the same code a run uses; activation terms from the traced forward (and backward) of that
module at the run's micro-batch (simulate.py). What the run keeps (sanarl/training, sanarl/methods):
- the transformer in `transformer_dtype` (float32 for a full fine-tune), LoRA adapters in float32 (all of
  `lora_names` plus the method's: NFT's "old"), trainable ones with float32 gradients and, for Adam / AdamW, two
  float32 moments (torch.optim's foreach / fused / for-loop all keep exactly two; the foreach step also makes one
  float32 temporary per parameter, `sqrt(v)`, its own "optimizer step" phase); the EMA a float32 copy of the
  trainable ones;
- FSDP (one unit per transformer block) shards the transformer, its gradients, the optimizer state and the EMA by
  the world size and gathers one block at a time; DDP keeps everything whole on every rank;
- the text encoder(s) and VAE in `policy.diffusers.dtype` (on the CPU with `offload`), reward models in their
  dtype; Sol-RL's inference copies (a merged transformer per copy; the quantized preview adds the low-precision form
  of the layers `methods.group_rl.quantize.eligible_linears` selects); Flow-GRPO's frozen reference copy (full fine-tune
  with kl_beta > 0);
- a rollout's final latents of every draft of the rank's prompts (float32 on the device), and the kept ones through
  training;
- NFT's reference forward (kl_beta) between the trained forward and its backward: over the graph the forward holds,
  counted where that exceeds the backward's peak.
The kernels are a GPU's, or with `kernels="cpu"` the CPU's (oneDNN's convolution workspace, simulate.py).
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, field

import torch

from sanarl.config.schema import Config
from sanarl.evaluation.apply_checkpoint import lora_names
from sanarl.methods.registry import method_of
from sanarl.methods.work import TrainedWork
from sanarl.models.base import DTYPES, transformer_dtype
from sanarl.models.meta import (
    Architecture,
    architecture,
    components_table,
    default_lora_targets,
    depth_variants,
    example_inputs,
    meta_transformer,
    parameter_count,
)
from sanarl.tools.capacity.simulate import Kernels, Trace, trace

BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}
QUANT_BYTES = {"nvfp4": 0.5 + 1 / 16, "fp8": 1.0, "e2m1_delayed": 1.0, "int8": 1.0, "auto": 1.0}
"""Bytes per weight of a quantized layer's low-precision form (NVFP4: 4-bit values plus one 8-bit scale per 16;
e2m1_delayed: transformer-engine stores it as FP8 E5M2, docs/nft.md)."""


@dataclass
class Term:
    label: str
    nbytes: float
    key: str = ""
    """The config key that sets the term (named in a verdict)."""


@dataclass
class Phase:
    name: str
    terms: list[Term]

    @property
    def total(self) -> float:
        return sum(t.nbytes for t in self.terms)


@dataclass
class Estimate:
    """Per-rank memory of each phase, and what it was computed from."""

    arch: Architecture
    world: int
    fsdp: bool
    phases: list[Phase]
    params: dict[str, int]
    """transformer, lora (one adapter), trainable, quantized (elements of the quantized layers)."""
    traces: dict[str, Trace] = field(default_factory=dict)
    """Traced calls: rollout, train (the configured checkpointing), train_other (the other setting), validation."""
    batches: dict[str, int] = field(default_factory=dict)
    """Rows of each traced call."""
    kernels: Kernels = "cuda"
    """Whose kernels' workspace counts: a GPU's (the plan for an accelerator) or the CPU's (simulate.py)."""

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)


def trained_work(cfg: Config, arch: Architecture) -> TrainedWork:
    """What one optimizer step trains per sample, as the config's method declares it."""
    return method_of(cfg).trained_work(cfg, lambda batch, w: guided_rows(cfg, arch, batch, w))


def build_module(cfg: Config, arch: Architecture, dtype: torch.dtype, checkpointing: bool) -> torch.nn.Module:
    """The run's transformer on meta: LoRA adapters (as a run adds them) or all of it trainable, in `dtype`."""
    from sanarl.core.lora import add_lora_adapters

    module = meta_transformer(arch, torch.float32)
    lora = cfg.policy.lora
    if lora is None:
        module.requires_grad_(True)
    else:
        module.requires_grad_(False)
        with torch.device("meta"):
            add_lora_adapters(module, lora_names(cfg), r=lora.r, alpha=lora.lora_alpha,
                              init=lora.init_lora_weights,
                              target_modules=lora.target_modules or default_lora_targets(arch),
                              dropout=lora.lora_dropout, check=False)  # fmt: skip
        # check=False: a shortened stack (`depth_variants`) may lack the block kind a target lives in
    if checkpointing:
        module.enable_gradient_checkpointing()
    return torch.nn.Module.to(module, dtype)


def compute_dtype(cfg: Config) -> torch.dtype:
    """The dtype activations run in: the mixed precision, else the dtype the transformer is held in."""
    if cfg.train.param_dtype != "float32":
        return DTYPES[cfg.train.param_dtype]
    return transformer_dtype(cfg.policy)


def _text_len(cfg: Config) -> int:
    return cfg.policy.diffusers.max_prompt_length


def _frames(cfg: Config, training: bool) -> int:
    d = cfg.policy.diffusers
    return d.train_frames if training else d.inference_frames


_TRACES: dict[tuple, Trace] = {}


def traced(
    cfg: Config,
    batch: int,
    *,
    grad: bool,
    checkpointing: bool = False,
    training: bool = True,
    kernels: Kernels = "cuda",
) -> Trace:
    """The traced call of the run's transformer on `batch` rows, from shallow traces extrapolated in depth
    (`meta.depth_variants`; cached by everything that shapes it)."""
    p, lora = cfg.policy, cfg.policy.lora
    key = (p.model_name_or_path, tuple(p.diffusers.inference_size), _text_len(cfg), _frames(cfg, training),
           None if lora is None else (lora.r, tuple(lora.target_modules), tuple(lora_names(cfg))),
           compute_dtype(cfg), batch, grad, checkpointing, kernels)  # fmt: skip
    if key not in _TRACES:
        arch = architecture(p.model_name_or_path)
        base, variants = depth_variants(arch)
        if sum(count for count, _, _ in variants) < 8:  # a shallow model: one trace of it whole is cheaper
            base, variants = arch, []
        first = _trace_once(cfg, base, batch, grad, checkpointing, training, kernels)
        total, extra = list(astuple(first)), [0] * len(astuple(first))
        for count, one, two in variants:
            if count < 1:
                continue
            t1, t2 = (
                astuple(_trace_once(cfg, v, batch, grad, checkpointing, training, kernels))
                for v in (one, two)
            )
            for i, (a, b, c) in enumerate(zip(astuple(first), t1, t2, strict=True)):
                slope = max(0, c - b)  # each block of the kind adds this; the first may add more once (a peak
                total[i] += (
                    count * slope
                )  # that moves into the new kind's block), the largest such jump counts
                extra[i] = max(extra[i], b - a - slope)
        _TRACES[key] = Trace(*(t + e for t, e in zip(total, extra, strict=True)))
    return _TRACES[key]


def _trace_once(
    cfg: Config,
    arch: Architecture,
    batch: int,
    grad: bool,
    checkpointing: bool,
    training: bool,
    kernels: Kernels = "cuda",
) -> Trace:
    module = build_module(cfg, arch, compute_dtype(cfg), checkpointing and grad)
    if not grad:
        module.requires_grad_(False)
    size = tuple(cfg.policy.diffusers.inference_size)
    inputs = example_inputs(module, arch, batch, size, _frames(cfg, training), _text_len(cfg))
    return trace(module, inputs, grad=grad, kernels=kernels)


def guided_rows(cfg: Config, arch: Architecture, batch: int, guidance: float) -> int:
    """Rows of one forward: CFG doubles the batch (not for guidance-distilled FLUX.1-dev)."""
    distilled = arch.pipeline_class == "FluxPipeline"
    return batch * (2 if guidance != 1.0 and not distilled else 1)


def training_rows(cfg: Config, arch: Architecture) -> int:
    """Rows of one trained forward: mini_batch times the method's rows per sample (Flow-GRPO's CFG branches,
    DDRL's data rows, SOAR's auxiliary targets; AWM's levels stacked in one forward)."""
    work = trained_work(cfg, arch)
    return round(work.rows * work.levels_per_forward * cfg.train.train_policy.mini_batch)


def _count_params(cfg: Config, arch: Architecture) -> dict[str, int]:
    from sanarl.methods.group_rl.quantize import eligible_linears

    module = build_module(cfg, arch, torch.float32, False)
    lora = sum(p.numel() for n, p in module.named_parameters() if "lora_" in n and ".default." in n)
    base = parameter_count(module) - lora * (len(lora_names(cfg)) if cfg.policy.lora else 0)
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    plain = meta_transformer(arch, torch.float32)
    quantized = sum(
        plain.get_submodule(n).weight.numel() for n in eligible_linears(plain, cfg.rollout.nvfp4_min_dim)
    )
    blocks = [m for m in plain.modules() if isinstance(m, torch.nn.ModuleList)]
    largest_block = max((parameter_count(b) for ml in blocks for b in ml), default=base)
    return {"transformer": base, "lora": lora, "trainable": trainable, "quantized": quantized,
            "block": largest_block}  # fmt: skip


def _reward_terms(names: list[tuple[str, dict]], label: str) -> list[Term]:
    table = components_table()["rewards"]
    terms = []
    for name, options in names:
        entry = table.get(name)
        if entry is None or not entry["params"]:
            continue
        dtype = DTYPES.get(options.get("dtype", entry["dtype"]), DTYPES[entry["dtype"]])
        terms.append(Term(f"{label} {name} ({dtype_name(dtype)})", entry["params"] * BYTES[dtype],
                          "train.train_policy.remote_reward.reward_fns"))  # fmt: skip
    return terms


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def resident_terms(
    cfg: Config, arch: Architecture, params: dict[str, int], world: int, fsdp: bool
) -> list[Term]:
    """What stays on the device through every phase."""
    shard = world if fsdp else 1
    tdtype, fdtype = transformer_dtype(cfg.policy), DTYPES[cfg.policy.diffusers.dtype]
    base_key = "policy.diffusers.dtype" if cfg.policy.lora else "policy.lora"
    terms = [Term(f"transformer weights ({dtype_name(tdtype)})" + (f", 1/{shard} (FSDP)" if fsdp else ""),
                  params["transformer"] * BYTES[tdtype] / shard, base_key)]  # fmt: skip
    if fsdp:
        terms.append(Term("FSDP: one block gathered", params["block"] * BYTES[tdtype], "FSDP"))
    if cfg.policy.lora is not None:
        n = len(lora_names(cfg))
        terms.append(Term(f"LoRA adapters x{n} (float32)", n * params["lora"] * 4 / shard, "policy.lora.r"))
    if not cfg.policy.diffusers.offload:
        for name, count in arch.frozen.items():
            terms.append(
                Term(f"{name} ({dtype_name(fdtype)})", count * BYTES[fdtype], "policy.diffusers.offload")
            )
    trainable = params["trainable"] / shard
    if cfg.train.optm_name in ("Adam", "AdamW"):
        terms.append(Term(f"{cfg.train.optm_name} moments (2 x float32)", trainable * 8, "train.optm_name"))
    if cfg.train.ema_enable:
        terms.append(Term("EMA (float32)", trainable * 4, "train.ema_enable"))
    if method_of(cfg).group_rollouts:
        fns = cfg.train.train_policy.remote_reward.reward_fns
        if not cfg.train.train_policy.use_remote_reward:
            terms += _reward_terms([(f.name, f.options) for f in fns], "reward")
    terms += _copy_terms(cfg, params)
    return terms


def _copy_terms(cfg: Config, params: dict[str, int]) -> list[Term]:
    """Sol-RL's inference copies and the frozen reference copy of Flow-GRPO (with kl_beta) and DPO."""
    ro, method = cfg.rollout, method_of(cfg)
    whole = params["transformer"] * BYTES[transformer_dtype(cfg.policy)]
    quant = ro.preview_precision if ro.preview_precision != "bf16" else None
    packed = 0 if quant is None else params["quantized"] * QUANT_BYTES[quant]
    terms = []
    if method.group_rollouts and ro.family in ("compile", "naive_quant", "sol_rl"):  # NFT's inference copies
        terms.append(Term(f"inference copy ({ro.family}, merged old adapter)", whole, "rollout.family"))
        if quant and ro.family in ("naive_quant", "sol_rl"):
            if ro.family == "sol_rl":
                terms.append(Term("preview copy (high-precision master)", whole, "rollout.family"))
            terms.append(Term(f"{quant} form of {params['quantized'] / 1e6:.0f}M quantized weights", packed,
                              "rollout.nvfp4_min_dim"))  # fmt: skip
    kl = cfg.train.train_policy.kl_beta > 0
    if method.reference_copy == "with_kl" and kl and cfg.policy.lora is None:
        terms.append(Term("reference copy (kl_beta, full fine-tune)", whole, "train.train_policy.kl_beta"))
    if method.reference_copy == "always" and cfg.policy.lora is None:
        terms.append(Term("reference copy (full fine-tune)", whole, "policy.lora"))
    return terms


def rollout_counts(cfg: Config, world: int) -> tuple[int, int, int]:
    """(prompts per rank, drafts per prompt, kept per prompt) of an RL iteration."""
    from sanarl.training.protocol import per_rank_batch, run_settings

    k = cfg.rollout.n_generation
    m = cfg.rollout.num_candidates or k
    return per_rank_batch(run_settings(cfg), world) // k, m, k


def estimate(
    cfg: Config, world: int, fsdp: bool, *, both_checkpointing: bool = True, kernels: Kernels = "cuda"
) -> Estimate:
    """The per-rank memory of every phase of the run `cfg` on `world` ranks (FSDP or DDP) whose calls run on
    `kernels` (a GPU's, or the CPU's); `both_checkpointing` also traces the training call with gradient
    checkpointing the other way (for the printed comparison)."""
    arch = architecture(cfg.policy.model_name_or_path)
    params = _count_params(cfg, arch)
    resident = resident_terms(cfg, arch, params, world, fsdp)
    est = Estimate(arch, world, fsdp, [], params, kernels=kernels)
    shard = world if fsdp else 1
    module = meta_transformer(arch, torch.float32)
    size = tuple(cfg.policy.diffusers.inference_size)
    latent = example_inputs(module, arch, 1, size, _frames(cfg, False), 1)["hidden_states"].numel()
    rl = method_of(cfg).group_rollouts
    kept_latents = []
    if rl:
        prompts, m, k = rollout_counts(cfg, world)
        sample = cfg.policy.diffusers.sample
        rows = guided_rows(cfg, arch, cfg.rollout.batch_size, sample.guidance_scale)
        est.traces["rollout"] = traced(cfg, rows, grad=False, training=False, kernels=kernels)
        est.batches["rollout"] = rows
        drafts = Term(f"rollout latents ({prompts} prompts x {m} drafts, float32)", prompts * m * latent * 4,
                      "rollout.num_candidates")  # fmt: skip
        act = Term(
            f"activations, no-grad forward of {rows} rows", est.traces["rollout"].peak, "rollout.batch_size"
        )
        est.phases.append(Phase("rollout", [*resident, drafts, act, *text_encoder_term(cfg)]))
        kept_latents = [Term(f"kept latents ({prompts} x {k}, float32)", prompts * k * latent * 4,
                             "rollout.n_generation")]  # fmt: skip
    encoder = [] if rl else text_encoder_term(cfg)
    training = _training_terms(cfg, arch, params, shard, est, both_checkpointing)
    est.phases.append(Phase("training", [*resident, *kept_latents, *training, *encoder]))
    if cfg.train.optm_name in ("Adam", "AdamW") and cfg.train.optm_impl == "foreach":
        step = Term(
            "foreach AdamW step temporaries (float32)", params["trainable"] * 4 / shard, "train.optm_impl"
        )
        est.phases.append(Phase("optimizer step", [*resident, *kept_latents, training[0], step]))
    if cfg.validation.enable:
        rows = guided_rows(cfg, arch, cfg.validation.batch_size, cfg.policy.diffusers.sample.guidance_scale)
        est.traces["validation"] = traced(cfg, rows, grad=False, training=False, kernels=kernels)
        est.batches["validation"] = rows
        terms = [Term(f"activations, no-grad forward of {rows} rows", est.traces["validation"].peak,
                      "validation.batch_size")]  # fmt: skip
        if cfg.train.ema_enable:
            terms.append(
                Term("EMA swap: saved trained weights", params["trainable"] * 4 / shard, "train.ema_enable")
            )
        terms += _reward_terms([(n, {}) for n in cfg.validation.held_out_rewards], "held-out reward")
        est.phases.append(Phase("validation", [*resident, *kept_latents, *terms]))
    return est


def _training_terms(
    cfg: Config, arch: Architecture, params: dict[str, int], shard: int, est: Estimate, both: bool
) -> list[Term]:
    ckpt = cfg.policy.model_gradient_checkpointing
    rows = training_rows(cfg, arch)
    est.batches["train"] = rows
    est.traces["train"] = traced(cfg, rows, grad=True, checkpointing=ckpt, kernels=est.kernels)
    if both:
        est.traces["train_other"] = traced(cfg, rows, grad=True, checkpointing=not ckpt, kernels=est.kernels)
    terms = [Term("gradients (float32)", params["trainable"] * 4 / shard, "policy.lora"),
             Term(f"activations, forward + backward of {rows} rows, checkpointing {'on' if ckpt else 'off'}",
                  est.traces["train"].peak, "train.train_policy.mini_batch")]  # fmt: skip
    if cfg.policy.lora is None and compute_dtype(cfg) != torch.float32:
        terms.append(Term(f"autocast {dtype_name(compute_dtype(cfg))} weight copies", params["transformer"]
                          * BYTES[compute_dtype(cfg)] / shard, "train.param_dtype"))  # fmt: skip
    if cfg.train.train_policy.kl_beta > 0 and method_of(cfg).group_rollouts:
        # the reference's no-grad forward runs between the trained forward and its backward: over the held graph
        ref = traced(cfg, rows, grad=False, kernels=est.kernels)
        train = est.traces["train"]
        terms.append(Term(f"reference forward of {rows} rows (kl_beta) over the held graph, beyond the backward",
                          max(0, train.held + ref.peak - train.peak), "train.train_policy.kl_beta"))  # fmt: skip
    return terms


def text_encoder_term(cfg: Config) -> list[Term]:
    """The largest text encoder's forward on one prompt of `max_prompt_length` tokens (traced where its config is
    here: local and tiny pipelines, Gemma-2 and T5; CLIP reads its mask's values and is left out); [] for shipped
    hub configs."""
    from sanarl.models.meta import meta_text_encoders

    peak = 0
    length = _text_len(cfg)
    for module in meta_text_encoders(cfg.policy.model_name_or_path).values():
        module.to(DTYPES[cfg.policy.diffusers.dtype]).requires_grad_(False)
        ids = torch.zeros(1, length, dtype=torch.long, device="meta")
        mask = torch.ones(1, length, dtype=torch.long, device="meta")
        try:
            found = trace(module, {"input_ids": ids, "attention_mask": mask}, grad=False, fused=False)
        except (
            RuntimeError
        ):  # an encoder that reads its mask back (CLIP's causal mask): not traceable on meta
            continue
        peak = max(peak, found.peak)
    if not peak:
        return []
    return [
        Term(
            f"text encoder forward, one prompt of {length} tokens", peak, "policy.diffusers.max_prompt_length"
        )
    ]
