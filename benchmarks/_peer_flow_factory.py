"""Flow-Factory's side of the `ff-grpo` and `ff-nft` pairs: one epoch of its `GRPOTrainer` / `DiffusionNFTTrainer`
on its SD3.5 adapter (`models/stable_diffusion/sd3_5.py`), built and stepped with the checkout's own modules.

Built as its `trainers.loader.load_trainer` builds them, from its own argument classes (`hparams.Arguments.from_dict`
with the values of its `examples/{grpo,nft}/lora/sd3_5/default.yaml`, scaled down to the `Work`): an `Accelerator`
with the trainer's gradient accumulation, `models.loader.load_model`, the registered trainer class. One iteration is
the body of the trainer's `start()` loop: the scheduler's seed, `sample()` (the old-policy parameters for nft),
`prepare_feedback()` (rewards, advantages), `optimize()`, `adapter.ema_step()`. Left out, as on the other sides:
checkpoints and evaluation every N epochs (`save_freq = eval_freq = 0`), logging backends (`none`).

What the driver sets, and why (listed in the result as this side's patches):
- Flow-Factory's trainers wrap sampling and training in `torch.autocast(dtype=bfloat16)` on the accelerator's device
  whatever `mixed_precision` says; the driver replaces that context with a disabled one, so this side computes in
  float32 like the others (`mixed_precision = "no"`, `master_weight_dtype = latent_storage_dtype = fp32`; its
  default fp16 latent storage does not run on the CPU without autocast).
- Its SD3.5 adapter calls diffusers' `StableDiffusion3Pipeline.encode_prompt` without `max_sequence_length`
  (diffusers' default: 256 T5 tokens); the driver binds 128 on the adapter's pipeline, the references' and sanarl's
  length, so the transformer sees the same sequence on every side.
- Devices: `ema_device = ref_param_device = "cpu"` and the reward on `"cpu"` (configuration, not code); CUDA-only
  lines of the imported modules are patched as for the other references (`_peer_import`).

The reward: Flow-Factory ships no weight-free image reward, so `JpegCompressibility` below is registered through
its reward registry (a `PointwiseRewardModel` on the PIL images its reward processor hands over:
-(JPEG q95 bytes / 1000) / 500, the formula of the other sides). Prompts come from a `train.jsonl` with an empty
`negative_prompt` (its SD3.5 adapter runs CFG only when a negative prompt is given), prepared by its dataset code
(text encodings computed once when the dataset is prepared, as its default `enable_preprocess` does: unlike the
other sides, its rollout does not encode prompts). Sampling batch and training micro-batch are one setting there
(`per_device_batch_size`).
"""

from __future__ import annotations

import io
import json
import logging
import sys
from functools import partial
from pathlib import Path

import torch
from _peer_import import import_reference
from _peers import MAX_SEQUENCE_LENGTH, PhaseClock, Side, Work

MODULES = [
    "hparams",
    "models.loader",
    "models.stable_diffusion.sd3_5",
    "trainers.registry",
    "trainers.grpo",
    "trainers.nft",
    "rewards.abc",
    "rewards.registry",
    "data_utils.loader",
]
REWARD = "sanarl_bench_jpeg"
"""The name `JpegCompressibility` is registered under in Flow-Factory's reward registry."""
JpegCompressibility = None
"""Set by `_reward_class` once Flow-Factory is imported (its registry imports rewards by `module.Class` path)."""


def _reward_class(abc_module) -> type:
    """jpeg_compressibility as a Flow-Factory `PointwiseRewardModel` (PIL images in, one score per image)."""

    class JpegCompressibility(abc_module.PointwiseRewardModel):
        use_tensor_inputs = False

        def __call__(self, prompt, image=None, **kwargs):
            sizes = []
            for picture in image:
                buffer = io.BytesIO()
                picture.convert("RGB").save(buffer, format="JPEG", quality=95)
                sizes.append(buffer.tell() / 1000.0)
            return abc_module.RewardModelOutput(rewards=-torch.tensor(sizes) / 500.0)

    JpegCompressibility.__module__ = __name__
    return JpegCompressibility


