"""Launched by accelerate in test_multiprocess.py: train a few steps, then dump this rank's weights and reads."""

import json
import sys
from pathlib import Path

from safetensors.torch import save_file

from sanarl import api
from sanarl.config import load_config

ROOT = Path(__file__).resolve().parents[2]
out = Path(sys.argv[1])
plugin = str(ROOT / "tests" / "data" / "plugins" / "squares_recording.py")
loaded = load_config(
    ROOT / "presets" / "tiny-shapes-sft.toml",
    [
        f"train.output_dir={out / 'run'}",
        "train.max_num_steps=3",
        "train.train_batch_per_replica=8",
        "train.train_policy.mini_batch=2",
        "train.ema_enable=false",
        "train.optm_warmup_steps=0",
        "validation.enable=false",
        "validation.val_before_train=false",
        "train.ckpt.save_freq=2",
    ],
)
outcome = api.train(loaded, plugin)
rank = outcome.task.rank
state = {k: v.contiguous() for k, v in outcome.task.adapter.transformer.state_dict().items()}
save_file(state, str(out / f"rank{rank}.safetensors"))
reads = sys.modules[outcome.task.plugin.__name__].READ
(out / f"rank{rank}.json").write_text(json.dumps({"world": outcome.task.world, "reads": reads}))
