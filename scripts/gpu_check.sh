#!/usr/bin/env bash
# One short self-contained run on a single CUDA GPU (< 5 minutes): bf16 SFT, torch.compile, one NFT iteration,
# one SOAR step, a Sol-RL two-stage rollout (FP8 preview when transformer-engine imports). One line per check.
#   bash scripts/gpu_check.sh                 # exit 0 ok, 1 a check failed, 2 no GPU
#   bash scripts/gpu_check.sh --allow-cpu     # the same checks on CPU at a tiny size (compile skipped)
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
exec python -m sanarl.tools.gpu_check "$@"