def arguments(method: str, work: Work, model: Path, data: Path, scratch: Path) -> dict:
    """The `Arguments.from_dict` input: the SD3.5 LoRA example of `method` scaled down to `work`, on the CPU."""
    train = dict(
        trainer_type=method,
        resolution=work.size,
        num_inference_steps=work.steps,
        per_device_batch_size=work.batch,
        group_size=work.group,
        unique_sample_num_per_epoch=work.prompts,
        gradient_step_per_epoch=work.updates,
        learning_rate=3e-4 if method == "grpo" else 1e-4,
        adam_weight_decay=1e-4,
        max_grad_norm=1.0,
        adv_clip_range=5.0,
        advantage_aggregation="sum",
        ema_device="cpu",
        ref_param_device="cpu",
        latent_storage_dtype="fp32",
        enable_gradient_checkpointing=False,
        seed=42,
    )
    if (
        method == "grpo"
    ):  # examples/grpo/lora/sd3_5/default.yaml; the SDE window at the start, as the grpo pair
        train.update(guidance_scale=work.guidance, clip_range=1e-4, kl_beta=0, global_std=True)
        train.update(ema_decay=0.99, ema_update_interval=4)
        scheduler = dict(dynamics_type="Flow-SDE", noise_level=work.noise_level, num_sde_steps=work.window)
        scheduler.update(sde_steps=list(range(work.window)), seed=42)
    else:  # examples/nft/lora/sd3_5/default.yaml; KL 1e-4 and int(steps x 0.99) levels, as sanarl and DiffusionNFT
        train.update(guidance_scale=1.0, nft_beta=1.0, off_policy=True, kl_beta=1e-4, global_std=False)
        train.update(ema_decay_schedule="piecewise_linear", flat_steps=0, ramp_rate=0.001, ema_decay=0.5)
        train.update(
            ema_update_interval=1, time_sampling_strategy="discrete", time_shift=3.0, timestep_range=1.0
        )
        train.update(num_train_timesteps=int(work.steps * 0.99))
        scheduler = dict(dynamics_type="ODE")
    return dict(
        mixed_precision="no",
        data=dict(
            dataset_dir=str(data),
            cache_dir=str(scratch / "datasets"),
            dataloader_num_workers=0,
            preprocessing_batch_size=work.batch,
            force_reprocess=True,
        ),
        model=dict(
            finetune_type="lora",
            lora_rank=work.rank,
            lora_alpha=2 * work.rank,
            target_modules="default",
            model_name_or_path=str(model),
            model_type="sd3-5",
            master_weight_dtype="fp32",
        ),
        log=dict(logging_backend="none", save_dir=str(scratch / "saves"), save_freq=0, run_name="bench", verbose=False),
        train=train,
        scheduler=scheduler,
        eval=dict(eval_freq=0, resolution=work.size, num_inference_steps=work.steps),
        rewards=[dict(name="jpeg_compressibility", reward_model=REWARD, batch_size=work.group, device="cpu",
                      dtype="float32")],
    )  # fmt: skip


def _check_alignment(training_args, work: Work) -> None:
    """Flow-Factory rounds its prompts per epoch up to its batch geometry; a work it changes is not the same work
    as the other side's: exit 2 with the numbers."""
    prompts = training_args.unique_sample_num_per_epoch
    if prompts != work.prompts:
        print(
            f"Flow-Factory aligns {work.prompts} prompt(s) per iteration to {prompts} for --group {work.group} and "
            f"--batch {work.batch}; choose --prompts, --group and --batch that it keeps (the defaults do: 2, 4, 4).",
            file=sys.stderr,
        )
        raise SystemExit(2)


class FlowFactorySide(Side):
    def __init__(self, checkout: Path, method: str, work: Work, model: Path, scratch: Path) -> None:
        global JpegCompressibility
        from accelerate import Accelerator
        from accelerate.utils import set_seed

        self.name, self.work = "Flow-Factory", work
        folder = scratch / f"flow-factory-{method}"
        data = folder / "data"
        data.mkdir(parents=True, exist_ok=True)
        rows = [json.dumps({"prompt": p, "negative_prompt": ""}) + "\n" for p in work.prompt_list()]
        (data / "train.jsonl").write_text("".join(rows))
        m, self.patched = import_reference(checkout / "src", "flow_factory", MODULES, folder)
        import datasets  # Flow-Factory's dependency: its prompt data go through it

        datasets.disable_progress_bars()
        # its INFO / WARNING lines while building (parameter tables, dataset preparation)
        logging.disable(logging.WARNING)
        try:
            JpegCompressibility = _reward_class(m["rewards.abc"])
            m["rewards.registry"].register_reward_model(REWARD)(JpegCompressibility)
            args = m["hparams"].Arguments.from_dict(arguments(method, work, model, data, folder))
            _check_alignment(args.training_args, work)
            steps = args.training_args.gradient_accumulation_steps
            accelerator = Accelerator(cpu=True, mixed_precision="no", gradient_accumulation_steps=steps)
            set_seed(args.training_args.seed, device_specific=True)
            adapter = m["models.loader"].load_model(config=args, accelerator=accelerator)
            adapter.pipeline.encode_prompt = partial(
                adapter.pipeline.encode_prompt, max_sequence_length=MAX_SEQUENCE_LENGTH
            )
            trainer_class = m["trainers.registry"].get_trainer_class(method)
            self.trainer = trainer_class(config=args, accelerator=accelerator, adapter=adapter)
        finally:
            logging.disable(logging.NOTSET)
        for name in [n for n in logging.root.manager.loggerDict if n.startswith("flow_factory")]:
            logging.getLogger(name).setLevel(logging.ERROR)
        self.trainer.autocast = partial(torch.autocast, device_type="cpu", enabled=False)
        self.patched += [
            "trainer.autocast: bfloat16 autocast -> disabled (float32, as the other sides)",
            f"adapter.pipeline.encode_prompt: max_sequence_length 256 (diffusers' default) -> {MAX_SEQUENCE_LENGTH}",
        ]
        self.clock = PhaseClock()
        trainer = self.trainer
        trainer.sample = self.clock.timed_rollout(trainer.sample)
        buffer = trainer.reward_buffer  # rewards are scored when collected (its synchronous reward path)
        buffer.finalize = self.clock.timed_rollout(self.clock.timed_reward(buffer.finalize))
        self.method = method

    def iteration(self) -> dict[str, float]:
        return self.clock.iteration(self._epoch)

    def _epoch(self) -> None:
        """The body of the trainer's `start()` loop (checkpoints and evaluation off)."""
        trainer = self.trainer
        trainer.adapter.scheduler.set_seed(trainer.epoch + trainer.training_args.seed)
        if self.method == "nft":
            with trainer.sampling_context():
                samples = trainer.sample()
        else:
            samples = trainer.sample()
        trainer.prepare_feedback(samples)
        trainer.optimize(samples)
        trainer.adapter.ema_step(step=trainer.epoch)
        trainer.epoch += 1
