"""Tiny random Qwen-VL checkpoints for CPU tests and demos of the VLM rewards (never for real scores).

`ensure_tiny_qwen_vl(kind)` builds (once, under `$SANARL_CACHE/tiny-vlm-v<version>/`) a 1-layer Qwen2-VL (`qwen2_vl`) or
Qwen2.5-VL (`qwen2_5_vl`) with a 1-block tiny vision tower and a small byte-level BPE tokenizer trained on the
reward prompts, saved with `save_pretrained` so that rewards load it through the same `from_pretrained` path as
real weights. `ensure_tiny_videoalign()` adds a VideoReward directory in VideoAlign's own layout (model_config.json
+ checkpoint-1/ with a LoRA adapter and the non-LoRA tensors, in transformers 4 key names). Seeds are fixed: the
same files every time.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch

from sanarl.models.cache import cache_dir
from sanarl.rewards.scorers.vlm.videoalign import DETAILED_SPECIAL_PROMPT

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>")
PADS = ("<|image_pad|>", "<|video_pad|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' %}"
    "<|vision_start|><|video_pad|><|vision_end|>{% elif content['type'] == 'text' %}{{ content['text'] }}"
    "{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)
"""Qwen-VL's chat layout (system turn, `<|vision_start|><|video_pad|><|vision_end|>` before the text)."""
TRAINING_TEXT = (DETAILED_SPECIAL_PROMPT, "Yes No yes no a red circle moves left right up down.")


TINY_VLM_VERSION = 1
"""Bumped whenever a builder changes what it writes (older caches are then rebuilt, not reused)."""


def _cache_root() -> Path:
    return cache_dir().expanduser() / f"tiny-vlm-v{TINY_VLM_VERSION}"


