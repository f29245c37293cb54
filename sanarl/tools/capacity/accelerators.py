"""Published peaks of the accelerators `sanarl validate --gpu NAME` plans for (dense, no sparsity).

Sources: NVIDIA's data sheets (H100 SXM5, H200 SXM, HGX B200, A100 SXM4 80 GB, L40S); memory is what the data
sheet states (GB = 10^9 bytes; the usable share is a little less).
"""

from __future__ import annotations

from dataclasses import dataclass

from sanarl.errors import UserError


@dataclass(frozen=True)
class Accelerator:
    name: str
    memory_gb: float
    bf16_tflops: float
    fp8_tflops: float | None
    fp4_tflops: float | None = None


ACCELERATORS = {
    "h100": Accelerator("H100 SXM (80 GB)", 80, 989.4, 1978.9),
    "h200": Accelerator("H200 SXM (141 GB)", 141, 989.4, 1978.9),
    "b200": Accelerator("B200 (HGX, 180 GB)", 180, 2250, 4500, 9000),
    "a100": Accelerator("A100 SXM (80 GB)", 80, 312, None),
    "l40s": Accelerator("L40S (48 GB)", 48, 362.05, 733),
}
MFU = 0.4
"""Assumed model FLOP utilisation of the iteration-time estimate (printed with it)."""


def accelerator(name: str) -> Accelerator:
    """The table row of `name` (case-insensitive; "h100-sxm" and "a100-80gb" style suffixes accepted)."""
    key = name.strip().lower().split("-")[0].split("_")[0]
    if key not in ACCELERATORS:
        raise UserError(
            f"`--gpu {name}` is not a known accelerator; known: {', '.join(ACCELERATORS)} "
            "(or give the memory with `--gpu-memory GB`)."
        )
    return ACCELERATORS[key]
