"""The post-training methods, one folder each (task.py: the method step by step; config.py: its config view and
checks), the group-RL base DiffusionNFT and Flow-GRPO share (group_rl.py) and the registry (registry.py)."""
