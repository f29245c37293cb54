"""Write a SANA 1.5 1.6B pipeline directory at real size with random weights (no download), for measuring a whole
run's memory on the CPU against `sanarl validate`'s plan (docs/results.md, "Memory plan against measurement").

    python scripts/random_pipeline.py /tmp/sana-1.6b-random
    python scripts/measure_capacity.py -- --config sana-image-sft-lora sanarl.datasets.diffusers_dataset \
        --set policy.model_name_or_path=/tmp/sana-1.6b-random --set policy.diffusers.inference_size=[256,256]

Every component has the real model's shapes, in bfloat16: the transformer from its shipped config
(sanarl/data/models/architectures/), Gemma-2 2B from its published config (26 layers, width 2304, 8 query and 4
key-value heads of 256, MLP 9216, vocabulary 256,000) and the f32c32 DC-AE (diffusers' AutoencoderDC defaults),
each checked against the parameter counts the plan uses (sanarl/data/models/pipelines/components.json). The
tokenizer and scheduler are the shipped tiny base's (a tokenizer's vocabulary does not change a run's memory: its ids
index the real embedding table). About 9 GB on disk.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

HUB_ID = "Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers"

GEMMA_2_2B = {
    "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
    "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
}  # fmt: skip


def _checked(module: torch.nn.Module, expected: int, what: str) -> torch.nn.Module:
    count = sum(p.numel() for p in module.parameters())
    if count != expected:
        raise SystemExit(f"{what}: {count} parameters, the plan counts {expected}")
    return module


def build(out: Path) -> None:
    from diffusers import AutoencoderDC
    from transformers import Gemma2Config, Gemma2Model

    from sanarl.models.architecture import transformer_config
    from sanarl.models.meta import _find_class, components_table
    from sanarl.models.tiny import SHIPPED, SHIPPED_DIR

    table = components_table()
    tiny = SHIPPED_DIR / SHIPPED["shapes-base"]
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    try:
        config = transformer_config(HUB_ID)
        transformer = _find_class(config.pop("_class_name")).from_config(config)
        transformer.save_pretrained(out / "transformer")
        del transformer
        gemma = _checked(Gemma2Model(Gemma2Config(**GEMMA_2_2B)), table["text_encoders"]["gemma-2-2b"]["params"],
                         "Gemma-2 2B")  # fmt: skip
        gemma.save_pretrained(out / "text_encoder")
        del gemma
        vae = _checked(AutoencoderDC(), table["vaes"]["dc-ae-f32c32"]["params"], "DC-AE f32c32")
        vae.save_pretrained(out / "vae")
    finally:
        torch.set_default_dtype(torch.float32)
    for part in ("tokenizer", "scheduler"):
        shutil.copytree(tiny / part, out / part, dirs_exist_ok=True)
    index = json.loads((tiny / "model_index.json").read_text())
    index["vae"] = ["diffusers", "AutoencoderDC"]
    index["_name_or_path"] = f"{HUB_ID} (random weights)"
    (out / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the pipeline directory to write")
    build(parser.parse_args().out)
