"""Memory and time of a preset at real size, without weights (`sanarl validate --gpus N --gpu NAME`; docs/capacity.md).

meta architectures: sanarl/models/meta.py; traced activations and FLOPs: simulate.py; memory terms: memory.py;
FLOPs per iteration: flops.py; accelerators: accelerators.py; printing and verdict: report.py; the machine check
at the start of a run: fit.py.
"""

from __future__ import annotations

from sanarl.config.schema import Config


def plan_lines(cfg: Config, world: int, fsdp: bool, gpu: str | None, gpu_memory: float | None) -> list[str]:
    """`sanarl validate`'s memory plan: the breakdown, compute and time, and the verdict for the accelerator
    (`gpu` by name, or `gpu_memory` GB; else this machine). Raises UserError for an unknown accelerator name."""
    from sanarl.tools.capacity.accelerators import accelerator
    from sanarl.tools.capacity.fit import machine_kernels, machine_memory
    from sanarl.tools.capacity.memory import estimate
    from sanarl.tools.capacity.report import summary, verdict

    named = accelerator(gpu) if gpu is not None else None
    for_this_machine = named is None and gpu_memory is None
    est = estimate(cfg, world, fsdp, kernels=machine_kernels() if for_this_machine else "cuda")
    lines = summary(cfg, est, named)
    if gpu_memory is not None:
        capacity, where = gpu_memory * 1e9, f"a {gpu_memory:g} GB accelerator"
    elif named is not None:
        capacity, where = named.memory_gb * 1e9, named.name
    else:
        capacity, where = machine_memory(1)
    return lines + verdict(cfg, est, capacity, where)[1]
