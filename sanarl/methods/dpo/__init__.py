"""Diffusion-DPO, offline (preference pairs from a dataset plugin) and online (best and worst rollout of each group)."""
