"""DDRL: data-regularized Flow-GRPO (docs/algorithms.md, "DDRL")."""