def _tokenizer() -> object:
    """A byte-level BPE (vocab 600) trained on the reward prompts, with Qwen's special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(list(TRAINING_TEXT), trainer=trainer)
    state = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
    tok = Qwen2Tokenizer(vocab=state["vocab"], merges=merges, unk_token=None, eos_token="<|im_end|>")
    tok.add_special_tokens(
        {"pad_token": "<|endoftext|>", "additional_special_tokens": [*SPECIALS[1:], *PADS]}
    )
    return tok


def _build_qwen_vl(kind: str, target: Path) -> None:
    import transformers

    tok = _tokenizer()
    ids = tok.convert_tokens_to_ids([*SPECIALS, *PADS])
    text = {
        "vocab_size": len(tok),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 8192,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        "bos_token_id": None,
        "eos_token_id": ids[2],
        "pad_token_id": ids[0],
    }
    if kind == "qwen2_vl":
        vis = {"depth": 1, "embed_dim": 32, "hidden_size": 32, "num_heads": 2, "mlp_ratio": 2}
        config_cls, model_cls = transformers.Qwen2VLConfig, transformers.Qwen2VLForConditionalGeneration
        video_cls = transformers.Qwen2VLVideoProcessor
    else:
        vis = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 32}
        vis["fullatt_block_indexes"] = [0]
        config_cls, model_cls = transformers.Qwen2_5_VLConfig, transformers.Qwen2_5_VLForConditionalGeneration
        video_cls = transformers.Qwen2VLVideoProcessor
    config = config_cls(
        text_config=text,
        vision_config=vis,
        image_token_id=ids[5],
        video_token_id=ids[6],
        vision_start_token_id=ids[3],
        vision_end_token_id=ids[4],
        bos_token_id=None,
        eos_token_id=ids[2],
        pad_token_id=ids[0],
    )
    torch.manual_seed(0)
    model = model_cls(config)
    model.save_pretrained(str(target))
    processor = transformers.Qwen2VLProcessor(
        image_processor=transformers.Qwen2VLImageProcessor(),
        tokenizer=tok,
        video_processor=video_cls(),
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(target))


def _atomic_build(target: Path, build) -> Path:
    """Run `build(tmp_dir)` and move the result to `target` (a half-built directory never appears)."""
    if (target / ".complete").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    try:
        build(tmp)
        (tmp / ".complete").write_text("ok\n")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / ".complete").is_file():  # not another process finishing the same build first
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def ensure_tiny_qwen_vl(kind: str = "qwen2_vl") -> Path:
    """The directory of the tiny random `kind` ('qwen2_vl' | 'qwen2_5_vl') model with its processor."""
    if kind not in ("qwen2_vl", "qwen2_5_vl"):
        raise ValueError(f"kind {kind!r} must be 'qwen2_vl' or 'qwen2_5_vl'")
    return _atomic_build(_cache_root() / kind, lambda tmp: _build_qwen_vl(kind, tmp))


TINY_NORM = {"VQ_mean": 0.5, "VQ_std": 2.0, "MQ_mean": -0.25, "MQ_std": 0.5, "TA_mean": 0.0, "TA_std": 4.0}
TINY_LORA = {"lora_enable": True, "lora_r": 4, "lora_alpha": 8, "use_rslora": False}


def _build_videoalign(base: Path, target: Path) -> None:
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    config = {
        "data_config": {
            "fps": 2.0,
            "num_frames": None,
            "max_frame_pixels": 200704,
            "eval_dim": ["VQ", "MQ", "TA"],
            "prompt_template_type": "detailed_special",
            "sample_type": "uniform",
        },
        "model_config": {
            "model_name_or_path": str(base),
            "output_dim": 1,
            "use_special_tokens": True,
            "reward_token": "special",
        },
        "peft_lora_config": {
            **TINY_LORA,
            "lora_namespan_exclude": ["lm_head", "rm_head", "embed_tokens", "visual"],
        },
        "inference_config": TINY_NORM,
    }
    (target / "model_config.json").write_text(json.dumps(config, indent=2))
    step = target / "checkpoint-1"
    step.mkdir()
    vocab = len(AutoTokenizer.from_pretrained(str(base))) + 3  # + the three reward tokens
    generator = torch.Generator().manual_seed(1)
    hidden, rank = 32, TINY_LORA["lora_r"]
    adapter = {}
    for proj, (out_dim, in_dim) in {"q_proj": (32, 32), "v_proj": (16, 32), "down_proj": (32, 64)}.items():
        where = "self_attn" if proj != "down_proj" else "mlp"
        prefix = f"base_model.model.model.layers.0.{where}.{proj}"
        adapter[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_dim, generator=generator) * 0.1
        adapter[f"{prefix}.lora_B.weight"] = torch.randn(out_dim, rank, generator=generator) * 0.1
    save_file(adapter, str(step / "adapter_model.safetensors"))
    rest = {
        "base_model.model.rm_head.weight": torch.randn(1, hidden, generator=generator),
        "base_model.model.model.embed_tokens.weight": torch.randn(vocab, hidden, generator=generator) * 0.02,
        "base_model.model.model.norm.weight": 1.0 + 0.1 * torch.randn(hidden, generator=generator),
    }
    torch.save(rest, step / "non_lora_state_dict.pth")


def ensure_tiny_videoalign() -> Path:
    """A tiny random VideoReward directory (VideoAlign layout) on the tiny Qwen2-VL base."""
    base = ensure_tiny_qwen_vl("qwen2_vl")
    return _atomic_build(_cache_root() / "videoreward", lambda tmp: _build_videoalign(base, tmp))


def _build_hpsv3(base: Path, target: Path) -> None:
    """HPSv3.safetensors: the tiny base's weights in transformers 4 names, the embeddings grown by `<|Reward|>`,
    and a random ranknet head (HPSv3's layout: one full state dict)."""
    from safetensors.torch import load_file, save_file

    from sanarl.rewards.scorers.vlm.hpsv3 import ranknet_head

    generator = torch.Generator().manual_seed(2)
    state = {}
    for key, value in load_file(str(base / "model.safetensors")).items():
        old = (
            key.replace("model.language_model.", "model.", 1)
            if key.startswith("model.language_model.")
            else key
        )
        state[old.replace("model.visual.", "visual.", 1)] = value
    embed = state["model.embed_tokens.weight"]
    state["model.embed_tokens.weight"] = torch.cat(
        [embed, torch.randn(1, embed.shape[1], generator=generator) * 0.02]
    )
    torch.manual_seed(2)
    for key, value in ranknet_head(embed.shape[1]).state_dict().items():
        state[f"rm_head.{key}"] = value
    save_file({k: v.contiguous() for k, v in state.items()}, str(target / "HPSv3.safetensors"))


def ensure_tiny_hpsv3() -> Path:
    """A tiny random HPSv3 directory (HPSv3.safetensors) on the tiny Qwen2-VL base; pass base_model = the base."""
    base = ensure_tiny_qwen_vl("qwen2_vl")
    return _atomic_build(_cache_root() / "hpsv3", lambda tmp: _build_hpsv3(base, tmp))
