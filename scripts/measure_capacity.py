"""Measure a run's peak memory on the CPU and compare it with `sanarl validate`'s estimate (docs/results.md,
"Memory plan against measurement").

    python scripts/measure_capacity.py --steps 2 -- --config tiny-shapes-nft sanarl.datasets.shapes [--set ...]
    python scripts/measure_capacity.py --transformer -- --config sana-image-sft-lora --set ...   # one micro-step

`--transformer`: the preset's real transformer with random weights (bfloat16 base, float32 LoRA, as a run holds
it), one training micro-step under bf16 autocast (NFT: the old-policy forward, the trained forward, the reference
forward with kl_beta, then backward), measured the same way: the resident size the weights add, and the peak of a
second, identical micro-step over the weights (gradients allocated first; the first one starts the kernels),
against the estimate's weight and activation terms.

The estimate is the plan for CPU kernels (`estimate(..., kernels="cpu")`: oneDNN's transient copy of each bfloat16
convolution weight counts).

Method: the run goes in a fresh process with glibc's dynamic mmap threshold pinned (MALLOC_MMAP_THRESHOLD_=65536,
so every tensor of 64 KiB or more is its own mapping, returned to the system when freed) and one OpenMP thread.
The run goes twice in that process: the first (a warm-up into another output folder) imports every module and
starts every kernel and thread pool; then the kernel's peak-RSS mark is reset (`5 > /proc/self/clear_refs`) and the
resident size noted, and the measured peak of the second run is VmHWM minus that baseline. Linux only.

`--read-weights`: every parameter and buffer of the loaded pipeline is read once (a sum) before the run starts. A
CPU run maps the safetensors files and pages in only what it reads (Gemma-2 reads its embedding table at the
prompt's token rows only; an SFT run never calls the VAE decoder, an RL run never its encoder); a GPU run copies every
weight onto the device, as the plan counts them. With --read-weights the CPU run holds its weights as the plan does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import gc, json, sys
import sanarl.cli


def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024


def run(out):
    try:
        sanarl.cli.main([*sys.argv[1:], "--set", f"train.output_dir={out}"])
    except SystemExit as exc:
        return exc.code
    return 0


warm, measured, read = sys.argv.pop(), sys.argv.pop(), sys.argv.pop() == "read"
if read:  # every weight read once at load, as copying it to a GPU reads it: mmap-backed weights become resident
    import torch
    from sanarl.models.base import DiffusionAdapter

    bind = DiffusionAdapter._bind

    def reading_bind(self, pipeline, *args, **kwargs):
        for module in pipeline.components.values():
            if isinstance(module, torch.nn.Module):
                for tensor in (*module.parameters(), *module.buffers()):
                    tensor.detach().sum()
        bind(self, pipeline, *args, **kwargs)

    DiffusionAdapter._bind = reading_bind
code = run(warm)  # every import, kernel and thread pool of the run happens here
gc.collect()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
base = status("VmRSS")
code = code or run(measured)
print("MEASURED " + json.dumps({"peak": status("VmHWM") - base, "code": code}))
"""


TRANSFORMER = r"""
import json, sys, torch
from sanarl.methods.config_loading import load_config
from sanarl.config.presets import resolve_preset_path
from sanarl.core.lora import add_lora_adapters
from sanarl.models.meta import architecture, default_lora_targets, example_inputs, _find_class
from sanarl.evaluation.apply_checkpoint import lora_names
from sanarl.methods.registry import method_of


def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))


cfg = load_config(resolve_preset_path(sys.argv[1]), sys.argv[2:]).config
arch, lora = architecture(cfg.policy.model_name_or_path), cfg.policy.lora
empty = status("VmRSS")
torch.set_default_dtype(torch.bfloat16)
module = _find_class(arch.transformer_class).from_config(arch.transformer_config).requires_grad_(False)
torch.set_default_dtype(torch.float32)
add_lora_adapters(module, lora_names(cfg), r=lora.r, alpha=lora.lora_alpha, init=lora.init_lora_weights,
                  target_modules=lora.target_modules or default_lora_targets(arch))
if cfg.policy.model_gradient_checkpointing:
    module.enable_gradient_checkpointing()
for p in module.parameters():
    if p.requires_grad:
        p.grad = torch.zeros_like(p)
weights = status("VmRSS") - empty
meta = example_inputs(module, arch, cfg.train.train_policy.mini_batch, tuple(cfg.policy.diffusers.inference_size),
                      cfg.policy.diffusers.train_frames, cfg.policy.diffusers.max_prompt_length)
inputs = {k: (torch.ones if "mask" in k else torch.randn)(v.shape, dtype=v.dtype) if isinstance(v, torch.Tensor) else v
          for k, v in meta.items()}
nft = method_of(cfg).name == "diffusion_nft"


def micro_step():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if nft:
            with torch.no_grad():
                old = module(**inputs)[0]  # the old policy's prediction, held through the step
        out = module(**inputs)[0]
        if nft and cfg.train.train_policy.kl_beta > 0:
            with torch.no_grad():
                ref = module(**inputs)[0]  # held with the graph, as the loss holds it
        out.float().square().mean().backward()


micro_step()  # the first call starts every kernel (oneDNN primitives, thread pool): not the step's memory
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
base = status("VmRSS")
micro_step()
print("MEASURED " + json.dumps({"weights": weights, "step": status("VmHWM") - base}))
"""


