"""Launched by accelerate with an FSDP2 config: sanarl/data/accelerate/fsdp_cpu.yaml (2 CPU processes, gloo) in
tests/integration/test_multiprocess.py and sanarl/data/accelerate/fsdp_8gpu.yaml in tests/gpu/test_fsdp.py (one per GPU):
SFT (full fine-tune) and NFT (LoRA) under FSDP2, with checkpoint, resume and export; dumps gathered weights."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ddp_checks import nft, sft, weights  # noqa: E402

from sanarl.training.distributed import full_parameters  # noqa: E402


def gathered(outcome) -> dict:
    with full_parameters(outcome.task.adapter.transformer):  # every rank gathers
        return {k: v.clone() for k, v in weights(outcome).items()}


def main(out: Path) -> None:
    a = sft(out / "a", 3)
    rank = a.task.rank
    first = gathered(a)
    resumed = gathered(sft(out / "a", 4, "train.resume=true"))
    straight = gathered(sft(out / "b", 4, "validation.enable=false"))
    advantages: list = []
    rl = gathered(nft(out / "nft", advantages))
    for name, state in (("sft3", first), ("resumed4", resumed), ("straight4", straight), ("nft", rl)):
        save_file(state, str(out / f"{name}_rank{rank}.safetensors"))
    (out / f"rank{rank}.json").write_text(json.dumps({"world": a.task.world, "advantages": advantages}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
