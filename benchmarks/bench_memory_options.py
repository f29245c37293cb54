"""What each memory option of docs/multi-gpu.md saves, measured on CPU for one training forward / backward.

    python benchmarks/bench_memory_options.py [--size 64] [--batch 16] [--threads 1]

Device memory of a step is (a) the activations autograd keeps for backward and (b) the trained state: parameters,
gradients and AdamW's two moments. Both are measured exactly on CPU, so the ratios hold on any device:

- activations: bytes of every tensor autograd saves during the forward of the tiny shapes SANA
  (`sanarl-tiny:shapes`, flow-matching loss at `--size` px), counted with `torch.autograd.graph.saved_tensors_hooks`
  (storage bytes, each storage once), for the baseline (float32), `policy.model_gradient_checkpointing = true`,
  `train.param_dtype = "bfloat16"` (autocast) and half the micro-batch (`train.train_policy.mini_batch`);
- trained state: bytes of parameters + gradients + AdamW moments for a full fine-tune, for LoRA r 16 on the
  family's default targets, and the per-rank share of the full fine-tune under FSDP2 over W ranks (FSDP2 shards
  every parameter on dim 0 into W equal chunks, padded: per rank ceil(rows / W) x the other dims).

Only ratios matter; the tiny model's absolute bytes are small.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import torch

from sanarl.config.schema import PolicyConfig
from sanarl.models import load_adapter


def saved_activation_bytes(run_forward: Callable[[], torch.Tensor]) -> tuple[int, float]:
    """(bytes autograd saved for backward during `run_forward()`, the loss); each storage is counted once."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = run_forward()
    loss.backward()
    return sum(seen.values()), float(loss)


def make_forward(adapter, batch: int, size: int, autocast: bool) -> Callable[[], torch.Tensor]:
    """One flow-matching loss of the transformer on a fixed random batch (x_s = (1 - s) x0 + s eps, v* = eps - x0)."""
    gen = torch.Generator().manual_seed(0)
    x0 = torch.rand(batch, 3, size, size, generator=gen) * 2 - 1
    eps = torch.randn(x0.shape, generator=gen)
    s = torch.rand(batch, generator=gen)
    cond = adapter.encode_prompts(["a red circle to the left of a blue square"] * batch)
    x_s = (1 - s.view(-1, 1, 1, 1)) * x0 + s.view(-1, 1, 1, 1) * eps

    def run() -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            v = adapter.velocity(x_s, s, cond)
        return (v.float() - (eps - x0)).pow(2).mean()

    return run


def state_bytes(params: list[torch.nn.Parameter], world: int = 1) -> int:
    """Per-rank bytes of parameters + gradients + AdamW exp_avg / exp_avg_sq (4 copies) under FSDP2 over `world`."""
    total = 0
    for p in params:
        rows = p.shape[0] if p.dim() else 1
        per_row = p.numel() // max(rows, 1)
        total += math.ceil(rows / world) * per_row * p.element_size()
    return 4 * total


def activation_rows(size: int, batch: int) -> list[tuple[str, int]]:
    rows = []
    for name, half, autocast, checkpointing in (
        ("float32 (baseline)", False, False, False),
        ("gradient checkpointing", False, False, True),
        ("bf16 autocast", False, True, False),
        ("half the micro-batch", True, False, False),
    ):
        adapter = load_adapter(PolicyConfig(model_name_or_path="sanarl-tiny:shapes"))
        module = adapter.transformer.train().requires_grad_(True)
        if checkpointing:
            module.enable_gradient_checkpointing()
        forward = make_forward(adapter, batch // 2 if half else batch, size, autocast)
        rows.append((name, saved_activation_bytes(forward)[0]))
    return rows


def state_rows() -> list[tuple[str, int]]:
    from peft import LoraConfig as PeftLoraConfig

    adapter = load_adapter(PolicyConfig(model_name_or_path="sanarl-tiny:shapes"))
    full = list(adapter.transformer.parameters())
    rows = [("full fine-tune, 1 rank", state_bytes(full))]
    rows += [(f"full fine-tune, FSDP2 per rank, W={w}", state_bytes(full, w)) for w in (2, 8)]
    targets = adapter.default_lora_targets
    adapter.transformer.add_adapter(PeftLoraConfig(r=16, lora_alpha=16, target_modules=list(targets)))
    lora = [p for n, p in adapter.transformer.named_parameters() if "lora_" in n]
    frozen = sum(
        p.numel() * p.element_size() for n, p in adapter.transformer.named_parameters() if "lora_" not in n
    )
    rows.append(("LoRA r 16 (adapters trained; frozen base counted once)", state_bytes(lora) + frozen))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for title, rows in (
        (f"activations saved for backward (tiny SANA, {args.size} px, batch {args.batch})", activation_rows(args.size, args.batch)),
        ("trained state: parameters + gradients + AdamW moments", state_rows()),
    ):  # fmt: skip
        print(f"\n{title}")
        base = rows[0][1]
        for name, value in rows:
            print(f"  {name:<58} {value / 2**20:9.2f} MiB   ratio {value / base:.3f}")


if __name__ == "__main__":
    main()
