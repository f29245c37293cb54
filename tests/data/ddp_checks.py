"""Launched by accelerate in test_multiprocess.py (2 processes, gloo on CPU); its functions also run in-process as
the 1-process reference. One launch covers: SFT under DDP (weights equal across ranks, disjoint reads, rank-0-only
files, resume equals an uninterrupted run), NFT (advantages over all ranks' rewards), DDRL (its data term under DDP) and the FSDP2 gather / scatter helpers under torch's own `fully_shard`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from sanarl import api
from sanarl.methods.config_loading import load_config

ROOT = Path(__file__).resolve().parents[2]
RECORDING = str(ROOT / "tests" / "data" / "plugins" / "squares_recording.py")
SFT_OVERRIDES = [
    "train.train_batch_per_replica=8",
    "train.train_policy.mini_batch=2",
    "train.ema_enable=true",
    "train.ema_decay=0.9",
    "train.optm_warmup_steps=0",
    "train.ckpt.save_freq=2",
    "train.ckpt.max_keep=0",
    "validation.enable=true",
    "validation.val_before_train=false",
    "validation.freq=1000",
    "validation.num_samples=2",
    "validation.batch_size=2",
    "policy.diffusers.sample.eval_num_steps=2",
]


def sft(out: Path, steps: int, *extra: str):
    """SFT on the recording squares plugin for `steps` optimizer steps (global batch 8)."""
    overrides = [f"train.output_dir={out}", f"train.max_num_steps={steps}", *SFT_OVERRIDES, *extra]
    return api.train(load_config(ROOT / "sanarl" / "presets" / "tiny-shapes-sft.toml", overrides), RECORDING)


def nft(out: Path, advantages: list):
    """One DiffusionNFT step with 2 prompt groups of 4 per global batch; records this rank's advantages."""
    from sanarl.methods.nft.task import NFTTask

    original = NFTTask._advantages

    def recording(self, groups):
        adv, keep, stats = original(self, groups)
        rewards = torch.cat([g.reward.total for g in groups])
        advantages.append(
            {"adv": adv.tolist(), "rewards": rewards.tolist(), "prompts": [g.prompt for g in groups]}
        )
        return adv, keep, stats

    NFTTask._advantages = recording
    try:
        overrides = [f"train.output_dir={out}", "train.max_num_steps=1", "train.train_batch_per_replica=8"]
        preset = ROOT / "tests" / "data" / "presets" / "nft-tiny.toml"
        return api.train(load_config(preset, overrides), "sanarl.datasets.shapes")
    finally:
        NFTTask._advantages = original


def ddrl(out: Path):
    """Two DDRL steps with 2 prompt groups of 4 per global batch and the data term on the shapes renderings (no
    per-rank randomness: explicit train_on, the rollout's own noise and levels), so W ranks equal one rank."""
    overrides = [f"train.output_dir={out}", "train.max_num_steps=2", "train.train_batch_per_replica=8"]
    preset = ROOT / "tests" / "data" / "presets" / "ddrl-tiny.toml"
    return api.train(load_config(preset, overrides), "sanarl.datasets.shapes")


def weights(outcome) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous() for k, v in outcome.task.adapter.transformer.state_dict().items()}


def fsdp_helpers(out: Path, rank: int) -> dict:
    """The runner's FSDP helpers on a tiny SANA transformer sharded with torch's own `fully_shard` over gloo
    (independent of accelerate): gather for save / export, load full tensors into the shards for resume."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from sanarl.models import load_adapter
    from sanarl.training.distributed import full_parameters, full_tensors, load_full_state, shard_like

    cfg = load_config(ROOT / "sanarl" / "presets" / "tiny-shapes-sft.toml", []).config
    module = load_adapter(cfg.policy, "cpu").transformer
    reference = {k: v.detach().clone() for k, v in module.state_dict().items()}
    if rank == 0:
        save_file({k: v.contiguous() for k, v in reference.items()}, str(out / "fsdp_reference.safetensors"))
    for block in module.transformer_blocks:
        fully_shard(block)
    fully_shard(module)
    sharded = all(isinstance(p, DTensor) for p in module.parameters())
    with full_parameters(module):
        plain = module.state_dict()
        gathered_equal = all(
            not isinstance(v, DTensor) and torch.equal(v, reference[k]) for k, v in plain.items()
        )
        if rank == 0:
            module.save_pretrained(str(out / "fsdp_export"))
    shifted = {k: v + 1.0 for k, v in reference.items()}
    unexpected = load_full_state(module, {**shifted, "not.a.key": torch.zeros(1)})
    still_sharded = all(isinstance(p, DTensor) for p in module.parameters())
    after = full_tensors(dict(module.named_parameters()))
    written_back = all(torch.equal(v, reference[k] + 1.0) for k, v in after.items())
    like = next(module.parameters())
    local = shard_like(after[next(iter(after))], like)
    reshard_ok = isinstance(local, DTensor) and torch.equal(local.to_local(), like.to_local())
    return {
        "sharded": sharded,
        "gathered_equal": gathered_equal,
        "still_sharded": still_sharded,
        "written_back": written_back,
        "reshard_ok": reshard_ok,
        "unexpected": unexpected,
        "class": type(module).__name__,
    }


def main(out: Path) -> None:
    a = sft(out / "a", 3)
    rank = a.task.rank
    reads = list(sys.modules[a.task.plugin.__name__].READ)
    save_file(weights(a), str(out / f"sft3_rank{rank}.safetensors"))
    resumed = sft(out / "a", 4, "train.resume=true")
    save_file(weights(resumed), str(out / f"resumed4_rank{rank}.safetensors"))
    straight = sft(out / "b", 4, "validation.enable=false")
    save_file(weights(straight), str(out / f"straight4_rank{rank}.safetensors"))
    advantages: list = []
    rl = nft(out / "nft", advantages)
    save_file(weights(rl), str(out / f"nft_rank{rank}.safetensors"))
    save_file(weights(ddrl(out / "ddrl")), str(out / f"ddrl_rank{rank}.safetensors"))
    report = {
        "world": a.task.world,
        "reads": reads,
        "advantages": advantages,
        "fsdp_helpers": fsdp_helpers(out, rank),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
