#!/usr/bin/env bash
# The `imagereward` reward's packages (docs/rewards.md). image-reward 1.5 pins timm 0.6.13 and an old diffusers,
# which would break sanarl's stack, so it is installed without its pins; its BLIP imports fairscale (an sdist that
# needs --no-build-isolation) and timm (1.0.x works). sanarl's _ir_shim makes the package run on transformers 5.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
python -m pip install -q -c constraints.txt "timm>=1.0"
python -m pip install -q -c constraints.txt --no-deps image-reward==1.5
python -m pip install -q -c constraints.txt --no-deps --no-build-isolation fairscale==0.4.13
