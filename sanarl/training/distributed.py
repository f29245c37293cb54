"""Distributed helpers of the runner: DDP needs none of them (they are no-ops), FSDP2 needs shards gathered into
full tensors for checkpoints / exports and full tensors loaded into the shards on resume; metrics are reduced over
ranks. `enable_fsdp_on_cpu` makes an FSDP launch on CPU processes shard as on GPUs.
"""

from __future__ import annotations

import contextlib
import os
import time

import torch
from accelerate import Accelerator

from sanarl.errors import ConfigError


def is_fsdp(acc: Accelerator) -> bool:
    """Did accelerate wrap the model with FSDP (`accelerate launch --use_fsdp` or an FSDP config file)?"""
    from accelerate.utils import DistributedType

    return acc.distributed_type == DistributedType.FSDP


def fsdp_requested() -> bool:
    """Did the launcher ask for FSDP (`distributed_type: FSDP` in the accelerate config, or `--use_fsdp`)?"""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("1", "true")


def on_cpu() -> bool:
    """Does this machine train on CPU (no CUDA device)? Then the processes of a launch talk over gloo."""
    return not torch.cuda.is_available()


def launch_state():
    """This process's place in the launch (accelerate's `PartialState`), set up exactly as the run's Accelerator
    sets it up. On a CPU-only machine accelerate needs `cpu=True` to join the processes of `accelerate launch`
    over gloo; a `PartialState()` without it says "one process" and, being process-wide, would make every rank
    train alone into the same folder."""
    from accelerate import PartialState

    drop_single_process_state()
    return PartialState(cpu=on_cpu())


def launched_world_size() -> int:
    """How many processes the launcher started (torchrun's `WORLD_SIZE`; 1 without a launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def drop_single_process_state() -> None:
    """Forget a process-wide accelerate state that says "not distributed" while the launcher started several
    processes (a `PartialState()` made without `cpu=True` on a CPU machine, e.g. by a plugin or a notebook), so
    the next Accelerator joins the launch instead of silently training alone."""
    from accelerate import PartialState
    from accelerate.utils import DistributedType

    shared = PartialState._shared_state
    if shared.get("distributed_type") == DistributedType.NO and launched_world_size() > 1:
        PartialState._reset_state()


def enable_fsdp_on_cpu(acc: Accelerator) -> None:
    """Make an FSDP launch on CPU processes (gloo) really shard, as it does on GPUs.

    accelerate 1.15 turns `distributed_type: FSDP` into FSDP only for accelerator devices; on CPU it silently
    falls back to DDP (`MULTI_CPU`). torch's FSDP2 (`fully_shard`) works on CPU over gloo, so sanarl switches the
    run to accelerate's own FSDP2 plugin (read from the same launch environment) before anything is prepared:
    the sharding, gathering and checkpoint code is the one GPUs run. Used by the CPU tests and for debugging a
    multi-GPU config on a laptop. FSDP1 (`fsdp_version: 1`) on CPU is refused: sanarl's gather code is FSDP2's.
    """
    from accelerate import FullyShardedDataParallelPlugin, PartialState
    from accelerate.utils import DistributedType

    if not fsdp_requested() or acc.device.type != "cpu" or acc.num_processes < 2:
        return
    if getattr(acc.state, "fsdp_plugin", None) is not None:  # accelerate already runs FSDP here
        return
    plugin = FullyShardedDataParallelPlugin()
    if plugin.fsdp_version != 2:
        raise ConfigError(
            "FSDP on CPU needs FSDP2: set `fsdp_config.fsdp_version: 2` in the accelerate config (or launch with "
            "`--fsdp_version 2`); sanarl/data/accelerate/fsdp_8gpu.yaml shows the full block."
        )
    if acc.mixed_precision != "no":
        plugin.set_mixed_precision(acc.mixed_precision)
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # AcceleratorState re-reads it
    acc.state.distributed_type = DistributedType.FSDP
    acc.state.fsdp_plugin = plugin


def _is_dtensor(t: object) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def full_tensors(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each tensor whole: DTensor shards all-gathered (a collective: every rank calls, in the same key order)."""
    return {k: (v.full_tensor() if _is_dtensor(v) else v).detach() for k, v in named.items()}


def shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`full` on the device / dtype of `like`, sharded like it when `like` is a DTensor (FSDP)."""
    if not _is_dtensor(like):
        return full.to(device=like.device, dtype=like.dtype).clone()
    from torch.distributed.tensor import distribute_tensor

    local = full.to(device=like.device, dtype=like.dtype)
    return distribute_tensor(local, like.device_mesh, like.placements)


@contextlib.contextmanager
def full_parameters(module: torch.nn.Module):
    """Inside the block `module` is a plain module: every FSDP2 shard (DTensor parameter) is replaced by its
    gathered full tensor and FSDP's dynamic classes by the model's own (diffusers writes the class name into
    config.json). Every rank must enter (all-gather). Read-only: writes inside the block are lost (load with
    `load_full_state`). Without FSDP this does nothing."""
    from torch.distributed.fsdp import FSDPModule

    swapped, classes = [], []
    # a forward may leave modules unsharded (the root keeps its parameters gathered)
    for mod in module.modules():
        if isinstance(mod, FSDPModule):
            mod.reshard()
    for mod in module.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None and _is_dtensor(p):
                mod._parameters[name] = torch.nn.Parameter(p.full_tensor().detach(), p.requires_grad)
                swapped.append((mod, name, p))
        if isinstance(mod, FSDPModule):
            classes.append((mod, mod.__class__))
            mod.__class__ = next(c for c in mod.__class__.__mro__[1:] if not issubclass(c, FSDPModule))
    try:
        yield
    finally:
        for mod, cls in classes:
            mod.__class__ = cls
        for mod, name, p in swapped:
            mod._parameters[name] = p


def load_full_state(module: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> list[str]:
    """Load full tensors (a subset of `module.state_dict()` keys) into `module`, FSDP2-sharded or not; returns the
    keys `module` does not have. Under FSDP every rank passes the same full tensors and keeps its shard (torch's
    `set_model_state_dict`; a plain `load_state_dict` would trip FSDP's own load hooks)."""
    if not any(_is_dtensor(p) for p in module.parameters()):
        return list(module.load_state_dict(tensors, strict=False).unexpected_keys)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    options = StateDictOptions(full_state_dict=True, strict=False)
    return list(set_model_state_dict(module, tensors, options=options).unexpected_keys)


def gathered_optimizer_state(acc: Accelerator, module: torch.nn.Module, optimizer) -> dict:
    """The optimizer state to checkpoint: as is (DDP), or FSDP's full state dict keyed by parameter names (rank 0
    gets it, the others an empty dict)."""
    if not is_fsdp(acc):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(module, optimizer.optimizer, options=options)


def load_optimizer_state(acc: Accelerator, module: torch.nn.Module, optimizer, state: dict) -> None:
    """Inverse of `gathered_optimizer_state` (FSDP: every rank passes the full state, each keeps its shard)."""
    if not is_fsdp(acc):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(module, optimizer.optimizer, optim_state_dict=state, options=options)


def scalar(value: torch.Tensor | float) -> float:
    """A Python float of a (possibly DTensor) scalar."""
    if _is_dtensor(value):
        value = value.full_tensor()
    return float(value)


def reduce_metrics(acc: Accelerator, metrics: dict[str, float]) -> dict[str, float]:
    """Step metrics over all ranks (one all-gather): keys ending in `min` / `max` take the min / max, all others
    the mean (ranks hold equal shares of the global batch, so the mean of per-rank means is the global mean)."""
    if acc.num_processes == 1:
        return metrics
    from accelerate.utils import gather_object

    per_rank = gather_object([metrics])
    out = {}
    for key in metrics:
        values = [m[key] for m in per_rank if key in m]
        if key.endswith("min"):
            out[key] = min(values)
        elif key.endswith("max"):
            out[key] = max(values)
        else:
            out[key] = sum(values) / len(values)
    return out


def rank0_minutes_passed(acc: Accelerator, since: float, minutes: float | None) -> bool:
    """Have `minutes` (None: never) passed on rank 0's monotonic clock since `since`? The same answer on every
    rank (rank 0's clock decides)."""
    if minutes is None:
        return False
    over = torch.tensor([float(time.monotonic() - since >= 60.0 * minutes)], device=acc.device)
    if acc.num_processes > 1:
        torch.distributed.broadcast(over, src=0)
    return bool(over.item() > 0)
