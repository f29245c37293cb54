"""Vision-language reward models on transformers' Qwen2-VL / Qwen2.5-VL classes (`pip install 'sanarl[vlm]'`).

- `dance_grpo` / `videoalign` (videoalign.py): VideoAlign's VQ / MQ / TA of whole clips;
- shared machinery: `qwen` (options, weights, loading, encoding, the sequential-position forward) and `vision`
  (qwen-vl-utils' frame sampling and pixel-budget arithmetic).

Nothing here is imported until a reward is built (the registry entries are lazy).
"""
