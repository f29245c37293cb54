"""Refuse, before any model loads, a run whose estimated peak exceeds this machine's memory (exit 2 naming the
largest term, its key and the fix), and `sanarl validate`'s verdict for a named accelerator."""

from __future__ import annotations

import os
import sys

from sanarl.config.schema import Config
from sanarl.errors import UserError
from sanarl.models.meta import UnknownArchitecture
from sanarl.tools.capacity.memory import estimate
from sanarl.tools.capacity.report import gib, options
from sanarl.tools.capacity.simulate import Kernels


def machine_kernels() -> Kernels:
    """The kernels a run started here uses: the GPU's when one is visible, else the CPU's."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def machine_memory(local_ranks: int) -> tuple[float, str]:
    """(bytes one rank may use, what they are): a GPU's free memory, else the available RAM shared by the ranks
    of this node."""
    import torch

    if machine_kernels() == "cuda":
        free, _ = torch.cuda.mem_get_info()
        return float(free), "this GPU's free memory"
    return available_ram() / max(1, local_ranks), "this machine's available RAM" + (
        f" / {local_ranks} local ranks" if local_ranks > 1 else ""
    )


def available_ram() -> float:
    """MemAvailable of /proc/meminfo (free plus reclaimable), else the free physical pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def check_fits_machine(cfg: Config) -> None:
    """Raise UserError (exit 2) when the run's estimated peak per rank exceeds the memory it will have here. A model
    whose weights are not here is left to the loader, whose message (how to get them) comes first."""
    from sanarl.models.weight_sources import TINY_PREFIX, local_weights
    from sanarl.training.distributed import fsdp_requested

    name = cfg.policy.model_name_or_path
    if not name.startswith(TINY_PREFIX) and local_weights(name, cfg.policy.model_revision) is None:
        return

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    try:
        est = estimate(cfg, world, fsdp_requested(), both_checkpointing=False, kernels=machine_kernels())
    except UnknownArchitecture:
        return  # an architecture the plan does not know: the loader reports what is missing
    except UserError:
        raise
    except Exception as err:  # the plan must never stop a run it cannot compute
        print(f"note: memory check skipped ({type(err).__name__}: {err})", file=sys.stderr)
        return
    capacity, where = machine_memory(local)
    peak = est.peak
    if peak.total <= capacity:
        return
    largest = max(peak.terms, key=lambda t: t.nbytes)
    fix = f"shrink the largest term (set by `{largest.key}`)"
    for label, rerun in options(cfg, est):  # the first option that fits, if one does
        new = rerun(both=False).peak.total
        if new <= capacity:
            fix = f"{label} (peak {gib(new)} GiB)"
            break
    raise UserError(
        f"this run needs about {gib(peak.total)} GiB per rank ({peak.name}) but {where} is {gib(capacity)} GiB; "
        f"largest term: {largest.label} {gib(largest.nbytes)} GiB, set by `{largest.key}`. Fix: {fix}. "
        "`sanarl validate` prints the whole memory plan."
    )
