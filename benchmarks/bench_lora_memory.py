"""Peak memory of a LoRA training step on the real-size SANA 1.6B transformer (random init, no download), with the
frozen base held in float32 (`policy.diffusers.frozen_base_float32 = true`, sanarl's behaviour before) and in the
preset's dtype (bf16, the default now; only the LoRA weights are float32), side by side in one run.

Each mode runs in its own child process, one after the other: build SANA 1.6B's transformer (SanaTransformer2DModel,
20 layers, width 2240, the SANA_1600M_1024px config) directly in the dtype `transformer_dtype(policy)` gives it (as
`from_pretrained` reads weights straight into that dtype), add the LoRA adapters of `presets/sana-image-nft.toml`
(r 4, attn1 / attn2 projections, "default" + "old") through sanarl's `add_lora_adapters`, then one flow-matching
forward / backward / AdamW step at `--size` px (DC-AE factor 32: 256 px -> 8 x 8 latent tokens) with gradient
checkpointing, as the preset. Prints each child's peak RSS, the transformer's bytes by dtype and the ratio. Text
encoder and VAE are not built: the difference is the transformer's frozen copy, 6.4 GB in float32 vs 3.2 GB in bf16.

    python benchmarks/bench_lora_memory.py [--size 256] [--batch 1] [--threads 2] [--arch sana-1.6b]

Needs ~12 GB of free memory for the float32 child; run nothing else heavy meanwhile. `--arch tiny` runs the same
steps on a 2-layer, width-64 SanaTransformer2DModel in seconds (CI runs it so the script cannot rot; its peak RSS is
the imported libraries', so its ratio says nothing).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "sanarl" / "presets" / "sana-image-nft.toml"
SANA_1600M = {
    "in_channels": 32,
    "out_channels": 32,
    "num_attention_heads": 70,
    "attention_head_dim": 32,
    "num_layers": 20,
    "num_cross_attention_heads": 20,
    "cross_attention_head_dim": 112,
    "cross_attention_dim": 2240,
    "caption_channels": 2304,
    "mlp_ratio": 2.5,
    "sample_size": 32,
    "patch_size": 1,
    "norm_elementwise_affine": False,
    "norm_eps": 1e-6,
}
"""SanaTransformer2DModel config of Efficient-Large-Model/Sana_1600M_1024px_diffusers (SANA 1.5 1.6B's shape)."""
SANA_TINY = {
    **SANA_1600M,
    "num_attention_heads": 2,
    "num_layers": 2,
    "num_cross_attention_heads": 2,
    "cross_attention_head_dim": 32,
    "cross_attention_dim": 64,
    "caption_channels": 64,
}
"""SANA 1.6B's config shrunk to 2 layers of width 64 (same latent channels and modules): `--arch tiny`."""
ARCHITECTURES = {
    "sana-1.6b": ("SANA 1.6B", SANA_1600M),
    "tiny": ("tiny SANA (2 layers, width 64)", SANA_TINY),
}
"""`--arch` name -> (label printed, SanaTransformer2DModel config)."""
CAPTION_TOKENS = 300
"""sana-image-nft's max_prompt_length."""


def child(frozen_float32: bool, size: int, batch: int, threads: int, arch: str = "sana-1.6b") -> dict:
    """One training step of the `arch` transformer in this process; returns its measurements."""
    import torch
    from diffusers import SanaTransformer2DModel

    from sanarl.core.lora import add_lora_adapters
    from sanarl.methods.config_loading import load_config
    from sanarl.models.base import transformer_dtype

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = load_config(PRESET, [f"policy.diffusers.frozen_base_float32={str(frozen_float32).lower()}"]).config
    dtype = transformer_dtype(cfg.policy)
    config = ARCHITECTURES[arch][1]
    start = time.perf_counter()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters are created in `dtype`, as from_pretrained reads them
    try:
        model = SanaTransformer2DModel(**config)
    finally:
        torch.set_default_dtype(previous)
    lora = cfg.policy.lora
    model.requires_grad_(False)
    add_lora_adapters(model, lora.lora_names, r=lora.r, alpha=lora.lora_alpha, init=lora.init_lora_weights,
                      target_modules=lora.target_modules)  # fmt: skip
    model.enable_gradient_checkpointing()
    model.train()
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=3e-4, weight_decay=1e-4)
    side = size // 32
    x = torch.randn(batch, 32, side, side)
    target = torch.randn_like(x)
    text = torch.randn(batch, CAPTION_TOKENS, config["caption_channels"])
    mask = torch.ones(batch, CAPTION_TOKENS)
    s = torch.rand(batch)
    out = model(x.to(dtype), encoder_hidden_states=text.to(dtype), encoder_attention_mask=mask,
                timestep=1000 * s, return_dict=False)[0]  # fmt: skip
    loss = (out.float() - target).pow(2).mean()
    loss.backward()
    optimizer.step()
    by_dtype: dict[str, int] = {}
    for p in model.parameters():
        key = f"{str(p.dtype).removeprefix('torch.')}{' trained' if p.requires_grad else ''}"
        by_dtype[key] = by_dtype.get(key, 0) + p.numel() * p.element_size()
    return {
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "params_gb": {k: v / 2**30 for k, v in by_dtype.items()},
        "seconds": time.perf_counter() - start,
        "loss": loss.item(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--arch",
        choices=tuple(ARCHITECTURES),
        default="sana-1.6b",
        help="transformer shape (tiny: a CI smoke run)",
    )
    parser.add_argument("--child", choices=("float32", "frozen"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child == "float32", args.size, args.batch, args.threads, args.arch)))
        return 0
    results = {}
    for mode in ("float32", "frozen"):
        cmd = [sys.executable, __file__, "--child", mode, "--size", str(args.size), "--batch", str(args.batch),
               "--threads", str(args.threads), "--arch", args.arch]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            return 1
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    label = ARCHITECTURES[args.arch][0]
    print(
        f"{label} LoRA step (sana-image-nft LoRA), {args.size} px, batch {args.batch}, gradient checkpointing"
    )
    labels = {"float32": "before: frozen base float32", "frozen": "after:  frozen base bf16   "}
    for mode, r in results.items():
        params = ", ".join(f"{k} {v:.2f} GB" for k, v in sorted(r["params_gb"].items()))
        print(f"  {labels[mode]}  peak RSS {r['peak_rss_gb']:.2f} GB  ({params}; {r['seconds']:.0f} s)")
    ratio = results["frozen"]["peak_rss_gb"] / results["float32"]["peak_rss_gb"]
    print(f"  peak RSS ratio after / before = {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
