"""DiffusionNFT: task.py (the method, step by step) and config.py (its config view and checks)."""