def measure_transformer(args: list[str]) -> dict:
    """{"weights", "weights_estimated", "step", "step_estimated"} of one micro-step of the preset's transformer."""
    from sanarl.config.presets import resolve_preset_path
    from sanarl.methods.config_loading import load_config
    from sanarl.tools.capacity.memory import estimate

    config = args[args.index("--config") + 1]
    overrides = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    cfg = load_config(resolve_preset_path(config), overrides).config
    if cfg.policy.lora is None or cfg.train.param_dtype != "bfloat16":
        print(f"--transformer measures a LoRA preset trained under bfloat16 autocast (the real-size presets); "
              f"{config} has policy.lora = {cfg.policy.lora} and train.param_dtype = {cfg.train.param_dtype!r}. "
              "Measure it as a whole run instead (without --transformer).", file=sys.stderr)  # fmt: skip
        sys.exit(2)
    env = {
        **os.environ,
        "MALLOC_MMAP_THRESHOLD_": "65536",
        "MALLOC_TRIM_THRESHOLD_": "0",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run([sys.executable, "-c", TRANSFORMER, config, *overrides], env=env, capture_output=True,
                          text=True)  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("MEASURED ")]
    if not lines:
        raise RuntimeError(f"the measured step failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    measured = json.loads(lines[-1][9:])
    est = estimate(cfg, 1, False, both_checkpointing=False, kernels="cpu")
    training = next(p for p in est.phases if p.name == "training").terms
    weights = sum(t.nbytes for t in training if t.label.startswith(("transformer weights", "LoRA adapters")))
    step = sum(t.nbytes for t in training if t.label.startswith(("activations", "reference forward")))
    return {"weights": measured["weights"], "weights_estimated": weights, "step": measured["step"],
            "step_estimated": step}  # fmt: skip


def measure(args: list[str], steps: int, read_weights: bool = False) -> dict:
    """{"measured", "estimated", "error", "phase"} of the training run `args` for `steps` optimizer steps;
    `read_weights` reads every weight of the pipeline once when it loads (see the module docstring)."""
    from sanarl.config.presets import resolve_preset_path
    from sanarl.methods.config_loading import load_config
    from sanarl.tools.capacity.memory import estimate

    with tempfile.TemporaryDirectory() as out:
        run = [*args, "--set", f"train.max_num_steps={steps}", "--set", "train.ckpt.enable_checkpoint=false",
               "--set", "train.ckpt.export_safetensors=false", "read" if read_weights else "as-run", f"{out}/measured",
               f"{out}/warm"]  # fmt: skip
        env = {
            **os.environ,
            "MALLOC_MMAP_THRESHOLD_": "65536",
            "MALLOC_TRIM_THRESHOLD_": "0",
            "OMP_NUM_THREADS": "1",
        }
        proc = subprocess.run([sys.executable, "-c", CHILD, *run], env=env, capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("MEASURED ")]
        if not lines or json.loads(lines[-1][9:])["code"] not in (0, None):
            raise RuntimeError(f"the measured run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        measured = json.loads(lines[-1][9:])["peak"]
    config = args[args.index("--config") + 1]
    overrides = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    est = estimate(
        load_config(resolve_preset_path(config), overrides).config,
        1,
        False,
        both_checkpointing=False,
        kernels="cpu",
    )
    peak = est.peak.total
    return {"measured": measured, "estimated": peak, "error": peak / measured - 1, "phase": est.peak.name}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--transformer", action="store_true", help="one micro-step of the real transformer")
    parser.add_argument(
        "--read-weights",
        action="store_true",
        help="read every weight once at load, as a copy "
        "to a GPU does, so weights mapped from safetensors count whole where the run never reads them",
    )
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args()
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    mib = 2**20
    if ns.transformer:
        r = measure_transformer(args)
        for part in ("weights", "step"):
            print(f"{part}: measured {r[part] / mib:.1f} MiB, estimated {r[part + '_estimated'] / mib:.1f} MiB, "
                  f"error {r[part + '_estimated'] / r[part] - 1:+.1%}")  # fmt: skip
        sys.exit(0)
    result = measure(args, ns.steps, ns.read_weights)
    print(f"measured {result['measured'] / mib:.1f} MiB, estimated {result['estimated'] / mib:.1f} MiB "
          f"({result['phase']}), error {result['error']:+.1%}")  # fmt: skip
