"""Throughput of evaluation: scorers batched vs one by one, and `sanarl eval` end to end per image.

1. Scorer throughput (images/s) on 32 px images for the weight-free `shapes` and `jpeg_compressibility` rewards and
   a tiny random-init CLIP (`clipscore` loaded from a temp dir through the same `from_pretrained` path real weights
   take): one `score` call on the whole batch vs one call per image (medians of interleaved repeats).
2. End to end: generate + score + write with `sanarl.evaluation.run_eval` on the shipped tiny shapes base, `--num`
   held-out shapes prompts at the base's evaluation settings (20 Euler steps, CFG-free); seconds per image.

    python benchmarks/bench_eval.py [--batch 64] [--repeats 5] [--num 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import _common
import torch


def tiny_clip_dir(root: Path) -> Path:
    """A tiny random CLIP model + processor (character-level tokenizer, 32 px) saved to `root`."""
    import transformers

    letters = "abcdefghijklmnopqrstuvwxyz "
    vocab = {c: i for i, c in enumerate(letters)}
    vocab.update({c + "</w>": len(letters) + i for i, c in enumerate(letters)})
    vocab.update({"<|startoftext|>": len(vocab), "<|endoftext|>": len(vocab) + 1})
    tokenizer = transformers.CLIPTokenizer(vocab=vocab, merges=[], model_max_length=16)
    images = transformers.CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    )
    eos = vocab["<|endoftext|>"]
    text = dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, max_position_embeddings=16, bos_token_id=eos - 1, eos_token_id=eos,
                pad_token_id=eos)  # fmt: skip
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=32, patch_size=8)  # fmt: skip
    torch.manual_seed(0)
    config = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=64)
    transformers.CLIPModel(config).save_pretrained(root)
    transformers.CLIPProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(root)
    return root


def scorer_throughput(batch: int, repeats: int) -> None:
    """Images/s of each scorer, batched vs one by one."""
    from sanarl.evaluation.prompts import shapes_prompts
    from sanarl.rewards import build_reward
    from sanarl.worlds import shapes as world

    rows = shapes_prompts("test", batch, 0)
    images = torch.stack([torch.from_numpy(world.render(m, 32, i)).permute(2, 0, 1).float() / 255
                          for i, m in enumerate(rows.metadata)])  # fmt: skip
    clip_dir = tiny_clip_dir(Path(tempfile.mkdtemp(prefix="sanarl-bench-clip-")))
    rewards = {
        "shapes": build_reward("shapes"),
        "jpeg_compressibility": build_reward("jpeg_compressibility"),
        "clipscore (tiny)": build_reward("clipscore", model=str(clip_dir)),
    }
    print(f"scorer throughput, {batch} images of 32 px ({_common.environment()})")
    for name, reward in rewards.items():
        reward.setup("cpu")

        def batched(reward=reward):
            reward.score(images, rows.prompts, rows.metadata)

        def single(reward=reward):
            for i in range(batch):
                reward.score(images[i : i + 1], rows.prompts[i : i + 1], rows.metadata[i : i + 1])

        times = _common.interleaved_medians({"batched": batched, "one-by-one": single}, repeats)
        fast, slow = _common.median(times["batched"]), _common.median(times["one-by-one"])
        print(f"  {name:<22s} batched {batch / fast:9.1f} img/s   one-by-one {batch / slow:9.1f} img/s   "
              f"ratio {slow / fast:5.2f}")  # fmt: skip


def end_to_end(num: int) -> None:
    """Seconds per image of run_eval on the tiny shapes base (generation, scoring, PNG writing)."""
    from sanarl.evaluation import EvalSettings, load_prompts, resolve_model, run_eval

    rows = load_prompts(None, "shapes:test", num=num)
    out = Path(tempfile.mkdtemp(prefix="sanarl-bench-eval-"))
    settings = EvalSettings(seed=0, batch_size=min(num, 64))
    source = resolve_model("sanarl-tiny:shapes-base")
    started = time.perf_counter()
    summary = run_eval([source], rows, ["shapes"], out, settings)
    total = time.perf_counter() - started
    model = next(iter(summary["models"].values()))
    strict = model["scores"]["shapes/strict"]
    print(f"end to end, {num} held-out samples, {summary['sampler']['num_steps']} steps: "
          f"{model['seconds_per_image'] * 1e3:.1f} ms/image generate+score, {total / num * 1e3:.1f} ms/image "
          f"including model load and writing; strict {strict['mean']:.3f} +- {strict['stderr']:.3f}")  # fmt: skip
    assert not math.isnan(strict["mean"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    _common.quiet()
    scorer_throughput(args.batch, args.repeats)
    end_to_end(args.num)


if __name__ == "__main__":
    main()
