"""Group RL, what DiffusionNFT and Flow-GRPO share (docs/algorithms.md): the task base (`task_base.py`: prompt
stream, group seeds, cross-rank advantages, updates per rollout, DDP padding), its config view and checks
(`config.py`, no torch: the method registry imports it at config load), the rollout families (`rollout.py`: Sol-RL's
fast / slow passes), the inference copies of the policy they sample with (`inference_copy.py`) and their
quantization (`quantize.py`). Importing this package imports none of them."""
