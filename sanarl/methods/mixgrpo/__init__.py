"""MixGRPO: Flow-GRPO with the SDE steps in a window that slides along the grid (docs/algorithms.md, "MixGRPO")."""
