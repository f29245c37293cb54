"""The shipped scorers, one module per reward (the registry's `_BUILTIN` table names each one lazily):

- weight-free: `jpeg` (`jpeg_compressibility`, `jpeg_incompressibility`), `shapes`, `motion` (video-native);
- CLIP-family models: `pickscore`, `clipscore`, `aesthetic` (on `sanarl.rewards.clip_models.ClipReward`), `hpsv2`;
- `imagereward` (with `_ir_shim`, the image-reward package's transformers 5 compatibility), `ocr`, `geneval` (with
  `geneval_rules`, GenEval's judging rules without a model);
- `vlm/`: the vision-language judges on Qwen-VL (`dance_grpo` / `videoalign`, `cosmos_reason1`, `hpsv3`,
  `unified_reward`) and their shared machinery.

Scorers are built from the reward kit in `sanarl.rewards` (`base`, `model_reward`, `weights`, `clip_*`, `video`);
nothing there, nor anything that runs rewards (combine, pool, remote, reward_checks, held_out), imports a scorer: they are
reached by name through `sanarl.rewards.registry` (pyproject.toml's import-linter contracts). Importing this package
imports no scorer.
"""
