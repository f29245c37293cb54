"""docs/capacity.md: the memory plan of every shipped preset, computed without weights.

    python -m sanarl.tools.capacity_table > docs/capacity.md         # all presets
    python -m sanarl.tools.capacity_table PRESET ...                 # those rows only

tests/unit/test_capacity_table.py regenerates rows and compares them with the file.
"""

from __future__ import annotations

import sys

from sanarl.config.cosmos.drop_in import planned_world_size
from sanarl.config.presets import shipped_presets
from sanarl.methods.config_loading import load_config
from sanarl.tools.capacity.accelerators import ACCELERATORS, MFU
from sanarl.tools.capacity.flops import iteration_flops, iteration_seconds
from sanarl.tools.capacity.memory import estimate
from sanarl.tools.capacity.report import gib

GPU = ACCELERATORS["h100"]
HEADER = f"""# Capacity of the shipped presets

Per-rank peak memory of every shipped preset on the world size it plans for (DDP; the preset's Cosmos-RL
`policy.parallelism`, else 1), computed without weights from the real architecture built on the meta device. One
preset in full, with the options that would make it fit (each re-estimated), and this table regenerated:

```bash
sanarl validate --config sana-image-nft-sol_rl sanarl.datasets.diffusion_nft --gpus 8 --gpu h100
python -m sanarl.tools.capacity_table > docs/capacity.md
```

How the figures are made: parameters from the transformer built on the meta device from its config (shipped config
dicts for the hub models, sanarl/data/models/architectures/; counts of text encoders, VAEs and reward models in
sanarl/data/models/pipelines/components.json, each with its source), with the run's LoRA adapters injected by the run's own code; activations
from the forward (and backward) of that module traced on meta tensors, the allocator's books kept by a dispatch
mode (sanarl/tools/capacity/simulate.py; attention as a fused kernel holds it; GPU kernels, so the CPU's
convolution workspace that `sanarl validate` counts on a machine without a GPU is left out); FLOPs from torch's FLOP counter in
the same trace. A training run whose estimate exceeds the machine's memory stops before loading (exit 2, naming the
largest term and its key). Time per iteration assumes {MFU:.0%} of the {GPU.name}'s dense bf16 peak
({GPU.bf16_tflops:g} TFLOP/s; a quantized preview at its precision's peak where the GPU has one) and counts the
transformer and reward models only; "fits H100" compares the peak with its {GPU.memory_gb:g} GB. Checked against
measured peaks: docs/results.md, "Memory plan against measurement".

| preset | ranks | rollout GiB | training GiB | optimizer step GiB | validation GiB | largest term (GiB) | fits H100 | PFLOP / iter / rank | min / iter (H100) |
|---|---|---|---|---|---|---|---|---|---|"""


def row(name: str) -> str:
    """The table row of preset `name`."""
    loaded = load_config(next(p for p in shipped_presets() if p.stem == name), [])
    cfg, world = loaded.config, planned_world_size(loaded.cosmos)
    est = estimate(cfg, world, False, both_checkpointing=False)
    phases = {p.name: gib(p.total) for p in est.phases}
    largest = max(est.peak.terms, key=lambda t: t.nbytes)
    flops = iteration_flops(cfg, est)
    minutes = iteration_seconds(flops, GPU, cfg.rollout.preview_precision) / 60
    fits = "yes" if est.peak.total <= GPU.memory_gb * 1e9 else "no"
    return (
        f"| {name} | {world} | {phases.get('rollout', '-')} | {phases['training']} | "
        f"{phases.get('optimizer step', '-')} | {phases.get('validation', '-')}"
        f" | {largest.label} ({gib(largest.nbytes)}) in {est.peak.name} | {fits} | {flops.total / 1e15:.3f} | "
        f"{minutes:.2f} |"
    )


def table(names: list[str] | None = None) -> str:
    names = names or [p.stem for p in shipped_presets()]
    return "\n".join([HEADER, *(row(n) for n in names)]) + "\n"


if __name__ == "__main__":
    sys.stdout.write(table(sys.argv[1:] or None))
