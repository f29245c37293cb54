"""The post-training methods, one folder each (task.py: the method step by step; config.py: its config view and
checks), group RL, what DiffusionNFT and Flow-GRPO share (group_rl/: the task base, rollout families, inference
copies, quantization) and the registry (registry.py)."""
